"""Write the hub's state files as this release's code writes them, for the upgrade test.

    .venv/bin/python scripts/dev/make_state_fixture.py [tests/fixtures/state-<version>]

Every store writes its own file in a fresh hub folder (``<out>/hub``, the default
layout's names), through its own methods: a user's sharing settings, a public link,
a share link's access time, a group share's role, two GPU holdings, two ended ones
(the usage ledger), a start waiting for a GPU, a reclaim warning, a multi-node job, a
user's secrets and their projects' choices, SSH keys, a project's last good image, two
accounts' login identities.
``<out>/expected.json`` is what each store read back right after writing: a later
gpulab must read the same (tests/test_state_versions.py). Run it once per release and
commit the folder; never edit a fixture of a past release.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[2]

# A fixed clock: the records of one release's fixture never change when it is made again.
NOW = 1_790_000_000.0  # 2026-09-21


def key_text(seed: int) -> str:
    """An ed25519 public key (OpenSSH text), the same one for a seed."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32).public_key()
    text = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{text.decode()} user{seed}@lab"


def write(hub: Path) -> None:
    """Write the state files under ``hub`` through the stores' own code."""
    from gpulab_hub import hubsettings, jsonfile, projects, stateversion
    from gpulab_hub.accounts import identities
    from gpulab_hub.cluster import jobs
    from gpulab_hub.cluster.multinode import TrainRequest
    from gpulab_hub.gpus import Device
    from gpulab_hub.gpus.allocator import AllocationStore, Policy, Request
    from gpulab_hub.gpus.queue import QueueStore
    from gpulab_hub.gpus.reclaimrecord import ReclaimRecord, Warning
    from gpulab_hub.gpus.usage import Record
    from gpulab_hub.images import project as image_state
    from gpulab_hub.sharing import groupshares, linkaccess, public
    from gpulab_hub.ssh import keys as sshkeys
    from gpulab_hub.ssh import paths as ssh_paths

    layout = hubsettings.default_layout(hub.parent)

    # the sharing settings as gpulab before its database wrote them; a hub start imports
    # them into the database (sharing/policyfile.py)
    settings = {
        "alice/thesis": {"collaborators_may_start": True, "collaborators_may_reshare": False},
        "bob/vision": {"collaborators_may_start": True, "collaborators_may_reshare": True},
    }
    kind = stateversion.KINDS["sharing-policy"]
    jsonfile.write_atomic(layout.sharing_policy, kind.stamp({"projects": settings}))

    links = public.store(hub)
    links.create("alice", "thesis", "notebooks/results.ipynb", 10 * 365 * 86400)

    access = linkaccess.store_in(hub)
    made = "2026-09-21T10:13:20"
    access.mark_key(f"code:alice/thesis:7:{made}", 7, linkaccess.REVOKED)
    grant = linkaccess.grant_key("alice", "thesis", "user", "dave")
    until = {"until": "2026-09-28T10:13:20"}
    access.apply(
        {},
        {
            grant: {
                "owner": "alice",
                "project": "thesis",
                "kind": "user",
                "name": "dave",
                "share_created": made,
                "scopes": {"access:servers!server=alice/thesis": until},
            }
        },
    )

    roles = groupshares.GroupShareRoles(hub / groupshares.FILE_NAME)
    name = groupshares.role_name("alice", "thesis", "ml-group")
    spec = {
        "description": "ml-group may use alice's project thesis",
        "group": "ml-group",
        "project": "alice/thesis",
        "scopes": ["access:servers!server=alice/thesis"],
    }
    roles.apply({}, {name: spec})

    gpus = [
        Device(str(i), f"GPU-0000000{i}", "NVIDIA H100 80GB HBM3", 80 << 30, "9.0", minor=i)
        for i in range(2)
    ]
    held = AllocationStore(layout.allocations_file)
    held.allocate(gpus, Request("alice", "thesis", count=1), Policy())
    held.allocate(gpus, Request("bob", "vision", count=1), Policy())

    # the ledger file as gpulab before its database wrote it (one JSON object a line);
    # a hub start imports it into the database (gpus/usagefile.py)
    label = "GPU 1 (NVIDIA H100 80GB HBM3)"
    with open(layout.usage_file, "w") as f:
        for r in (
            Record("bob", "vision", "GPU-00000001", label, NOW - 7200, NOW - 3600, 41.5),
            Record("alice", "thesis", "GPU-00000000", "GPU 0", NOW - 600, NOW - 60),
        ):
            f.write(json.dumps(asdict(r), separators=(",", ":")) + "\n")

    queue = QueueStore(layout.queue_file)
    queue.enqueue(Request("carol", "llm", count=2))

    reclaim = ReclaimRecord(Path(layout.allocations_file).with_name("gpu-reclaim.json"))
    warning = Warning("bob", "vision", NOW, NOW + 900, idle_since=NOW - 3600)
    reclaim.replace({warning.key: warning})

    record = jobs.record_of(layout.records_dir)
    with record.locked():
        entries = record._read()
        entries["4242"] = jobs.new_entry(  # as jobs.submit records a job Slurm took
            "alice",
            "thesis",
            TrainRequest("train-1", "train.py", ("--epochs", "3"), nodes=2, gpus_per_node=1),
            ("10.77.0.2", "10.77.0.3"),
            NOW,
        )
        record._write(entries)

    # a user's secrets file as gpulab before its database wrote it; a hub start imports
    # it into the database (secrets/importfile.py)
    set_at = "2026-11-27T03:35:12Z"
    body = {
        "secrets": {
            "HF_TOKEN": {"value": "gAAAAABm-encrypted-by-the-hub-never-plaintext", "set": set_at},
            "WANDB_API_KEY": {"value": "gAAAAABm-another-encrypted-value", "set": set_at},
        },
        "projects": {"thesis": {"names": ["HF_TOKEN"], "collaborators": False}},
    }
    layout.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    kind = stateversion.KINDS["secrets"]
    jsonfile.write_atomic(layout.secrets_dir / "alice.json", kind.stamp({"user": body}))

    store = sshkeys.KeyStore(ssh_paths(hub)["keys_dir"])
    store.add("alice", key_text(1))
    store.add("alice", key_text(2))
    store.add("bob", key_text(3))

    # the login identities as gpulab before its database wrote them; a hub start imports
    # them into the database (accounts/identityfile.py)
    logins = {
        "alice": {"provider": "oidc https://sso.lab.example.org/realms/lab",
                  "id": "0b9a54c2-alice", "since": NOW},
        "bob": {"provider": "ldap", "id": "entryUUID=5e2f3b14-8a1c-4d6e-9f00-bob", "since": NOW},
    }  # fmt: skip
    kind = stateversion.KINDS["login-identities"]
    jsonfile.write_atomic(hub / identities.FILE_NAME, kind.stamp({"accounts": logins}))

    project = projects.Project(hub.parent / "projects", "alice", "thesis", layout.state_root)
    image_state.record(project, "gpulab-project-alice-thesis:0123456789abcdef", failed=False)
    image_state.record(project, None, failed=True)
    stateversion.check_hub(hub)  # the hub folder's own format, as every start writes it


# What each kind's store reads from the hub folder ``hub`` (the default layout), as JSON.
def _layout(hub: Path):
    from gpulab_hub import hubsettings

    return hubsettings.default_layout(hub.parent)


def read_sharing_policy(hub: Path):
    from gpulab_hub.sharing import policyfile

    found = policyfile.load(_layout(hub).sharing_policy)
    return {k: asdict(v) for k, v in found.items()}


def read_public_links(hub: Path):
    from gpulab_hub.sharing import public

    return [asdict(x) for x in public.store(hub).list("alice", "thesis")]


def read_link_access(hub: Path):
    from gpulab_hub.sharing import linkaccess

    return linkaccess.store_in(hub).snapshot()


def read_group_share_roles(hub: Path):
    from gpulab_hub.sharing import groupshares

    return groupshares.GroupShareRoles(hub / groupshares.FILE_NAME).snapshot()


def read_gpu_allocations(hub: Path):
    from gpulab_hub.gpus.allocator import AllocationStore

    held = AllocationStore(_layout(hub).allocations_file).holdings()
    return {k: [asdict(h) for h in v] for k, v in held.items()}


def read_gpu_queue(hub: Path):
    from gpulab_hub.gpus.queue import QueueStore

    return [asdict(e) for e in QueueStore(_layout(hub).queue_file).entries()]


def read_gpu_reclaim(hub: Path):
    from gpulab_hub.gpus.reclaimrecord import ReclaimRecord

    record = ReclaimRecord(Path(_layout(hub).allocations_file).with_name("gpu-reclaim.json"))
    return [asdict(w) for w in record.warnings().values()]


def read_gpu_usage(hub: Path):
    from gpulab_hub.gpus import usagefile

    return [asdict(r) for r in usagefile.records(_layout(hub).usage_file)]


def read_cluster_jobs(hub: Path):
    from gpulab_hub.cluster import jobs

    record = jobs.record_of(_layout(hub).records_dir)
    with record.locked():
        return record._read()


def read_secrets(hub: Path):
    from gpulab_hub.secrets import importfile

    section = importfile.load(_layout(hub).secrets_dir / "alice.json")
    secrets, projects = section["secrets"], section["projects"]
    return {
        "listing": sorted(secrets),
        "selections": {
            p: {
                "names": sorted(n for n in c["names"] if n in secrets),
                "collaborators": c["collaborators"],
            }
            for p, c in projects.items()
        },  # fmt: skip
        "thesis": {n: secrets[n]["value"] for n in projects["thesis"]["names"] if n in secrets},
    }


def read_ssh_keys(hub: Path):
    from gpulab_hub.ssh import keys as sshkeys
    from gpulab_hub.ssh import paths as ssh_paths

    store = sshkeys.KeyStore(ssh_paths(hub)["keys_dir"])
    return {u: [asdict(k) for k in store.keys(u)] for u in store.users()}


def read_project_image(hub: Path):
    from gpulab_hub import projects
    from gpulab_hub.images import project as image_state

    project = projects.Project(hub.parent / "projects", "alice", "thesis", _layout(hub).state_root)
    state = image_state.read_state(project)
    return {k: v for k, v in state.items() if k != "version"}


def read_login_identities(hub: Path):
    from gpulab_hub.accounts import identities, identityfile

    return identityfile.load(hub / identities.FILE_NAME)


READERS = {
    "sharing-policy": read_sharing_policy,
    "public-links": read_public_links,
    "link-access": read_link_access,
    "group-share-roles": read_group_share_roles,
    "gpu-allocations": read_gpu_allocations,
    "gpu-queue": read_gpu_queue,
    "gpu-reclaim": read_gpu_reclaim,
    "gpu-usage": read_gpu_usage,
    "cluster-jobs": read_cluster_jobs,
    "secrets": read_secrets,
    "ssh-keys": read_ssh_keys,
    "project-image": read_project_image,
    "login-identities": read_login_identities,
}


def read(hub: Path) -> dict:
    """What every store reads from ``hub``, by kind."""
    return {kind: reader(hub) for kind, reader in READERS.items()}


def main(argv: list[str]) -> int:
    from gpulab_hub.backup import version

    out = Path(argv[0]) if argv else REPO / "tests" / "fixtures" / f"state-{version()}"
    if out.exists():
        shutil.rmtree(out)
    hub = out / "hub"
    hub.mkdir(parents=True)
    with mock.patch("time.time", return_value=NOW):
        write(hub)
        got = read(hub)
    for lock in hub.rglob("*.lock"):
        lock.unlink()
    (out / "expected.json").write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    print(f"Wrote the state of gpulab {version()} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Records kept per project follow it: a rename moves every one, a deletion forgets every
one, and every store that names a project is in the registry rename and delete walk.

A record of alice's project ``one`` is planted in EVERY registered store (and records of
alice's ``two`` and bob's ``one`` beside it); renaming ``one`` must move each, deleting
it must forget each, and the others' must stay. A store left out of the registry (as
the Slurm jobs record once was: renamed projects lost their multi-node jobs, and a new
project of a deleted one's name inherited them) fails the last test.
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import asyncssh
import hubdb_kit
import pytest
from jupyterhub import orm, scopes

from gpulab_hub import hubsettings, jsonfile, records, ssh
from gpulab_hub.accounts import identities
from gpulab_hub.cluster import jobs as cluster_jobs
from gpulab_hub.gpus import allocator
from gpulab_hub.secrets.store import SecretStore
from gpulab_hub.sharing import groupshares, linkaccess, public, received, roles
from gpulab_hub.ssh.keys import KeyStore
from gpulab_hub.workflows import deletion, rename
from gpulab_hub.workflows import records as registry

LOG = logging.getLogger("gpulabrec")
PLANTED = [("alice", "one"), ("alice", "two"), ("bob", "one")]
SOURCE = Path(importlib.import_module("gpulab_hub").__file__).parent

# Stores that name a project but are not in the registry, and why neither a rename nor
# a deletion needs them. Adding a store to gpulab_hub means adding it to the registry
# (workflows/records.py) or here, with the reason.
SUFFIXES = ("Store", "Ledger")
NOT_PER_PROJECT = {
    "UsageLedger": "the GPU usage ledger (table gpulab_usage): a history of who held which GPU "
    "when, by project (budgets and the admin's export count it); history is never "
    "rewritten, so a renamed or deleted project's past hours stay as they were",
    "QueueStore": "a start waiting for a GPU: its entry lives while the start waits "
    "(gpus/waiting.py cancels it), and a project is renamed or deleted stopped",
    "ReclaimRecord": "a warning lives while its project holds GPUs: the GPU keeper's "
    "next look drops the warning of a project that holds none (a stopped one)",
}


# --- one planter and one reader per registered store ---------------------------------
class Hub:
    """A JupyterHub database (with gpulab's tables) and gpulab's records folder."""

    def __init__(self, tmp_path: Path):
        scopes.define_custom_scopes(roles.CUSTOM_SCOPES)
        self.dir = tmp_path / "hub"
        self.dir.mkdir()
        self.url, self.db = hubdb_kit.database(tmp_path / "db")
        self.team = orm.Group(name="team")
        self.db.add_all([self.team, orm.OAuthClient(identifier="jupyterhub")])
        for owner, project in PLANTED:
            user = orm.User.find(self.db, owner) or orm.User(name=owner)
            self.db.add(orm.Spawner(name=project, display_name=project, user=user))
        self.db.commit()
        self.where = deletion.Place(
            projects_root=tmp_path / "projects",
            state_root=self.dir / "projects",
            data_root=tmp_path / "data",
            hub_dir=self.dir,
            archive=False,
            allocations_file=self.dir / "gpu-allocations.json",
            prefix="gpulabrec",
            hf_volume="gpulabrec-hf-alice",
        )
        self.keys = KeyStore(ssh.paths(self.dir)["keys_dir"])

    def spawner(self, owner: str, project: str):
        user = orm.User.find(self.db, owner)
        return user.orm_spawners.get(project) if user is not None else None


def _policy(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    store = received.policy_store(hub.url)
    if plant:
        store.set(owner, project, collaborators_may_start=True)
    return store.get(owner, project).collaborators_may_start


def _links(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    store = public.store(hub.dir)
    if plant:
        store.create(owner, project, "nb.ipynb", 3600)
    return bool(store.list(owner, project))


def _keys(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    if plant and not hub.keys.keys(owner):
        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"{owner}@here")
        hub.keys.add(owner, key.export_public_key().decode())
    return bool(hub.keys.keys(owner))


def _identities(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    store = identities.IdentityStore(hub.url)
    if plant:
        store.claim(owner, ("oidc https://sso.lab.test", f"sub-of-{owner}"))
    return store.bound(owner) == ("oidc https://sso.lab.test", f"sub-of-{owner}")


def _secrets(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    store = SecretStore(hub.url, owner)
    if plant:
        if not store.listing():
            store.put("HF_TOKEN", "ciphertext")
        store.choose(project, ["HF_TOKEN"], collaborators=True)
    return project in store.selections()


def _jobs(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    record = cluster_jobs.record_of(hub.dir)
    if plant:
        with record.locked():
            jobs = record._read()
            job = {"owner": owner, "project": project, "job": f"{owner}-{project}"}
            jobs[str(400 + len(jobs))] = {**job, "addresses": ["10.99.0.2"]}
            record._write(jobs)
    return any((e["owner"], e["project"]) == (owner, project) for e in record._read().values())


def _gpus(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    path = hub.where.allocations_file
    if plant:
        held = json.loads(path.read_text())["holdings"] if path.exists() else {}
        held[f"GPU-{owner}-{project}"] = [{"owner": owner, "project": project, "since": 1.0}]
        path.write_text(json.dumps({"version": 1, "holdings": held}))
    store = allocator.AllocationStore(path)
    with store.locked():
        held = store._read()
    return any(h.key == (owner, project) for hs in held.values() for h in hs)


def _link_access(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    store = linkaccess.store_in(hub.dir)
    code = f"code:{owner}/{project}:7:2026-11-27T01:00:00"
    grant = linkaccess.grant_key(owner, project, "user", "carol")
    if plant:
        scope = f"access:servers!server={owner}/{project}"
        with store.locked():
            now = store._read()
            now[code] = {"lasts": linkaccess.REVOKED, "id": 7}
            now[grant] = {
                "owner": owner,
                "project": project,
                "kind": "user",
                "name": "carol",
                "share_created": "2026-11-27T01:00:00",
                "scopes": {scope: {"until": "2020-01-01T00:00:00", "code": code}},
            }
            store._write(now)
    with store.locked():
        now = store._read()
    rec = now.get(grant)
    return (
        code in now
        and rec is not None
        and rec["project"] == project
        and list(rec["scopes"]) == [f"access:servers!server={owner}/{project}"]
        and rec["scopes"][f"access:servers!server={owner}/{project}"]["code"] == code
    )


def _group_roles(hub: Hub, owner: str, project: str, plant: bool) -> bool:
    store = groupshares.GroupShareRoles(hub.dir / groupshares.FILE_NAME)
    spawner = hub.spawner(owner, project)
    if plant:
        granted = roles.share_scopes("viewer", owner, project)
        orm.Share.grant(hub.db, spawner, hub.team, scopes=granted)
        store.sync_project(hub.db, spawner)
        hub.db.commit()
    name = groupshares.role_name(owner, project, "team")
    recorded = {s["name"] for s in store.role_specs()}
    return name in recorded and orm.Role.find(hub.db, name) is not None


KEPT: dict[str, Callable[[Hub, str, str, bool], bool]] = {
    "SharingPolicyRecords": _policy,
    "PublicLinkRecords": _links,
    "SshKeyRecords": _keys,
    "LoginIdentityRecords": _identities,
    "SecretChoiceRecords": _secrets,
    "JobsRecords": _jobs,
    "GpuHoldingRecords": _gpus,
    "LinkAccessRecords": _link_access,
    "GroupShareRecords": _group_roles,
}


def planted_hub(tmp_path) -> Hub:
    hub = Hub(tmp_path)
    for owner, project in PLANTED:
        for cls in registry.REGISTRY:
            assert KEPT[cls.__name__](hub, owner, project, True), (cls.__name__, owner, project)
    return hub


def kept(hub: Hub, owner: str, project: str) -> dict[str, bool]:
    """Whether each registered store has a record of ``owner``'s ``project``."""
    return {c.__name__: KEPT[c.__name__](hub, owner, project, False) for c in registry.REGISTRY}


def every(value: bool, *, but: dict[str, bool] | None = None) -> dict[str, bool]:
    return {c.__name__: value for c in registry.REGISTRY} | (but or {})


# --- rename and delete walk every registered store ------------------------------------
def test_every_registered_store_has_a_planter():
    assert set(KEPT) == {c.__name__ for c in registry.REGISTRY}


def test_a_rename_moves_the_record_in_every_store_and_no_one_elses(tmp_path):
    hub = planted_hub(tmp_path)
    (hub.where.projects_root / "alice" / "one").mkdir(parents=True)
    where = rename.Where(hub.where.projects_root, hub.where.state_root, hub.dir)
    where = rename.Where(**{**where.__dict__, "allocations_file": hub.where.allocations_file})
    moved = rename.move(hub.db, hub.spawner("alice", "one"), where, "three", None, LOG)
    stays = {c.__name__: True for c in registry.REGISTRY if not c.per_project}
    # GPUs are held while a server runs: a renamed (stopped) project has none to move.
    gpus = {c.__name__: True for c in registry.REGISTRY if not c.moves}
    assert kept(hub, "alice", "three") == every(True, but={**stays, **{k: False for k in gpus}})
    assert kept(hub, "alice", "one") == every(False, but={**stays, **gpus})
    assert kept(hub, "alice", "two") == every(True)
    assert kept(hub, "bob", "one") == every(True)
    for cls in registry.REGISTRY:
        if cls.per_project and cls.moves:
            assert cls.what in moved, cls.__name__


def test_a_deletion_forgets_the_record_in_every_store_and_no_one_elses(tmp_path):
    hub = planted_hub(tmp_path)
    at = hub.where.records(hub.db)
    deletion.forget_server_records(at, "alice", "one")
    deletion.project_files(hub.where, "alice", "one")
    # The deletion's last step, JupyterHub's: the server row goes, and with it the
    # records the database keeps by its foreign key (the choice of secrets).
    hub.db.delete(hub.spawner("alice", "one"))
    hub.db.commit()
    per_owner = {c.__name__: True for c in registry.REGISTRY if not c.per_project}
    assert kept(hub, "alice", "one") == every(False, but=per_owner)
    assert kept(hub, "alice", "two") == every(True)
    assert kept(hub, "bob", "one") == every(True)
    # The account goes: every record of alice's, her SSH keys among them; bob keeps his.
    deletion.forget_server_records(at, "alice", None)
    deletion._forget_records(hub.where, "alice", None)
    hub.db.delete(orm.User.find(hub.db, "alice"))  # JupyterHub's, last
    hub.db.commit()
    assert kept(hub, "alice", "two") == every(False)
    assert kept(hub, "bob", "one") == every(True)


def test_a_renamed_projects_link_ends_when_it_said(tmp_path):
    """Access accepted through a link of a renamed project still ends with the link:
    the sweep finds its record under the new name (kept under the old one, the sweep
    found no such project and forgot it, and the access lasted until revoked)."""
    hub = Hub(tmp_path)
    _link_access(hub, "alice", "one", True)
    carol = orm.User(name="carol")
    hub.db.add(carol)
    hub.db.commit()
    spawner = hub.spawner("alice", "one")
    share = orm.Share.grant(hub.db, spawner, carol, scopes=["access:servers!server=alice/one"])
    store = linkaccess.store_in(hub.dir)
    grant = linkaccess.grant_key("alice", "one", "user", "carol")
    with store.locked():
        now = store._read()
        now[grant]["share_created"] = linkaccess.iso(share.created_at)
        store._write(now)
    where = rename.Where(hub.where.projects_root, hub.where.state_root, hub.dir)
    rename.move(hub.db, spawner, where, "three", None, LOG)
    assert store.sweep(hub.db) == 1  # the link's time (planted: long past) is up
    share = orm.Share.find(hub.db, hub.spawner("alice", "three"), carol)
    assert share is None or not share.scopes


# --- every store that names a project is registered -----------------------------------
def _stores() -> dict[str, str]:
    """Class name -> module of every store class gpulab_hub defines: a subclass of
    jsonfile.LockedRecord (at any depth), or a class named ``*Store`` or ``*Ledger``
    (the stores not built on it: ssh/keys.py, gpus/usage.py)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        module = ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                found[node.name] = (module, bases)

    def is_store(name: str, seen: frozenset = frozenset()) -> bool:
        if name == "LockedRecord" or name.endswith(SUFFIXES):
            return True
        if name in seen or name not in found:
            return False
        return any(is_store(b, seen | {name}) for b in found[name][1])

    return {
        name: module
        for name, (module, bases) in found.items()
        if name != "LockedRecord" and (name.endswith(SUFFIXES) or any(map(is_store, bases)))
    }


def test_every_store_is_registered_or_says_why_not():
    registered = {cls.store.__name__ for cls in registry.REGISTRY}
    stores = _stores()
    missing = sorted(
        f"{m}.{n}" for n, m in stores.items() if n not in registered | set(NOT_PER_PROJECT)
    )
    assert not missing, (
        "stores that rename and delete would not see: implement records.ProjectRecords "
        f"beside each and list it in gpulab_hub/workflows/records.py: {missing}"
    )
    assert {"SharingPolicyStore", "JobsRecord", "KeyStore", "LinkAccess"} <= set(stores)
    assert set(NOT_PER_PROJECT) <= set(stores)  # no stale reasons


def test_every_registered_record_keeps_the_protocol():
    for cls in registry.REGISTRY:
        record = cls(records.Where(Path("/nonexistent")))
        assert isinstance(record, records.ProjectRecords), cls.__name__
        assert cls.what and isinstance(cls.store, type)


@pytest.mark.parametrize("cls", registry.REGISTRY, ids=lambda c: c.__name__)
def test_the_registry_finds_a_store_left_out(cls, monkeypatch):
    """The check above fails when a registered store is taken out of the registry."""
    monkeypatch.setattr(registry, "REGISTRY", tuple(c for c in registry.REGISTRY if c is not cls))
    with pytest.raises(AssertionError, match=cls.store.__name__):
        test_every_store_is_registered_or_says_why_not()


def test_no_jobs_record_none_is_made(tmp_path):
    p = Hub(tmp_path).where
    deletion.project_files(p, "alice", "one")
    assert not (p.hub_dir / cluster_jobs.RECORD).exists()
    assert not (p.hub_dir / linkaccess.FILE_NAME).exists()


def test_a_store_that_cannot_be_read_stops_the_deletion_with_its_words(tmp_path):
    hub = Hub(tmp_path)
    path = hub.dir / hubsettings.PUBLIC_LINKS
    path.mkdir()  # a folder where the record should be: it cannot be read
    with pytest.raises(jsonfile.RecordError, match="public links"):
        deletion.project_files(hub.where, "alice", "one")

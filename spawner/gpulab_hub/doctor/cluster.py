"""``gpulab doctor`` on a Slurm cluster (the hub's spawner is ProjectSlurmSpawner): the
controller, the partition's nodes and their GPUs in Slurm against gpulab's device
lists, the registry from this machine, and a short probe job on each idle node
(cluster_probe.py: device files, the node's Docker engine, the Epilog, the registry
as the node reaches it, the hub's folders as the same storage). Each check reads the
spawner's own settings (its traits), so the doctor checks what the hub will do.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from gpulab_hub.cluster import ClusterError, batch, registry
from gpulab_hub.cluster.slurm import SINFO_FORMAT, Node, Slurm, gpu_count, parse_sinfo
from gpulab_hub.cluster.traits import ClusterTraits
from gpulab_hub.doctor import cluster_probe
from gpulab_hub.doctor.docker_checks import DOCKER_ERRORS, _short
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding

CALL_TIMEOUT = 10  # seconds sinfo/scontrol may take: a controller slower than that is down
PROBE_IMAGE = "{prefix}/doctor:probe"  # pushed to the registry, pulled on each node
_PARTITION_LINE = re.compile(r"([A-Za-z0-9_-]{1,64})(\*?)\|([a-z]+)\|([0-9]+)")
_GRES_TYPE = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:[0-9]{1,4}")
_EPILOG = re.compile(r"^Epilog\s*=\s*(.*?)\s*$", re.MULTILINE)
_EPILOG_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,255}")
SHOWN_NODES = 12  # nodes named in one sentence before "and N more"


def settings_of(spawner) -> ClusterTraits | None:
    """The hub's cluster settings when its spawner is the Slurm spawner, else None
    (on one machine the cluster checks do not run)."""
    return spawner if isinstance(spawner, ClusterTraits) else None


def slurm_client(cfg: ClusterTraits) -> Slurm:
    return Slurm(conf=cfg.slurm_conf, path=cfg.slurm_path, timeout=CALL_TIMEOUT)


def conf_words(cfg: ClusterTraits) -> str:
    if cfg.slurm_conf:
        return f"SLURM_CONF={cfg.slurm_conf}"
    return "Slurm's default slurm.conf (c.ProjectSlurmSpawner.slurm_conf is not set)"


def names(items: list[str]) -> str:
    more = len(items) - SHOWN_NODES
    shown = ", ".join(items[:SHOWN_NODES])
    return f"{shown} and {more} more" if more > 0 else shown


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    available: str  # "up", "down", "drain", "inact"
    nodes: int


def parse_partitions(text: str) -> list[Partition]:
    found = []
    for line in text.splitlines():
        m = _PARTITION_LINE.fullmatch(line.strip())
        if m is None:
            if line.strip():
                raise ClusterError(f"sinfo printed a line gpulab cannot read: {line!r}")
            continue
        found.append(Partition(m.group(1), m.group(2) == "*", m.group(3), int(m.group(4))))
    return found


def check_controller(client: Slurm, cfg: ClusterTraits) -> tuple[Finding, list[Partition]]:
    """cluster.controller: sinfo answers within CALL_TIMEOUT; the cluster's partitions."""
    fid = "cluster.controller"
    fix = (
        "Check that slurmctld runs (`systemctl status slurmctld` on the controller), "
        "that c.ProjectSlurmSpawner.slurm_conf names the cluster's slurm.conf, and that "
        "munged runs on this machine with the cluster's key (`munge -n | unmunge`)."
    )
    started = time.monotonic()
    try:
        done = client.call("sinfo", "--noheader", "--format=%P|%a|%D")
    except ClusterError as e:
        return Finding(fid, FAIL, f"{e} ({conf_words(cfg)})", fix), []
    took = time.monotonic() - started
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or ["no message"]
        seen = f"Slurm's controller does not answer: {said[0][:300]} ({conf_words(cfg)})"
        return Finding(fid, FAIL, seen, fix), []
    try:
        parts = parse_partitions(done.stdout)
    except ClusterError as e:
        return Finding(fid, FAIL, f"{e} ({conf_words(cfg)})", fix), []
    listed = ", ".join(
        f"{p.name}{' (default)' if p.default else ''} {p.available}, {p.nodes} node(s)"
        for p in parts
    )
    seen = (
        f"Slurm's controller answers in {took:.1f} s ({conf_words(cfg)}); "
        f"partitions: {listed or 'none'}"
    )
    return Finding(fid, OK, seen), parts


def project_partition(cfg: ClusterTraits, parts: list[Partition]) -> tuple[Partition | None, str]:
    """The partition projects' jobs go to, or None and why not."""
    if cfg.partition:
        for p in parts:
            if p.name == cfg.partition:
                return p, ""
        return None, (
            f"the cluster has no partition {cfg.partition} "
            f"(c.ProjectSlurmSpawner.partition); it has: {', '.join(p.name for p in parts)}"
        )
    for p in parts:
        if p.default:
            return p, ""
    return None, (
        "c.ProjectSlurmSpawner.partition is not set and the cluster has no default partition"
    )


def partition_nodes(client: Slurm, partition: str) -> list[Node]:
    args = ["--noheader", "-N", f"--format={SINFO_FORMAT}", f"--partition={partition}"]
    done = client.call("sinfo", *args)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or ["no message"]
        raise ClusterError(f"Slurm's sinfo failed: {said[0][:300]}")
    return parse_sinfo(done.stdout)


def _reason(node: Node) -> str:
    return node.reason if node.reason and node.reason != "none" else "Slurm gives no reason"


def node_finding(node: Node) -> Finding | None:
    """cluster.node.<name>: a node that does not take projects, with Slurm's reason."""
    if node.usable:
        return None
    fid, name = f"cluster.node.{node.name}", node.name
    resume = f"`scontrol update nodename={name} state=resume`"
    if node.flag == "*" or node.state in ("down", "fail", "failing"):
        lost = " and does not respond to the controller" if node.flag == "*" else ""
        return Finding(
            fid,
            FAIL,
            f"node {name} is {node.state}{lost}: {_reason(node)}",
            f"Check slurmd on {name} (`systemctl status slurmd` there) and that it reaches "
            f"the controller; then {resume}. Projects do not start there until then.",
        )
    if node.state in ("drained", "draining"):
        words = (
            "draining (its jobs finish, no new ones start)"
            if node.state == "draining"
            else ("drained")
        )
        return Finding(
            fid,
            WARN,
            f"node {name} is {words}: {_reason(node)}",
            f"{resume} once fixed; projects do not start there until then.",
        )
    return Finding(
        fid,
        WARN,
        f"node {name} is {node.state}{node.flag} and takes no projects now: {_reason(node)}",
        f"See `scontrol show node {name}`; {resume} when it should take jobs again.",
    )


def check_nodes(partition: Partition, nodes: list[Node]) -> list[Finding]:
    """cluster.nodes (the partition's nodes and states) and one finding per node that
    takes no projects."""
    if not nodes:
        return [
            Finding(
                "cluster.nodes",
                FAIL,
                f"the partition {partition.name} has no node at all: no project can start",
                "Add nodes to the partition in slurm.conf (`PartitionName=... Nodes=...`), "
                "then `scontrol reconfigure`.",
            )
        ]
    problems = [f for f in (node_finding(n) for n in nodes) if f is not None]
    usable = [n for n in nodes if n.usable]
    states = names([f"{n.name} {n.state}{n.flag}" for n in nodes])
    seen = (
        f"partition {partition.name} ({partition.available}): {len(usable)} of {len(nodes)} "
        f"node(s) take projects: {states}"
    )
    if not usable:
        summary = Finding(
            "cluster.nodes",
            FAIL,
            seen + "; no project can start",
            "Bring a node back (see the findings of each node below).",
        )
    elif partition.available != "up":
        summary = Finding(
            "cluster.nodes",
            FAIL,
            seen + f"; but the partition is {partition.available}: no job starts",
            f"`scontrol update partitionname={partition.name} state=up` once it should run jobs.",
        )
    else:
        summary = Finding("cluster.nodes", OK, seen)
    return [summary, *problems]


def gpu_types(gres: str) -> dict[str, int]:
    """{GRES type: GPUs} of a node's GRES as sinfo prints it ("" for GPUs without a type)."""
    found: dict[str, int] = {}
    for m in _GRES_TYPE.finditer(gres):
        kind = m.group(1) or ""
        found[kind] = gpu_count(gres, kind) if kind else _untyped(gres)
    return found


def _untyped(gres: str) -> int:
    return sum(
        int(part.split(":")[1])
        for part in re.split(r",(?![^(]*\))", gres)
        if re.fullmatch(r"gpu:[0-9]{1,4}(\([^)]*\))?", part)
    )


def requestable_types(cfg: ClusterTraits) -> set[str] | None:
    """GRES types projects can ask for; None when any type will do (no gpu_type)."""
    if not cfg.gpu_type:
        return None
    return {cfg.gpu_type, *getattr(cfg, "gpu_allowed_types", [])}


def _gres_words(gres: str) -> str:
    return gres if gres and gres != "(null)" else "no GRES"


def check_gres(cfg: ClusterTraits, nodes: list[Node]) -> list[Finding]:
    """cluster.gres: each node's GPUs in Slurm against gpulab's device files
    (node_gpus) and the GPU types projects can ask for."""
    listed: dict[str, list[str]] = dict(cfg.node_gpus)
    wanted = requestable_types(cfg)
    out, good = [], []
    setting = "c.ProjectSlurmSpawner.node_gpus"
    for n in nodes:
        fid = f"cluster.gres.{n.name}"
        count, files, kinds = n.gpus(), listed.get(n.name), gpu_types(n.gres)
        if count and files is None:
            out.append(
                Finding(
                    fid,
                    FAIL,
                    f"Slurm lists {count} GPU(s) on node {n.name} ({_gres_words(n.gres)}) but "
                    f"{setting} has no device files for it: a GPU project sent there fails",
                    f'Add "{n.name}": [its GPU device files, in gres.conf\'s order] to '
                    f"{setting} (`slurmd -G` on the node prints them).",
                )
            )
            continue
        if files is not None and len(files) != count:
            out.append(
                Finding(
                    fid,
                    FAIL,
                    f"Slurm lists {count} GPU(s) on node {n.name} ({_gres_words(n.gres)}), "
                    f"{setting} lists {len(files)} device file(s): {', '.join(files) or 'none'}",
                    f'Make {setting}["{n.name}"] the node\'s GPU device files exactly as its '
                    "gres.conf lists them, in that order (`slurmd -G` on the node prints them).",
                )
            )
            continue
        odd = sorted(k or "(no type)" for k in kinds if wanted is not None and k not in wanted)
        if odd:
            out.append(
                Finding(
                    fid,
                    WARN,
                    f"node {n.name}'s GPUs ({_gres_words(n.gres)}) are of type "
                    f"{', '.join(odd)}, which projects cannot ask for "
                    f"(gpu_type {cfg.gpu_type}, gpu_allowed_types "
                    f"{', '.join(getattr(cfg, 'gpu_allowed_types', [])) or 'none'})",
                    "Add the type to c.ProjectSlurmSpawner.gpu_allowed_types to offer these "
                    "GPUs, or leave it out if they are not meant for projects.",
                )
            )
            continue
        if count:
            good.append(f"{n.name} ({_gres_words(n.gres)})")
    in_slurm = {n.name for n in nodes}
    for name in sorted(set(listed) - in_slurm):
        out.append(
            Finding(
                f"cluster.gres.{name}",
                WARN,
                f"{setting} lists node {name}, which the partition does not have",
                f"Correct the node's name in {setting} (Slurm's node names: "
                f"{names(sorted(in_slurm))}), or remove it.",
            )
        )
    if wanted is not None:
        have = {k for n in nodes for k in gpu_types(n.gres)}
        for kind in sorted(wanted - have):
            main = kind == cfg.gpu_type
            out.append(
                Finding(
                    f"cluster.gpu_type.{kind}",
                    FAIL if main else WARN,
                    f"no node of the partition has GPUs of type {kind} "
                    f"({'gpu_type' if main else 'in gpu_allowed_types'}): GPU projects "
                    "asking for it never start",
                    "Set c.ProjectSlurmSpawner.gpu_type / gpu_allowed_types to GRES types "
                    f"the nodes have: {', '.join(sorted(k for k in have if k)) or 'none'}.",
                )
            )
    if good:
        out.insert(
            0,
            Finding(
                "cluster.gres",
                OK,
                f"GPUs in Slurm match {setting} on {names(good)}",
            ),
        )
    elif not out:
        out.append(
            Finding("cluster.gres", OK, "no node has GPUs in Slurm (GRES gpu): projects use CPUs")
        )
    return out


def epilog_path(client: Slurm) -> str:
    """The cluster's Epilog as ``scontrol show config`` gives it ("" for none)."""
    done = client.call("scontrol", "show", "config")
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or ["no message"]
        raise ClusterError(f"Slurm's scontrol failed: {said[0][:300]}")
    m = _EPILOG.search(done.stdout)
    value = m.group(1) if m else ""
    return "" if value in ("", "(null)") else value


def expected_epilog(cfg: ClusterTraits) -> str:
    """The Epilog gpulab renders for these settings (``gpulab doctor --print-epilog``)."""
    return batch.render_epilog(cfg.cluster_name, docker_host=cfg.node_docker_host)


def check_epilog_set(path: str) -> Finding | None:
    """cluster.epilog: the cluster has an Epilog at all (each node's copy is probed)."""
    fix = (
        "Save `gpulab doctor --print-epilog` as an executable file on every node, set "
        "Epilog=<that file> in slurm.conf, then `scontrol reconfigure`."
    )
    if not path:
        return Finding(
            "cluster.epilog",
            FAIL,
            "the cluster has no Epilog: a project container whose job is killed outright "
            "(SIGKILL, a lost job step) keeps running on its node",
            fix,
        )
    if _EPILOG_PATH.fullmatch(path) is None or ".." in path:
        return Finding(
            "cluster.epilog",
            WARN,
            f"the cluster's Epilog {path!r} is not one file gpulab can check",
            fix,
        )
    return None


def _probe_image_bytes() -> bytes:
    """A one-file root file system: what nodes pull to show the registry works."""
    data = b"gpulab doctor's probe image: nodes pull it to check the cluster's registry\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("gpulab-doctor")
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def push_probe_image(dk, cfg: ClusterTraits, prefix: str) -> tuple[Finding, str]:
    """cluster.registry: this machine's engine pushes a tiny image to ``registry``;
    returns the finding and the reference by digest the nodes pull ("" if none)."""
    fid = "cluster.registry"
    if not cfg.registry:
        return Finding(
            fid,
            FAIL,
            "no registry is set (c.ProjectSlurmSpawner.registry): project images cannot "
            "reach the nodes",
            "Run a registry the nodes reach and set c.ProjectSlurmSpawner.registry and "
            "registry_for_nodes (docs/cluster.md).",
        ), ""
    image = PROBE_IMAGE.format(prefix=prefix)
    repo, tag = registry.split_tag(image)
    started = time.monotonic()
    try:
        try:
            dk.call("inspect_image", image)
        except docker.errors.ImageNotFound:
            dk.call("import_image_from_data", _probe_image_bytes(), repository=repo, tag=tag)
        digest = registry.push(dk.call, image, cfg.registry, lambda event: None)
        ref = registry.node_reference(cfg.registry_for_nodes or cfg.registry, image, digest)
    except (ClusterError, *DOCKER_ERRORS) as e:
        return Finding(
            fid,
            FAIL,
            f"this machine's Docker engine cannot push to the registry {cfg.registry}: {_short(e)}",
            "Check that the registry runs there and takes pushes from this machine (a "
            "registry without TLS must be on 127.0.0.1 or in the engine's "
            "insecure-registries), and c.ProjectSlurmSpawner.registry.",
        ), ""
    seen = (
        f"this machine's Docker engine pushed gpulab's probe image to the registry "
        f"{cfg.registry} in {time.monotonic() - started:.1f} s; nodes pull it from "
        f"{cfg.registry_for_nodes or cfg.registry}"
    )
    return Finding(fid, OK, seen), ref


def findings(
    cfg: ClusterTraits,
    prefix: str,
    dk,
    probe: bool = True,
    waits: cluster_probe.Waits | None = None,
    folders: tuple[Path, ...] = (),
) -> list[Finding]:
    """Every cluster finding; blocking (about 5 s with probes on a healthy cluster,
    bounded by CALL_TIMEOUT and ``waits``). ``folders``: the hub's folders that project
    containers mount (projects, data), which every node must see as the same storage."""
    client = slurm_client(cfg)
    controller, parts = check_controller(client, cfg)
    out = [controller]
    if controller.status != OK:
        return out
    partition, why = project_partition(cfg, parts)
    if partition is None:
        fix = "Set c.ProjectSlurmSpawner.partition to one of the cluster's partitions."
        return [*out, Finding("cluster.nodes", FAIL, why, fix)]
    try:
        nodes = partition_nodes(client, partition.name)
        path = epilog_path(client)
    except ClusterError as e:
        fix = "Run the doctor again; if it persists, see slurmctld's log."
        return [*out, Finding("cluster.nodes", FAIL, str(e), fix)]
    out += check_nodes(partition, nodes)
    out += check_gres(cfg, nodes)
    pushed, image = push_probe_image(dk, cfg, prefix) if dk is not None else (None, "")
    if pushed is not None:
        out.append(pushed)
    epilog_set = check_epilog_set(path)
    if epilog_set is not None:
        out.append(epilog_set)
        path = ""
    try:
        expected = expected_epilog(cfg) if path else ""
    except ClusterError as e:
        fix = "Correct c.ProjectSlurmSpawner.cluster_name or node_docker_host (docs/cluster.md)."
        out.append(Finding("cluster.epilog", FAIL, f"gpulab cannot render its Epilog: {e}", fix))
        path = expected = ""
    if not probe:
        seen = "no probe jobs sent to the nodes (--no-probe-jobs): their devices, engines, "
        seen += "Epilog and registry access are not checked"
        return [*out, Finding("cluster.probe", OK, seen)]
    idle = [n for n in nodes if n.state == "idle" and not n.flag]
    with storage_markers(folders) as storage:
        job = cluster_probe.ProbeJob(
            prefix=prefix, epilog=path, expected_epilog=expected, image=image, storage=storage
        )
        results = cluster_probe.run(client, cfg, job, idle, waits or cluster_probe.Waits())
    busy = [n for n in nodes if n.usable and n not in idle]
    return out + cluster_probe.findings(cfg, job, results, busy)


@contextlib.contextmanager
def storage_markers(folders: tuple[Path, ...]):
    """A new file with random words in each of the hub's folders that exists (removed
    again at the end): a node that reads the same words there sees the same storage."""
    made: list[Path] = []
    storage = []
    try:
        for folder in folders:
            if folder.is_symlink() or not folder.is_dir():
                continue
            marker = f".gpulab-doctor-{secrets.token_hex(8)}"
            words = secrets.token_hex(16)
            fd = os.open(folder / marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o644)  # fmt: skip
            made.append(folder / marker)
            # 0644 whatever the umask (`gpulab` runs with 077): a node's probe, which may
            # run as another user, reads it.
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(words)
            storage.append((str(folder), marker, words))
        yield tuple(storage)
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.unlink()

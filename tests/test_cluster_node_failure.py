"""A node of the test cluster (tests/cluster_kit.py) fails as a power loss would, with a
project container running on its own Docker engine, and comes back.

Every process of node 1 is killed at once (frozen with SIGSTOP first, so that none
reacts to another's death: no trap, no Epilog, no engine shutdown): slurmd, the job's
slurmstepd, gpulab's batch script, the Docker CLI, the node's dockerd and containerd,
the shims and the container's processes. Slurm ends the job (NODE_FAIL); the node
"reboots" (a fresh mount namespace and exec roots, as a reboot clears /run and the
mounts; the engines' data roots kept, as disks are), its containerd, dockerd and
slurmd start again (``slurmd -b``: the node says it rebooted), it is idle again, and
its engine lists no container of the job. Node 2's project container runs on,
untouched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cluster_engines import engine_answers, remove_file
from cluster_images import tiny_image_tar
from cluster_kit import NODE_DEV, SlurmKit, wait_for
from cluster_procs import daemons_left, with_descendants
from conftest import PREFIX

from gpulab_hub import host, pidfile
from gpulab_hub.cluster import batch
from gpulab_hub.projects import objects

pytestmark = pytest.mark.docker
# the project's own data folders (data follows the share), as the hub makes them
DATA = ("models", "outputs", "huggingface")

KIT_PREFIX = f"{PREFIX}nf"  # a cluster of its own: it changes slurm.conf
SLURMD_TIMEOUT = 6  # seconds without an answer before Slurm declares a node down
MESSAGE_TIMEOUT = 4  # seconds slurmctld waits for a node's answer to its ping (10)


class FailingNodesKit(SlurmKit):
    """The test cluster, declaring a silent node down after SLURMD_TIMEOUT seconds
    (Slurm's default is 300)."""

    def _write_config(self) -> None:
        super()._write_config()
        with open(self.conf, "a") as f:
            f.write(f"SlurmdTimeout={SLURMD_TIMEOUT}\nMessageTimeout={MESSAGE_TIMEOUT}\n")


@pytest.fixture(scope="module")
def cluster(docker_engine, tmp_path_factory):
    kit = FailingNodesKit(KIT_PREFIX)
    kit.epilog = batch.render_epilog(kit.cluster, kit.node_docker_cli)
    work = tmp_path_factory.mktemp("nodefail")
    with kit:
        name = f"{KIT_PREFIX}/slurm-sleep:latest"
        tar = tiny_image_tar(work / "rootfs.tar")
        docker_engine.call("import_image", src=str(tar), repository=name.split(":")[0],
                           tag="latest")  # fmt: skip
        ref, _ = kit.push(name)
        for n in kit.nodes:
            subprocess.run(
                ["docker", "-H", kit.node_docker_host(n.name), "--config",
                 kit.node_docker_config, "pull", "-q", ref],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            host.ensure_network(kit.node_engine(n.name), f"{KIT_PREFIX}-net")
        (work / "project").mkdir()
        for sub in ("datasets", *(f"projects/alice/project/{d}" for d in DATA)):
            (work / "data" / sub).mkdir(parents=True)
        yield kit, ref, work
    assert daemons_left(kit) == [], "daemons outlived the test cluster"
    assert not kit.root.exists()


def submit_project(kit, ref: str, work: Path, name: str, node: str) -> int:
    """A project's container as gpulab's batch script runs it, pinned to ``node``."""
    settings = objects.ContainerInputs(
        name=f"{KIT_PREFIX}-{name}", image=ref, command=["sleep", "300"], env={},
        project_dir=str(work / "project"), data_root=str(work / "data"),
        hf_cache_volume=f"{KIT_PREFIX}-hf-alice", network=f"{KIT_PREFIX}-net", port=8888,
        owner="alice", labels={"gpulab.instance": KIT_PREFIX, "gpulab.owner": "alice"},
        pids_limit=256, mem_limit=64 * 2**20, cpu_limit=0.5,
    )  # fmt: skip
    script = batch.render_script(
        batch.BatchJob(kit.cluster, settings, docker=kit.node_docker_cli)
    )
    out = kit.root / "out" / f"{name}-%j.out"
    options = batch.sbatch_args(
        batch.JobRequest(name=f"{KIT_PREFIX}-{name}", mem_mb=128, output=str(out))
    )
    return kit.slurm().submit(script, [*options, f"--nodelist={node}"])


def job_containers(dk, kit, job_id: int) -> list[dict]:
    labels = [f"{batch.CLUSTER_LABEL}={kit.cluster}", f"{batch.JOB_LABEL}={job_id}"]
    return dk.call("containers", all=True, filters={"label": labels})


def running_container(kit, node: str, job_id: int) -> dict:
    dk = kit.node_engine(node)
    boxes = wait_for(
        f"job {job_id}'s container on {node}",
        lambda: [c for c in job_containers(dk, kit, job_id) if c["State"] == "running"],
        timeout=30,
    )
    return dk.call("inspect_container", boxes[0]["Id"])


def node_processes(kit, node: str, also: list[int]) -> list[int]:
    """Every process of ``node``: those in its network or mount namespace, ``also``,
    and all their descendants (the containers are their shims' children)."""
    ours = {os.stat(kit.ns(node, kind)).st_ino for kind in ("net", "mnt")}
    found = list(also)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            inodes = {os.stat(entry / "ns" / kind).st_ino for kind in ("net", "mnt")}
        except OSError:
            continue
        if inodes & ours:
            found.append(int(entry.name))
    # Live ones: a process killed a moment ago may be a zombie until it is reaped.
    return [
        p for p in with_descendants(found) if p != os.getpid() and pidfile.identity(p) is not None
    ]


def power_loss(kit, node: str, container_pid: int) -> list[pidfile.Identity]:
    """SIGSTOP every process of ``node`` until none is left running (so none sees
    another die), then SIGKILL them all; returns what was killed."""
    recorded = [kit._procs[k].pid for k in (node, f"{node}-containerd", f"{node}-dockerd")]
    frozen: dict[int, pidfile.Identity] = {}
    for _ in range(20):
        fresh = [p for p in node_processes(kit, node, [*recorded, container_pid])
                 if p not in frozen]  # fmt: skip
        if not fresh:
            break
        for pid in fresh:
            ident = pidfile.identity(pid)
            if ident is not None:
                frozen[pid] = ident
                os.kill(pid, signal.SIGSTOP)
        # kill() returns before the signal lands: a process not yet stopped could
        # still fork after the next look. Look again only once every one is stopped.
        wait_for(
            f"{node}'s processes to stop",
            lambda: all(_stopped_or_gone(p, i) for p, i in frozen.items()),
            timeout=10,
        )
    for pid, ident in frozen.items():
        if pidfile.identity(pid) == ident:
            os.kill(pid, signal.SIGKILL)
    for k in (node, f"{node}-containerd", f"{node}-dockerd"):
        kit._procs[k].wait(timeout=10)  # our children: reaped
    wait_for(
        f"every process of {node} to be gone",
        lambda: not [p for p, i in frozen.items() if pidfile.identity(p) == i],
        timeout=10,
    )
    return list(frozen.values())


def _stopped_or_gone(pid: int, ident: pidfile.Identity) -> bool:
    """True once ``pid`` is stopped (state T), a zombie, or no longer that process."""
    if pidfile.identity(pid) != ident:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] in ("T", "t", "Z", "X")


def reboot_engines(kit, node: str) -> None:
    """What a reboot clears goes (the node's mounts: a fresh mount namespace with the
    node's /dev; /run: the engines' exec roots and sockets, the shims' sockets); what
    a disk keeps stays (the engines' data roots, slurmd's spool). Then containerd and
    dockerd start as the kit starts them (slurmd: ``start_slurmd``)."""
    n = kit.node(node)
    folder = kit.root / node
    for sock in _node_shim_sockets(folder):
        remove_file(sock)
    mnt = kit.ns(node, "mnt")
    subprocess.run(["umount", str(mnt)], check=True, timeout=30)
    subprocess.run(["unshare", f"--mount={mnt}", "--propagation", "private", "bash", "-c",
                    NODE_DEV, "node-dev", *(str(m) for m in n.minors)],
                   check=True, capture_output=True, timeout=30)  # fmt: skip
    shutil.rmtree(folder / "x")
    for sock in ("containerd.sock", "containerd.sock.ttrpc", "docker.sock"):
        remove_file(folder / sock)
    containerd = ["containerd", "--config", f"{folder}/containerd.toml"]
    kit._start(f"{node}-containerd", [*kit._in_node(n), *containerd])
    kit._wait(f"{node}-containerd", (folder / "containerd.sock").exists)
    kit._start(f"{node}-dockerd",
               [*kit._in_node(n), "dockerd", "--config-file", f"{folder}/daemon.json"])  # fmt: skip
    url = kit.node_docker_host(node)
    kit._wait(f"{node}-dockerd", lambda: engine_answers(url), 60)


def start_slurmd(kit, node: str) -> None:
    """The node's slurmd as the kit starts it, saying the node rebooted (``-b``)."""
    n = kit.node(node)
    kit._start(node, [*kit._in_node(n), "slurmd", "-D", "-b", "-f", str(kit.conf)])


def _node_shim_sockets(folder: Path) -> list[Path]:
    """The shim sockets of ``folder``'s containers (shim_sockets over one node)."""
    found = []
    task = folder / "x" / "containerd-state" / "io.containerd.runtime.v2.task"
    for address in task.glob("*/*/address"):
        text = address.read_text().strip()
        if text.startswith("unix:///run/containerd/s/"):
            found.append(Path(text.removeprefix("unix://")))
    return found


def test_a_node_that_loses_power_leaves_no_container_when_it_comes_back(cluster):
    kit, ref, work = cluster
    client = kit.slurm()
    n1, n2 = (n.name for n in kit.nodes)
    victim = submit_project(kit, ref, work, "crash", n1)
    bystander = submit_project(kit, ref, work, "bystander", n2)
    box = running_container(kit, n1, victim)
    other = running_container(kit, n2, bystander)
    assert box["HostConfig"]["AutoRemove"] is True  # docker run --rm

    crashed = time.monotonic()
    killed = power_loss(kit, n1, box["State"]["Pid"])
    names = sorted({Path(i.cmdline[0].split(":")[0]).name for i in killed if i.cmdline})
    print(f"\nnode 1 lost power: {len(killed)} processes killed ({', '.join(names)})")
    for program in ("slurmd", "slurmstepd", "dockerd", "containerd",
                    "containerd-shim-runc-v2", "sleep"):  # fmt: skip
        assert program in names, f"{program} was not among node 1's processes"
    left = [pidfile.identity(p) for p in node_processes(kit, n1, [])]
    assert not left, f"node 1 processes survived: {[i.describe() for i in left if i]}"
    assert not engine_answers(kit.node_docker_host(n1))

    ended = wait_for(
        "Slurm to end the job on the failed node",
        lambda: (s := client.status(victim)) is not None and s.ended and s,
        timeout=60,
    )
    job_end = time.monotonic() - crashed
    down = {n.name: n for n in client.nodes()}[n1]
    print(f"crash -> job ended in squeue: {job_end:.1f} s, {ended.state} "
          f"({ended.words}); node 1 in sinfo: {down.state}{down.flag} {down.reason}")  # fmt: skip
    assert ended.state == "NODE_FAIL"
    assert victim not in {j.id for j in client.queue()}

    # The crash left the container's record on node 1's disk (no one removed it).
    records = list((kit.root / n1 / "data").glob(f"*/containers/{box['Id']}/config.v2.json"))
    assert len(records) == 1, "the container's record is not on node 1's disk"

    rebooted = time.monotonic()
    reboot_engines(kit, n1)
    engine_up = time.monotonic() - rebooted
    dk = kit.node_engine(n1)
    # Before slurmd starts (so no Epilog can have run): the engine's own restore
    # removes a --rm container that is no longer running.
    left = job_containers(dk, kit, victim)
    print(f"node 1's engine answered {engine_up:.1f} s after the reboot began; "
          f"the job's containers there: {[(c['Names'], c['State']) for c in left]}; "
          f"its record on disk: {'kept' if records[0].exists() else 'removed'}")
    wait_for("node 1's engine to list no container of the job",
             lambda: not job_containers(dk, kit, victim), timeout=20)  # fmt: skip
    gone = time.monotonic() - rebooted
    assert not records[0].exists()
    start_slurmd(kit, n1)

    def idle():
        node = {n.name: n for n in client.nodes()}[n1]
        return node.state == "idle" and not node.flag and node

    back = wait_for("node 1 to be idle again", idle, timeout=30)
    print(f"reboot -> container gone: {gone:.1f} s; reboot -> node idle: "
          f"{time.monotonic() - rebooted:.1f} s ({back.state})")  # fmt: skip
    assert dk.call("containers", all=True) == []
    assert client.status(victim).state == "NODE_FAIL"

    # Node 2 never noticed: the same container, started once, still running its job.
    still = kit.node_engine(n2).call("inspect_container", other["Id"])
    assert (still["State"]["Status"], still["State"]["StartedAt"]) == (
        "running", other["State"]["StartedAt"],
    )  # fmt: skip
    assert client.status(bystander).state == "RUNNING"
    client.cancel(bystander)
    wait_for("node 2's container to go after scancel",
             lambda: not job_containers(kit.node_engine(n2), kit, bystander))  # fmt: skip

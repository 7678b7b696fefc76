"""A test cluster's run that crashes (its Python process killed, with an image pushed
from this machine's engine, pulled on node 1 by digest and running there, and a job
running) leaves its daemons, the container's process, shim and socket, the overlay
mounts and the registry tag; the next start of the same prefix removes them all
(tests/cluster_kit.py). Split from test_cluster_kit.py: it makes its own cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_engines import main_tags, mounts_under, shim_sockets
from cluster_kit import SlurmKit, wait_for
from cluster_procs import batch_script_pid, daemons_left, in_mount_namespace
from conftest import PREFIX

from gpulab_hub import pidfile

pytestmark = pytest.mark.docker


def test_a_crashed_runs_leftovers_are_removed_by_the_next_start(docker_engine):
    prefix = f"{PREFIX}crash"
    try:
        crash_and_recover(docker_engine, prefix)
    finally:
        for img in docker_engine.call("images", name=f"{prefix}/sleep"):
            docker_engine.call("remove_image", img["Id"], force=True)


def crash_and_recover(docker_engine, prefix: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN.format(prefix=prefix)],
        cwd=Path(__file__).parent, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        up, box_pid = child.stdout.readline().split()
        assert up == "up"
        kit = SlurmKit(prefix)
        client = kit.slurm()
        job = client.submit(
            "#!/bin/sh\nsleep 300\n", ["--parsable", "--mem=64M", "-o", "/dev/null"]
        )
        script = wait_for("the job's script", lambda: batch_script_pid(kit, job))
    finally:
        child.kill()  # the run crashes: no stop, everything it started is left
        child.wait()
    lines = daemons_left(kit)
    left = [line.split()[1] for line in lines]
    print("left by the crash:", sorted(Path(c).name for c in left))
    # The container's shim belongs to node 1's own containerd, in a namespace of its
    # own: never to this machine's containerd or its "moby" namespace.
    (shim,) = [line for line in lines if "containerd-shim" in line]
    n1 = kit.nodes[0].name
    assert f" -namespace {n1} " in shim and f" -address {kit.root}/{n1}/containerd.sock" in shim
    daemons = sorted(Path(c).name for c in left if Path(c).name in DAEMONS)
    assert daemons == [
        "containerd", "containerd", "docker-registry", "docker-registry",
        "dockerd", "dockerd", "munged", "slurmctld", "slurmd", "slurmd",
    ]  # fmt: skip
    box = pidfile.identity(int(box_pid))  # the container on node 1, a shim's child
    assert box is not None
    sockets = shim_sockets(kit.root)
    assert len(sockets) == 1 and sockets[0].exists()
    # The container's overlay is mounted in node 1's mount namespace (kept by its file).
    assert any("/overlay2/" in m for m in kit.node_mounts(n1))
    node_mnt = os.stat(kit.ns(n1, "mnt")).st_ino
    assert any(t.startswith("127.0.0.1:") and f"/{prefix}/" in t for t in main_tags(docker_engine))

    with kit:
        assert [n.state for n in kit.slurm().nodes()] == ["idle", "idle"]
        assert pidfile.identity(script) is None  # the old job's script went too
        assert pidfile.identity(box.pid) != box  # and the old container
        assert not sockets[0].exists()
        assert kit.node_engine(kit.nodes[0].name).call("containers", all=True) == []
    assert daemons_left(kit) == [] and mounts_under(kit.root) == []
    # No process is left in node 1's old mount namespace and nothing keeps it: it is
    # gone, and the overlay mounted in it with it.
    assert in_mount_namespace(node_mnt) == []
    assert [t for t in main_tags(docker_engine) if f"/{prefix}/" in t] == []


DAEMONS = {"containerd", "docker-registry", "dockerd", "munged", "slurmctld", "slurmd"}

# The crashed run: a cluster, an image pushed from this machine's engine and pulled on
# node 1 by digest, a container running there; then it prints the container's PID.
CRASHING_RUN = """
import subprocess, time, cluster_images, cluster_kit
kit = cluster_kit.SlurmKit({prefix!r})
kit.start()
tar = cluster_images.tiny_image_tar(kit.root / "rootfs.tar")
kit.main_engine.call("import_image", src=str(tar), repository={prefix!r} + "/sleep", tag="latest")
ref, _ = kit.push({prefix!r} + "/sleep:latest")
node = kit.nodes[0].name
subprocess.run(["docker", "-H", kit.node_docker_host(node), "--config", kit.node_docker_config,
                "pull", ref], check=True, capture_output=True)
engine = kit.node_engine(node)
box = engine.call("create_container", ref, ["sleep", "300"])
engine.call("start", box["Id"])
print("up", engine.call("inspect_container", box["Id"])["State"]["Pid"], flush=True)
time.sleep(120)
"""

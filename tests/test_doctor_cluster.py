"""``gpulab doctor`` on a Slurm cluster: the real test cluster (tests/cluster_kit.py:
slurmctld, two slurmd nodes with dummy GPUs, a Docker engine on each node, the
registry) checked with the settings of a hub whose spawner is ProjectSlurmSpawner,
read from a configuration as the doctor reads the hub's.

- A healthy cluster gives only ok findings, naming both nodes: the controller, the
  nodes, Slurm's GPUs against gpulab's device lists, the registry push from this
  machine, and each node's probe job (device files, engine, Epilog, pull).
- A drained node is named with its reason and the command that brings it back; a
  device file that does not exist and a registry address the nodes cannot reach
  are reported for the node that saw them.
- A count of device files that differs from Slurm's, a node engine that does not
  answer, an Epilog rendered for other settings, and a busy node: reported, and the
  doctor never waits on a node that cannot take its probe.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from cluster_kit import SlurmKit
from conftest import PREFIX
from traitlets.config import Config

from gpulab_hub import hubsettings
from gpulab_hub.cluster import batch
from gpulab_hub.doctor import cli, cluster, cluster_probe, docker_checks
from gpulab_hub.doctor.findings import FAIL, OK, WARN, render_table

pytestmark = pytest.mark.docker
SLURM_SPAWNER = "gpulab_hub.cluster.spawner.ProjectSlurmSpawner"
# How long a test waits for every node to be idle and responding before it starts:
# past Slurm's default ping interval (SlurmdTimeout / 3 = 100 s), so a node marked not
# responding under load has been pinged again.
RESPOND_WAIT = 150


def test_on_one_machine_there_is_no_cluster_to_check():
    assert cluster.settings_of(hubsettings.spawner_of(Config())) is None


def test_print_epilog_gives_the_epilog_for_the_hubs_settings(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "jupyterhub_config.py"
    conf.write_text(
        f"c.JupyterHub.spawner_class = {SLURM_SPAWNER!r}\n"
        'c.ProjectSlurmSpawner.cluster_name = "lab"\n'
        'c.ProjectSlurmSpawner.node_docker_host = "unix:///run/nodes/{node}/docker.sock"\n'
    )
    monkeypatch.setattr(hubsettings, "config_file", lambda: conf)
    assert cli.print_epilog() == 0
    want = batch.render_epilog("lab", docker_host="unix:///run/nodes/{node}/docker.sock")
    assert capsys.readouterr().out == want
    conf.write_text("")  # one machine
    assert cli.print_epilog() == 2
    assert "not on a Slurm cluster" in capsys.readouterr().err


@pytest.fixture(scope="module")
def kit(shared_cluster) -> SlurmKit:
    """The session's test cluster (conftest's shared_cluster), with the Epilog gpulab
    renders for these settings."""
    k = shared_cluster
    k.epilog_path.write_text(
        batch.render_epilog(k.cluster, docker_host=k.node_docker_host_template)
    )
    k.wait_idle()  # a module before may have ended jobs a moment ago
    print(f"\ncluster up in {k.start_seconds:.1f} s")
    return k


def settings(kit, **changes):
    """The Slurm spawner's settings as a hub configured for the kit has them."""
    c = Config()
    c.JupyterHub.spawner_class = SLURM_SPAWNER
    c.ProjectSpawner.prefix = PREFIX
    c.ProjectSpawner.state_root = str(kit.root / "hub-state")
    s = c.ProjectSlurmSpawner
    s.slurm_conf = str(kit.conf)
    s.cluster_name = kit.cluster
    s.gpu_type = "h200"
    s.node_gpus = {n.name: list(n.files) for n in kit.nodes}
    s.node_nvidia_proc = str(kit.nvidia_proc)
    s.registry = kit.registry
    s.registry_for_nodes = kit.registry_for_nodes
    s.node_docker_host = kit.node_docker_host_template
    s.node_docker_config = kit.node_docker_config
    for key, value in changes.items():
        setattr(s, key, value)
    cfg = cluster.settings_of(hubsettings.spawner_of(c))
    assert cfg is not None
    return cfg


def storage(kit) -> tuple[Path, Path]:
    """The hub's projects and data folders (on this machine's disk, which the nodes'
    mount namespaces share, as nodes mount shared storage)."""
    folders = (kit.root / "doctor-storage" / "projects", kit.root / "doctor-storage" / "data")
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def doctor(kit, what: str, **changes):
    """Run the doctor's cluster checks; print its table (as `gpulab doctor` does)."""
    cfg = settings(kit, **changes)
    started = time.monotonic()
    found = cluster.findings(cfg, PREFIX, docker_checks.doctor_docker(), folders=storage(kit))
    took = time.monotonic() - started
    print(f"\n--- gpulab doctor, {what} ({took:.1f} s) ---\n{render_table(found, width=110)}")
    return {f.id: f for f in found}, took, cfg


def scontrol(kit, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=kit.env(), check=True, timeout=30)


def test_a_healthy_cluster_is_all_ok(kit):
    kit.wait_idle(timeout=RESPOND_WAIT)
    found, took, cfg = doctor(kit, "healthy cluster")
    assert {f.status for f in found.values()} == {OK}, render_table(list(found.values()))
    n1, n2 = (n.name for n in kit.nodes)
    for fid in ("cluster.nodes", "cluster.gres", "cluster.probe", "cluster.devices",
                "cluster.engine", "cluster.epilog", "cluster.pull", "cluster.storage"):  # fmt: skip
        assert n1 in found[fid].seen and n2 in found[fid].seen, found[fid]
    assert str(kit.conf) in found["cluster.controller"].seen
    assert "2 of 2 node(s) take projects" in found["cluster.nodes"].seen
    # Each GPU by its minor and the UUID the driver's files give it, in gres.conf's order.
    n2_uuids = kit.nodes[1].uuids
    assert f"nvidia3 (minor 3, {n2_uuids[3]}), " in found["cluster.devices"].seen
    assert kit.registry_for_nodes in found["cluster.pull"].seen
    assert took < 30
    projects, data = storage(kit)
    assert f"the hub's folders {projects}, {data} are the same storage on" in found[
        "cluster.storage"
    ].seen
    # Nothing left: no probe job output, no probe image on the nodes, no marker files.
    assert list((kit.root / "hub-state" / "cluster-jobs").iterdir()) == []
    assert list(projects.iterdir()) == [] and list(data.iterdir()) == []
    for n in kit.nodes:
        tags = [t for i in kit.node_engine(n.name).call("images") for t in i["RepoTags"] or []]
        assert not [t for t in tags if "doctor" in t], tags


def test_a_drained_node_a_missing_device_a_wrong_registry_and_missing_storage_are_named(kit):
    n1, n2 = kit.nodes
    kit.wait_idle(timeout=RESPOND_WAIT)
    projects, data = storage(kit)
    # Node 2 lacks the shared storage: a folder of its own where it should be mounted
    # (in its mount namespace only), holding an empty projects folder and no data.
    in_n2 = ["nsenter", f"--mount={kit.ns(n2.name, 'mnt')}"]
    subprocess.run([*in_n2, "mount", "-t", "tmpfs", "-o", "size=1m", "gpulab-no-storage",
                    str(projects.parent)], check=True, timeout=30)  # fmt: skip
    subprocess.run([*in_n2, "mkdir", str(projects)], check=True, timeout=30)
    scontrol(kit, "update", f"nodename={n1.name}", "state=drain", "reason=fan failure on gpu 0")
    try:
        found, _, _ = doctor(
            kit, "drained node, wrong device list, wrong registry",
            node_gpus={n1.name: list(n1.files), n2.name: ["/dev/gpulab-none", n2.files[1]]},
            registry_for_nodes=f"{kit.host_address}:9",
        )  # fmt: skip
    finally:
        scontrol(kit, "update", f"nodename={n1.name}", "state=resume")
        subprocess.run([*in_n2, "umount", str(projects.parent)], check=True, timeout=30)
    lost = found[f"cluster.storage.{n2.name}"]
    assert lost.status == FAIL
    assert lost.seen.startswith(
        f"node {n2.name} does not see the hub's folders: {projects} there is another folder "
        f"(a file the hub wrote in it just now is not in it); {data} does not exist there."
    ), lost.seen
    assert "at the same path as on the hub" in lost.fix
    drained = found[f"cluster.node.{n1.name}"]
    assert drained.status == WARN
    assert drained.seen == f"node {n1.name} is drained: fan failure on gpu 0"
    assert f"`scontrol update nodename={n1.name} state=resume` once fixed" in drained.fix
    assert "1 of 2 node(s) take projects" in found["cluster.nodes"].seen
    devices = found[f"cluster.devices.{n2.name}"]
    assert devices.status == FAIL
    assert "/dev/gpulab-none does not exist" in devices.seen
    assert f"gres.conf lists {', '.join(n2.files)} (slurmd -G)" in devices.seen
    pull = found[f"cluster.pull.{n2.name}"]
    assert pull.status == FAIL
    assert f"cannot fetch images from the registry {kit.host_address}:9" in pull.seen
    assert "registry_for_nodes" in pull.fix
    assert found["cluster.registry"].status == OK  # this machine still pushes


def test_a_count_mismatch_a_silent_engine_and_a_busy_node_are_reported(kit):
    n1, n2 = kit.nodes
    # The test before resumed a drained node; on a loaded machine the controller may
    # have marked a node not responding meanwhile (it pings every 100 s by default),
    # which the doctor rightly reports. This test is about other faults: start healthy.
    kit.wait_idle(timeout=RESPOND_WAIT)
    blocker = kit.slurm().submit(
        "#!/bin/sh\nsleep 120\n",
        ["--parsable", "--export=NONE", "--exclusive", f"--nodelist={n2.name}",
         "--mem=64M", "--output=/dev/null"],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while kit.slurm().job(blocker).state != "RUNNING":
            assert time.monotonic() < deadline, "the blocking job did not start"
            time.sleep(0.2)
        found, took, cfg = doctor(
            kit, "extra device file, engine socket missing, a busy node",
            node_gpus={n1.name: [*n1.files, "/dev/nvidia9"], n2.name: list(n2.files)},
            node_docker_host=f"unix://{kit.root}/{{node}}/gone.sock",
        )  # fmt: skip
        gres = found[f"cluster.gres.{n1.name}"]
        assert gres.status == FAIL
        assert f"Slurm lists 1 GPU(s) on node {n1.name} (gpu:h200:1)" in gres.seen
        assert "lists 2 device file(s)" in gres.seen
        engine = found[f"cluster.engine.{n1.name}"]
        assert engine.status == FAIL
        assert f"unix://{kit.root}/{{node}}/gone.sock) does not answer" in engine.seen
        assert "node_docker_host" in engine.fix
        # The installed Epilog targets the real engines: not the one for these settings.
        epilog = found[f"cluster.epilog.{n1.name}"]
        assert epilog.status == WARN and "not the Epilog gpulab renders" in epilog.seen
        assert "gpulab doctor --print-epilog" in epilog.fix
        assert f"busy, not probed: {n2.name} (allocated)" in found["cluster.probe"].seen
        assert f"cluster.engine.{n2.name}" not in found

        # A node that looked idle but whose probe waits (taken in between): the doctor
        # stops waiting, cancels its job and says so.
        node = next(n for n in cluster.partition_nodes(kit.slurm(), "gpu") if n.name == n2.name)
        started = time.monotonic()
        job = cluster_probe.ProbeJob(prefix=PREFIX)
        waits = cluster_probe.Waits(pending=1.5, total=20)
        results = cluster_probe.run(kit.slurm(), cfg, job, [node], waits)
        waited = time.monotonic() - started
        print(f"\na probe that waits behind another job: given up after {waited:.1f} s")
        result = results[n2.name]
        assert result.busy and waited < 6
        assert kit.slurm().job(result.job_id).state == "CANCELLED"
        words = cluster_probe.findings(cfg, job, results, [])[0].seen
        assert f"busy, not probed: {n2.name} (its job waited: " in words
    finally:
        kit.slurm().cancel(blocker)

"""A real Slurm cluster (tests/cluster_kit.py: munged, slurmctld, two slurmd nodes in
namespaces of their own, dummy GPUs as GRES) running what gpulab hands it.

- GPU jobs get Slurm's allocation; gpulab's batch script turns Slurm's GRES index
  into the device at that position on the node (not the device with that minor).
- With every GPU taken, a job waits and gpulab's client says why in a user's words.
- A project container started by gpulab's batch script through the real Docker
  engine is gone after ``scancel`` (the script's trap: the Epilog is a no-op then),
  and after the job's batch step is killed outright (SIGKILL to its process group:
  only the Epilog can remove it; without it the container survives, which is
  checked first).
- When the cluster stops, no daemon of it is left (pgrep).

The two nodes share this machine's Docker engine (docs/cluster.md: a limitation).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_kit import SlurmKit, daemons_left, tiny_image_tar
from conftest import PREFIX

from gpulab_hub import host, pidfile
from gpulab_hub.cluster import batch
from gpulab_hub.projects import objects

pytestmark = pytest.mark.docker

NOOP_EPILOG = "#!/bin/sh\nexit 0\n"

# A stand-in for the Docker CLI that records what gpulab's script ran, with the
# allocation Slurm gave the job, then stays up like a container would.
FAKE_DOCKER = """#!/bin/bash
if [ "$1" = run ]; then
  env_file=$(cat)
  python3 - "$env_file" "$@" > "@OUT@/$SLURM_JOB_ID.json" <<'EOF'
import json, os, sys
print(json.dumps({"argv": sys.argv[2:], "env_file": sys.argv[1], "slurm": {
    k: os.environ.get(k, "") for k in
    ("SLURMD_NODENAME", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")}}))
EOF
  exec sleep 60
fi
exit 0
"""


def wait_for(what: str, check, timeout: float = 20, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


@pytest.fixture(scope="module")
def cluster():
    kit = SlurmKit(PREFIX, epilog=batch.render_epilog(PREFIX))
    started = time.monotonic()
    with kit:
        print(f"\ncluster up in {time.monotonic() - started:.2f} s")
        yield kit
    left = daemons_left(kit)
    assert left == [], f"daemons outlived the test cluster: {left}"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(kit.root) not in mounts
    assert subprocess.run(["ip", "link", "show", kit.host_if], capture_output=True).returncode
    assert not kit.root.exists()


def test_the_cluster_comes_up_with_both_nodes_idle(cluster):
    nodes = cluster.slurm().nodes()
    print("sinfo:", [(n.name, n.state, n.gres) for n in nodes])
    assert [(n.name, n.state, n.flag, n.gres) for n in nodes] == [
        (f"{PREFIX}-n1", "idle", "", "gpu:h200:1"),
        (f"{PREFIX}-n2", "idle", "", "gpu:h200:2"),
    ]


def test_a_crashed_runs_leftovers_are_removed_by_the_next_start():
    prefix = f"{PREFIX}crash"
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN.format(prefix=prefix)],
        cwd=Path(__file__).parent, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "up"
        kit = SlurmKit(prefix)
        client = kit.slurm()
        job = client.submit(
            "#!/bin/sh\nsleep 300\n", ["--parsable", "--mem=64M", "-o", "/dev/null"]
        )
        script = wait_for("the job's script", lambda: batch_script_pid(kit, job))
    finally:
        child.kill()  # the run crashes: no stop, everything it started is left
        child.wait()
    left = [line.split()[1] for line in daemons_left(kit)]
    print("left by the crash:", left)
    daemons = sorted(
        Path(c).name for c in left if Path(c).name in ("munged", "slurmctld", "slurmd")
    )
    assert daemons == ["munged", "slurmctld", "slurmd", "slurmd"]
    with kit:
        assert [n.state for n in kit.slurm().nodes()] == ["idle", "idle"]
        assert pidfile.identity(script) is None  # the old job's script went too
    assert daemons_left(kit) == []


CRASHING_RUN = """
import time, cluster_kit
cluster_kit.SlurmKit({prefix!r}).start()
print("up", flush=True)
time.sleep(120)
"""


def batch_script_pid(cluster, job_id: int) -> int | None:
    """The PID of a running job's batch script on its node (None until it runs)."""
    script = f"/job{job_id:05d}/slurm_script".encode()
    root = str(cluster.root).encode()
    for p in Path("/proc").iterdir():
        cmd = _cmdline(p) if p.name.isdigit() else b""
        if script in cmd and root in cmd:
            return int(p.name)
    return None


def running(client, job_ids) -> bool:
    states = {j.id: j.state for j in client.queue()}
    return all(states.get(j) == "RUNNING" for j in job_ids)


def test_gpu_jobs_get_their_devices_and_a_full_cluster_says_why_it_waits(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("gpujobs")
    fake = work / "docker"
    fake.write_text(FAKE_DOCKER.replace("@OUT@", str(work)))
    fake.chmod(0o755)
    client = cluster.slurm()
    n1, n2 = (n.name for n in cluster.nodes)
    settings = objects.ContainerSettings(
        name=f"{PREFIX}-gpu-project", image=f"{PREFIX}/none:latest", command=["true"],
        env={}, project_dir=str(work), data_root=str(work), hf_cache_volume=f"{PREFIX}-hf",
        network=f"{PREFIX}-net", port=8888, owner="alice",
    )  # fmt: skip
    gpus = batch.SlurmGpus(
        count=1, type="h200", nodes=cluster.gres(), isolation=objects.DEVICES,
        nvidia_proc=str(cluster.nvidia_proc),
    )  # fmt: skip
    script = batch.render_script(batch.BatchJob(cluster.cluster, settings, gpus, str(fake)))
    request = batch.JobRequest(name=f"{PREFIX}-gpu", mem_mb=128, gpus=1, gpu_type="h200")
    options = batch.sbatch_args(request)
    ids = [client.submit(script, [*options, f"--nodelist={node}"]) for node in (n1, n2, n2)]
    wait_for("three GPU jobs running", lambda: running(client, ids))
    seen = wait_for(
        "each job's docker run",
        lambda: (
            all((work / f"{j}.json").exists() for j in ids)
            and [json.loads((work / f"{j}.json").read_text()) for j in ids]
        ),
    )
    by_index = {}
    for job in seen:
        slurm = job["slurm"]
        argv = job["argv"]
        devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
        devices = [d for d in devices if d.split(":")[1] not in objects.CONTROL_DEVICES]
        env = dict(e.split("=", 1) for e in job["argv"] if e.startswith("CUDA_VISIBLE_DEVICES="))
        print("job on", slurm, "->", devices, env)
        assert slurm["SLURM_JOB_GPUS"] == slurm["CUDA_VISIBLE_DEVICES"]
        by_index[(slurm["SLURMD_NODENAME"], slurm["SLURM_JOB_GPUS"])] = (devices, env)
    dev = cluster.root / "dev"
    uuids = {n.name: n.uuids for n in cluster.nodes}
    # Slurm's index is the position in the node's GRES list: index 0 on n2 is nvidia3.
    assert by_index == {
        (n1, "0"): (
            [f"{dev}/{n1}/nvidia0:/dev/nvidia0:rwm"],
            {"CUDA_VISIBLE_DEVICES": uuids[n1][0]},
        ),
        (n2, "0"): (
            [f"{dev}/{n2}/nvidia3:/dev/nvidia3:rwm"],
            {"CUDA_VISIBLE_DEVICES": uuids[n2][3]},
        ),
        (n2, "1"): (
            [f"{dev}/{n2}/nvidia2:/dev/nvidia2:rwm"],
            {"CUDA_VISIBLE_DEVICES": uuids[n2][2]},
        ),
    }

    # Every GPU is taken: two more GPU jobs wait, and gpulab says why in words.
    waiting = [client.submit("#!/bin/sh\nsleep 60\n", options) for _ in range(2)]

    def words():
        first, second = (client.status(j) for j in waiting)
        ready = first.reason == "Resources" and second.reason == "Priority"
        return ready and (first, second)

    first, second = wait_for("Slurm's reasons for the waiting jobs", words)
    print("squeue:", [(j.id, j.state, j.reason) for j in client.queue()])
    print("words:", first.words, "|", second.words)
    assert (first.state, first.words) == ("PENDING", "waiting for a GPU: next in line")
    assert (second.state, second.words) == ("PENDING", "waiting for a GPU: 1 job ahead")

    for j in ids + waiting:
        client.cancel(j)
    wait_for("the queue to empty", lambda: not client.queue(), timeout=30)


# --- a real project container through the real Docker engine ------------------------


@pytest.fixture(scope="module")
def sleeper(docker_engine, tmp_path_factory):
    """A tiny image (sleep and its libraries), the project network, data folders."""
    work = tmp_path_factory.mktemp("project")
    name = f"{PREFIX}/slurm-sleep:latest"
    tar = tiny_image_tar(work / "rootfs.tar")
    docker_engine.call("import_image", src=str(tar), repository=name.split(":")[0], tag="latest")
    host.ensure_network(docker_engine, f"{PREFIX}-net")
    (work / "project").mkdir()
    for sub in ("datasets", "models/alice", "outputs/alice"):
        (work / "data" / sub).mkdir(parents=True)
    return name, work


def project_job(cluster, sleeper, name: str) -> tuple[str, list[str]]:
    image, work = sleeper
    settings = objects.ContainerSettings(
        name=f"{PREFIX}-{name}", image=image, command=["sleep", "300"],
        env={"JUPYTERHUB_API_TOKEN": "s3cret-token"},
        project_dir=str(work / "project"), data_root=str(work / "data"),
        hf_cache_volume=f"{PREFIX}-hf-alice", network=f"{PREFIX}-net", port=8888,
        owner="alice", labels={"gpulab.instance": PREFIX, "gpulab.owner": "alice"},
        pids_limit=256, mem_limit=64 * 2**20, cpu_limit=0.5,
    )  # fmt: skip
    script = batch.render_script(batch.BatchJob(cluster.cluster, settings))
    out = cluster.root / "out" / f"{name}-%j.out"
    options = batch.sbatch_args(
        batch.JobRequest(name=f"{PREFIX}-{name}", mem_mb=128, output=str(out))
    )
    return script, options


def job_containers(dk, cluster, job_id: int) -> list[dict]:
    labels = [f"gpulab.slurm.cluster={cluster.cluster}", f"gpulab.slurm.job={job_id}"]
    return dk.call("containers", all=True, filters={"label": labels})


def start_project(dk, cluster, sleeper, name: str) -> tuple[int, dict]:
    script, options = project_job(cluster, sleeper, name)
    client = cluster.slurm()
    job_id = client.submit(script, options)

    def up():
        boxes = [c for c in job_containers(dk, cluster, job_id) if c["State"] == "running"]
        if not boxes and job_ended(client, job_id):
            log = cluster.root / "out" / f"{name}-{job_id}.out"
            text = log.read_text() if log.exists() else "(no output)"
            raise AssertionError(f"job {job_id} ended before its container ran:\n{text}")
        return boxes

    wait_for(f"job {job_id}'s container to run", up, timeout=30)
    (c,) = job_containers(dk, cluster, job_id)
    return job_id, dk.call("inspect_container", c["Id"])


def kill_batch_step(cluster, job_id: int) -> None:
    """SIGKILL to the job's batch script and everything in its process group (the
    Docker CLI with it), as the OOM killer or an admin's kill -9 would: no trap runs.
    (``scancel --signal=KILL`` does not do this: Slurm treats it as a cancel, TERM
    first.)"""
    pid = batch_script_pid(cluster, job_id)
    assert pid is not None, f"job {job_id}'s batch script is not running"
    os.killpg(os.getpgid(pid), signal.SIGKILL)


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def job_ended(client, job_id: int) -> bool:
    status = client.status(job_id)
    return status is None or status.ended


def test_scancel_stops_and_removes_the_container_through_the_trap(cluster, docker_engine, sleeper):
    cluster.epilog_path.write_text(NOOP_EPILOG)  # the trap alone
    client = cluster.slurm()
    job_id, box = start_project(docker_engine, cluster, sleeper, "trap")
    # The one-machine protections, applied by the real engine.
    hc = box["HostConfig"]
    assert (hc["CapDrop"], hc["SecurityOpt"], hc["PidsLimit"]) == (
        ["ALL"], ["no-new-privileges"], 256,
    )  # fmt: skip
    assert (hc["Memory"], hc["CpuQuota"], hc["NetworkMode"]) == (
        64 * 2**20,
        50_000,
        f"{PREFIX}-net",
    )
    assert box["Config"]["User"] == "1000:100"
    assert "JUPYTERHUB_API_TOKEN=s3cret-token" in box["Config"]["Env"]
    print("running:", client.status(job_id).words, box["Name"])

    started = time.monotonic()
    client.cancel(job_id)
    wait_for("the container to go", lambda: not job_containers(docker_engine, cluster, job_id))
    print(f"container gone {time.monotonic() - started:.2f} s after scancel")
    wait_for("the job to end", lambda: job_ended(client, job_id))


def test_a_job_killed_outright_leaves_its_container_to_the_epilog(cluster, docker_engine, sleeper):
    client = cluster.slurm()
    # Without gpulab's Epilog, SIGKILL leaves the container running: the pitfall.
    cluster.epilog_path.write_text(NOOP_EPILOG)
    job_id, _ = start_project(docker_engine, cluster, sleeper, "orphan")
    kill_batch_step(cluster, job_id)
    wait_for("the killed job to end", lambda: job_ended(client, job_id))
    time.sleep(1)
    orphans = job_containers(docker_engine, cluster, job_id)
    assert [c["State"] for c in orphans] == ["running"]
    for c in orphans:
        docker_engine.call("remove_container", c["Id"], force=True)

    # With it, the same kill leaves nothing.
    cluster.epilog_path.write_text(batch.render_epilog(cluster.cluster))
    job_id, _ = start_project(docker_engine, cluster, sleeper, "killed")
    started = time.monotonic()
    kill_batch_step(cluster, job_id)
    wait_for("the Epilog to remove the container",
             lambda: not job_containers(docker_engine, cluster, job_id))  # fmt: skip
    print(f"container gone {time.monotonic() - started:.2f} s after the SIGKILL")
    wait_for("the job to end", lambda: job_ended(client, job_id))

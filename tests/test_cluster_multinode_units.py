"""Multi-node jobs without a cluster (about 3 s): the batch script compared whole
(tests/golden/cluster-multinode.sh), each node's task run under bash with a recording
``docker`` (its GPUs from the step, its address and torchrun's node rank from
SLURM_NODEID, the user's arguments after the script, never run by a shell, TERM
removes the container), hostile requests refused in the user's words, the hub's
address assignment against a stand-in for Slurm (no address given twice while a job
holds it, given again once it ended), and the failure lines of a job's output as the
API shows them. After a deliberate change, regenerate the golden file with
GPULAB_UPDATE_GOLDEN=1. (The container side: test_jobs_cluster.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpulab_hub.cluster import ClusterError, batch, jobs, multinode
from gpulab_hub.cluster.slurm import Slurm
from gpulab_hub.projects import objects

GOLDEN = Path(__file__).with_name("golden")
JOB = "20261123-141502-a1b2"
IMAGE = "10.0.0.1:5001/gpulab/project@sha256:" + "ab" * 32
UUID_3 = "GPU-33333333-0000-1111-2222-333344445555"
UUID_2 = "GPU-22222222-0000-1111-2222-333344445555"
NET = multinode.JobNetwork("gpulab-jobnet", "eth0", "10.0.0.0/24", "10.0.0.128/30")


def settings(**overrides) -> objects.ContainerInputs:
    req = multinode.TrainRequest(JOB, "train.py", ("--epochs", "3"), 2, 1)
    base = dict(
        name=f"gpulab-alice--vision-job-{JOB}",
        image=IMAGE,
        command=[],
        env=multinode.job_env(req, 4, {"GPULAB_PROJECT": "vision", "GPULAB_OWNER": "alice"}),
        project_dir="/srv/gpulab/projects/alice/vision",
        data_root="/srv/gpulab/data",
        hf_cache_volume="gpulab-hf-alice",
        network=NET.name,
        port=8888,
        owner="alice",
        labels={"gpulab.instance": "gpulab", "gpulab.owner": "alice", "gpulab.project": "vision"},
        pids_limit=4096,
        mem_limit=8 * 2**30,
        cpu_limit=4.0,
    )
    base.update(overrides)
    return objects.ContainerInputs(**base)


def make_job(request=None, docker="docker", **overrides) -> multinode.MultiNodeJob:
    req = request or multinode.TrainRequest(JOB, "train.py", ("--epochs", "3"), 2, 1)
    nodes = (
        batch.NodeGpus("gpu-01", ("/dev/nvidia0",)),
        batch.NodeGpus("gpu-02", ("/dev/nvidia3", "/dev/nvidia2")),
    )
    fields = dict(
        cluster="lab",
        request=req,
        container=settings(),
        network=NET,
        addresses=("10.0.0.129", "10.0.0.130")[: req.nodes],
        gpus=batch.SlurmGpus(count=req.gpus_per_node, type="h200", nodes=nodes),
        engine=batch.NodeEngine(
            host="unix:///run/gpulab-nodes/{node}/docker.sock", config="/etc/gpulab/docker"
        ),
        docker=docker,
    )
    fields.update(overrides)
    return multinode.MultiNodeJob(**fields)


def golden(name: str, text: str) -> str:
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("GPULAB_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    return path.read_text()


# --- the batch script, whole ----------------------------------------------------------


def test_the_batch_script_of_a_two_node_job_matches_golden():
    job = make_job()
    text = multinode.render_script(job)
    assert text == golden("cluster-multinode", text)
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    task = multinode.render_task(job)
    subprocess.run(["bash", "-n"], input=task, text=True, check=True)
    # One task per node through srun; the environment only on srun's standard input.
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert srun.startswith("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1")
    assert "GPULAB_JOB_ID" not in text.split("<<'GPULAB_ENV'")[0]
    # The one-machine protections stand in each node's docker run.
    for words in ("--cap-drop ALL", "--security-opt no-new-privileges", "--pids-limit 4096"):
        assert words in task


def test_sbatch_options_of_a_multi_node_job_whole():
    job = make_job()
    request = batch.JobRequest(
        name=f"gpulab-alice--vision-job-{JOB}", mem_mb=16384, cpus=4, gpus=1, gpu_type="h200",
        partition="gpu", time_limit="1-00:00:00", output="/srv/gpulab/hub/cluster-jobs/job-%j.out",
    )  # fmt: skip
    assert multinode.sbatch_args(job, request) == [
        "--parsable",
        "--export=NONE",
        "--no-requeue",
        f"--job-name=gpulab-alice--vision-job-{JOB}",
        "--chdir=/",
        "--output=/srv/gpulab/hub/cluster-jobs/job-%j.out",
        "--cpus-per-task=4",
        "--mem=16384M",
        "--partition=gpu",
        "--time=1-00:00:00",
        "--gres=gpu:h200:1",
        "--nodes=2",
        "--ntasks-per-node=1",
    ]


# --- hostile or impossible requests -------------------------------------------------

LIMITS = multinode.Limits(max_nodes=4, max_gpus_per_node=8)
REFUSED = {
    "absolute-script": (dict(script="/etc/cron.daily/x.py"), "inside the project folder"),
    "parent-script": (dict(script="../other/train.py"), "inside the project folder"),
    "option-as-script": (dict(script="--nnodes=64.py"), "inside the project folder"),
    "notebook": (dict(script="analysis.ipynb"), "runs a Python script (.py)"),
    "line-break-arg": (dict(args=("--lr", "1\nGPULAB_TASK")), "holds a line break"),
    "escape-arg": (dict(args=("\x1b[2J",)), "control character"),
    "too-many-nodes": (dict(nodes=5), "at most 4 nodes (the administrator's limit)"),
    "too-many-gpus": (dict(gpus_per_node=9), "at most 8 GPUs per node"),
    "no-nodes": (dict(nodes=0), "--nodes must be a whole number"),
    "negative-gpus": (dict(gpus_per_node=-1), "--gpus-per-node must be a whole number"),
    "bool-nodes": (dict(nodes=True), "--nodes must be a whole number"),
    "bad-id": (dict(job_id="../../etc"), "is not a job id"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_hostile_requests_are_refused_in_the_users_words(name):
    change, words = REFUSED[name]
    req = replace(multinode.TrainRequest(JOB, "train.py", (), 2, 1), **change)
    with pytest.raises(ClusterError) as e:
        multinode.check_request(req, LIMITS)
    assert words in str(e.value)


@pytest.mark.parametrize(
    "change",
    [
        dict(addresses=("10.0.0.129",)),  # fewer than nodes
        dict(addresses=("10.0.0.129", "10.0.0.129")),  # the same twice
        dict(addresses=("10.0.0.129", "10.0.0.1")),  # outside the range
        dict(network=replace(NET, parent="eth0 --opt x")),
        dict(network=replace(NET, subnet="10.0.0.0/33")),
        dict(network=replace(NET, ip_range="10.9.0.0/24")),
        dict(network=replace(NET, name="-jobnet")),
        dict(master_port=22),
        dict(python="python3; id"),
        dict(container=settings(name="x; rm -rf /")),
        dict(container=settings(image="gpulab/project:latest")),  # not by digest
    ],
)
def test_impossible_jobs_are_refused(change):
    with pytest.raises(ClusterError):
        multinode.render_script(make_job(**change))


def test_the_job_network_gives_its_range_minus_the_gateway():
    assert NET.assignable() == ["10.0.0.128", "10.0.0.129", "10.0.0.130", "10.0.0.131"]
    whole = multinode.JobNetwork("n", "eth0", "10.0.0.0/30")
    assert whole.assignable() == ["10.0.0.2"]  # .1 is the gateway, .0/.3 the ends
    assert whole.checked().gateway == "10.0.0.1"  # always named: Docker would take .2
    gw = multinode.JobNetwork("n", "eth0", "10.0.0.0/29", gateway="10.0.0.6")
    assert gw.assignable() == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]


# --- a node's task under bash, with a recording docker -----------------------------

FAKE_DOCKER = """#!/bin/bash
log=@LOG@
args=("$@")
while [ "$1" = --config ]; do shift 2; done
if [ "$1" = run ]; then
  env_file=$(cat)
  python3 - "$env_file" "${args[@]}" >> "$log" <<'EOF'
import json, os, sys
print(json.dumps({"argv": sys.argv[2:], "env_file": sys.argv[1],
                  "docker_host": os.environ.get("DOCKER_HOST", "")}))
EOF
  sleep "${FAKE_RUN_SECONDS:-0}" &
  wait $!
  echo "torchrun said goodbye"
  exit "${FAKE_RUN_EXIT:-0}"
fi
python3 -c 'import json, sys; print(json.dumps({"argv": sys.argv[1:]}))' "${args[@]}" >> "$log"
case "$1 $2" in
  "network inspect")
    if [ "$3" = --format ]; then echo "macvlan eth0 10.0.0.0/24 10.0.0.128/30 10.0.0.1"; fi ;;
  "pull -q") echo sha256:ab ;;
  "ps -aq") echo c0ffee ;;
esac
exit 0
"""


@pytest.fixture
def fake_docker(tmp_path):
    log = tmp_path / "docker.log"
    path = tmp_path / "docker"
    path.write_text(FAKE_DOCKER.replace("@LOG@", str(log)))
    path.chmod(0o755)

    def calls() -> list[dict]:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    return str(path), calls


@pytest.fixture
def gpu_nodes(tmp_path):
    """Node gpu-02's devices nvidia3, nvidia2 (GRES order) and the driver's files."""
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir()
    for minor, uuid in ((3, UUID_3), (2, UUID_2)):
        os.mknod(dev / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))
        info = proc / f"0000:0{minor}:00.0" / "information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Model: \t\t NVIDIA H200\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n")
    nodes = (
        batch.NodeGpus("gpu-01", (str(dev / "nvidia3"),)),
        batch.NodeGpus("gpu-02", (str(dev / "nvidia3"), str(dev / "nvidia2"))),
    )
    return nodes, str(proc)


TASK_ENV = {
    "SLURM_JOB_ID": "42",
    "SLURMD_NODENAME": "gpu-02",
    "SLURM_NODEID": "1",
    "SLURM_JOB_GPUS": "0",  # the first node's, as an srun task sees it
    "SLURM_STEP_GPUS": "1",  # this node's: nvidia2
}
ENV_LINES = "GPULAB_JOB_ID=20261123-141502-a1b2\nSECRET=$(touch /tmp/gpulab-pwned-mn)\n"


def task_of(docker: str, gpu_nodes, request=None) -> str:
    nodes, proc = gpu_nodes
    job = make_job(request, docker=docker)
    gpus = replace(job.gpus, nodes=nodes, nvidia_proc=proc)
    return multinode.render_task(replace(job, gpus=gpus))


def start_task(text: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "-c", text], env={"PATH": "/usr/bin:/bin", **env}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def test_a_node_task_runs_torchrun_for_its_node_with_its_step_gpus(fake_docker, gpu_nodes):
    docker, calls = fake_docker
    hostile = ("--master-addr=203.0.113.9", "$(touch /tmp/gpulab-pwned-mn)", "a b")
    req = multinode.TrainRequest(JOB, "src/train.py", hostile, 2, 1)
    task = start_task(task_of(docker, gpu_nodes, req), TASK_ENV)
    out, err = task.communicate(ENV_LINES, timeout=20)
    assert task.returncode == 0, err
    assert "gpulab-progress: Starting torchrun on node gpu-02 (node 1 of 2, 10.0.0.130)" in out
    seen = calls()
    made = [c["argv"] for c in seen if c["argv"][:2] == ["network", "create"]]
    assert made == [], "the network exists (inspect answered): nothing is made"
    pulls = [c["argv"] for c in seen if "pull" in c["argv"]]
    assert pulls == [["--config", "/etc/gpulab/docker", "pull", "-q", IMAGE]]
    (run,) = [c for c in seen if c["argv"][0] == "run"]
    argv = run["argv"]
    assert run["docker_host"] == "unix:///run/gpulab-nodes/gpu-02/docker.sock"

    def value(flag):
        return [argv[i + 1] for i, a in enumerate(argv) if a == flag]

    assert value("--name") == [f"gpulab-alice--vision-job-{JOB}-n1"]
    assert value("--network") == ["gpulab-jobnet"]
    assert value("--ip") == ["10.0.0.130"]  # node index 1's address
    assert "gpulab.slurm.job=42" in value("--label") and f"gpulab.job={JOB}" in value("--label")
    # The GPU of this node's step (index 1 on gpu-02: nvidia2), not the first node's.
    assert value("--gpus") == [f'"driver=nvidia","device={UUID_2}","capabilities=compute,utility"']
    assert f"CUDA_VISIBLE_DEVICES={UUID_2}" in value("-e")
    assert run["env_file"] == ENV_LINES.rstrip("\n")
    image_at = argv.index(IMAGE)
    assert argv[image_at + 1 :] == [
        "python3", "-m", "gpulab_jupyter.jobs.node", "--job", JOB, "--rank", "1",
        "--nodes", "2", "--",
        "python3", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
        "--node-rank=1", "--master-addr=10.0.0.129", "--master-port=29500",
        "src/train.py", *hostile,
    ]  # fmt: skip
    assert not Path("/tmp/gpulab-pwned-mn").exists()


@pytest.mark.parametrize(
    "env,words",
    [
        ({"SLURM_NODEID": "2"}, "no node index of this job (SLURM_NODEID=2)"),
        ({"SLURM_NODEID": "1;id"}, "no node index of this job"),
        ({"SLURM_STEP_GPUS": "0,1"}, "Slurm gave this job GPUs '0,1', not 1"),
        ({"SLURMD_NODENAME": "gpu 02"}, "no node gpulab can name"),
    ],
)
def test_a_task_that_cannot_place_itself_fails_with_words(env, words, fake_docker, gpu_nodes):
    docker, calls = fake_docker
    task = start_task(task_of(docker, gpu_nodes), {**TASK_ENV, **env})
    _, err = task.communicate(ENV_LINES, timeout=20)
    assert task.returncode != 0 and words in err
    assert not [c for c in calls() if c["argv"][0] == "run"]


def test_a_failing_node_says_so_and_term_removes_the_container(fake_docker, gpu_nodes):
    docker, calls = fake_docker
    text = task_of(docker, gpu_nodes)
    failed = start_task(text, {**TASK_ENV, "FAKE_RUN_EXIT": "3"})
    _, err = failed.communicate(ENV_LINES, timeout=20)
    assert failed.returncode == 3
    said = "torchrun on node gpu-02 (node 1) ended with exit code 3; the job's output is in"
    assert f"{said} jobs/{JOB}/" in err
    assert "gpulab:   torchrun said goodbye" in err
    # scancel: TERM to the task while its container runs.
    running = start_task(text, {**TASK_ENV, "FAKE_RUN_SECONDS": "30"}, start_new_session=True)
    running.stdin.write(ENV_LINES)
    running.stdin.close()
    deadline = time.monotonic() + 15
    while len([c for c in calls() if c["argv"][0] == "run"]) < 2:
        assert time.monotonic() < deadline, "the container never started"
        time.sleep(0.05)
    removed_before = len([c for c in calls() if c["argv"][0] == "rm"])
    os.kill(running.pid, signal.SIGTERM)
    assert running.wait(timeout=10) == 143
    removes = [c["argv"] for c in calls() if c["argv"][0] == "rm"][removed_before:]
    assert removes == [["rm", "-f", "c0ffee"]]
    ps = [c["argv"] for c in calls() if c["argv"][0] == "ps"][-1]
    assert ps == ["ps", "-aq", "--filter", "label=gpulab.slurm.cluster=lab",
                  "--filter", "label=gpulab.slurm.job=42"]  # fmt: skip


# --- the hub's addresses against a stand-in for Slurm ---------------------------------


class FakeSlurm:
    """sbatch, squeue and scancel as a stand-in: jobs run until told they ended."""

    def __init__(self):
        self.next_id = 100
        self.states: dict[int, str] = {}
        self.scripts: dict[int, tuple[str, list[str]]] = {}

    def __call__(self, argv, input=None, env=None, **kw):
        name = Path(argv[0]).name
        args = argv[1:]
        out = ""
        if name == "sbatch":
            self.next_id += 1
            self.states[self.next_id] = "RUNNING"
            self.scripts[self.next_id] = (input, args)
            out = f"{self.next_id}\n"
        elif name == "scancel":
            self.states[int(args[-1])] = "CANCELLED"
        elif name == "squeue":
            wanted = [a.split("=", 1)[1] for a in args if a.startswith("--jobs=")]
            for jid, state in self.states.items():
                if not wanted or str(jid) in wanted:
                    out += f"{jid}|{state}|None|gpu|1|gres/gpu:1|gpu-0[1-2]|x\n"
        return subprocess.CompletedProcess(argv, 0, out, "")


@pytest.fixture
def site(tmp_path):
    fake = FakeSlurm()
    log_dir = tmp_path / "cluster-jobs"
    log_dir.mkdir()
    client = Slurm(run=fake)
    client.command = lambda name: f"/usr/bin/{name}"  # found or not here: the fake answers
    s = jobs.Site(
        cluster="lab", slurm=client, network=NET, limits=LIMITS, log_dir=log_dir,
        mem_mb=1024, cpus=2, gpus=batch.SlurmGpus(type="h200"),
    )  # fmt: skip
    return s, fake, jobs.record_of(tmp_path / "records")


def project_ref(name="vision") -> jobs.ProjectRef:
    return jobs.ProjectRef("alice", name, settings(name=f"gpulab-alice--{name}"), IMAGE)


def test_the_hub_never_gives_an_address_twice_while_a_job_holds_it(site):
    s, fake, record = site
    ids = iter(f"20261123-14150{i}-a1b2" for i in range(9))
    first = jobs.submit(s, record, project_ref(), multinode.TrainRequest(next(ids), "t.py", (), 2))
    second = jobs.submit(s, record, project_ref(), multinode.TrainRequest(next(ids), "t.py", (), 2))
    assert first["addresses"] == ["10.0.0.128", "10.0.0.129"]
    assert second["addresses"] == ["10.0.0.130", "10.0.0.131"]
    # The range is full: the next one is refused, in words.
    with pytest.raises(ClusterError, match="job network has 0 free addresses and this job needs 1"):
        jobs.submit(s, record, project_ref(), multinode.TrainRequest(next(ids), "t.py", (), 1))
    # The first job ends: its addresses are free for the next job.
    fake.states[first["slurm_job"]] = "COMPLETED"
    third = jobs.submit(s, record, project_ref(), multinode.TrainRequest(next(ids), "t.py", (), 2))
    assert third["addresses"] == ["10.0.0.128", "10.0.0.129"]
    script, options = fake.scripts[third["slurm_job"]]
    assert "addresses=(10.0.0.128 10.0.0.129)" in script
    assert "--nodes=2" in options and "--export=NONE" in options and "--mem=1024M" in options
    # Stopping cancels the Slurm job, and frees its addresses for another project's job.
    stopped = jobs.stop(s, record, "alice", "vision", second["id"])
    assert (stopped["state"], stopped["stop_requested"]) == ("CANCELLED", True)
    assert fake.states[second["slurm_job"]] == "CANCELLED"
    other = jobs.submit(
        s, record, project_ref("nlp"), multinode.TrainRequest(next(ids), "t.py", (), 1)
    )
    assert other["addresses"] == ["10.0.0.130"]
    # A project sees its own jobs only, newest first, with Slurm's state.
    listed = jobs.project_jobs(s, record, "alice", "vision")
    assert [j["id"] for j in listed] == [third["id"], second["id"], first["id"]]
    assert [j["state"] for j in listed] == ["RUNNING", "CANCELLED", "COMPLETED"]
    # The same id twice in a project is refused; another project's job is not found.
    with pytest.raises(ClusterError, match="already has a job"):
        jobs.submit(s, record, project_ref(), multinode.TrainRequest(third["id"], "t.py", (), 1))
    with pytest.raises(LookupError):
        jobs.one_job(s, record, "alice", "nlp", third["id"])


def test_a_jobs_failure_lines_reach_the_api_without_the_containers_words(site):
    s, fake, record = site
    job = jobs.submit(s, record, project_ref(), multinode.TrainRequest(JOB, "t.py", (), 2))
    (s.log_dir / f"job-{job['slurm_job']}.out").write_text(
        "gpulab-progress: Starting on nodes gpu-0[1-2]\n"
        "1: gpulab-progress: Fetching the project's image on node gpu-02\n"
        "1: gpulab: node gpu-02 could not fetch the project's image from the cluster's"
        " registry: x\n"
        "0: some other line\n"
    )
    seen = jobs.one_job(s, record, "alice", "vision", JOB)
    assert seen["progress"] == "Fetching the project's image on node gpu-02"
    assert seen["failure"] == [
        "node gpu-02 could not fetch the project's image from the cluster's registry: x"
    ]


def test_the_record_keeps_a_projects_newest_ended_jobs_and_their_output(site, monkeypatch):
    s, fake, record = site
    monkeypatch.setattr(jobs, "KEEP_ENDED_PER_PROJECT", 1)
    ids = [f"20261123-14150{i}-a1b2" for i in range(3)]
    first = jobs.submit(s, record, project_ref(), multinode.TrainRequest(ids[0], "t.py", (), 1))
    jobs.output_file(s.log_dir, first["slurm_job"]).write_text("gpulab: first\n")
    fake.states[first["slurm_job"]] = "COMPLETED"
    second = jobs.submit(s, record, project_ref(), multinode.TrainRequest(ids[1], "t.py", (), 1))
    fake.states[second["slurm_job"]] = "FAILED"
    jobs.submit(s, record, project_ref(), multinode.TrainRequest(ids[2], "t.py", (), 1))
    listed = [j["id"] for j in jobs.project_jobs(s, record, "alice", "vision")]
    assert listed == [ids[2], ids[1]]  # the oldest ended one went, with its output file
    assert not jobs.output_file(s.log_dir, first["slurm_job"]).exists()

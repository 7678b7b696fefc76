"""What gpulab hands to Slurm, compared whole: the project container's ``docker run``
arguments, the batch script and the Epilog (tests/golden/cluster-*.sh), sbatch's
options, and Slurm's states and reasons in a user's words.

The rendered scripts also run here under bash with a recording ``docker`` (no Slurm,
no Docker): the GPUs the script gives the container for Slurm's indexes must be the
ones ``objects.container_spec`` gives for the same devices, the TERM trap must remove
the container, the Epilog must remove the job's containers and always exit 0.
After a deliberate change, regenerate the golden files with GPULAB_UPDATE_GOLDEN=1.
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

from gpulab_hub.cluster import ClusterError, batch
from gpulab_hub.cluster.dockerargs import DockerRun, run_args
from gpulab_hub.cluster.slurm import (
    Slurm,
    parse_sinfo,
    parse_squeue,
    parse_submitted,
    status_of,
    submit_error,
)
from gpulab_hub.projects import objects

GOLDEN = Path(__file__).with_name("golden")
TOKEN = "t0k3n-$(touch /tmp/gpulab-pwned)-'quoted'"
UUID_3 = "GPU-33333333-0000-1111-2222-333344445555"
UUID_2 = "GPU-22222222-0000-1111-2222-333344445555"


def settings(**overrides) -> objects.ContainerInputs:
    base = dict(
        name="gpulab-alice--vision",
        image="gpulab/project:0123456789abcdef",
        command=["jupyterhub-singleuser", "--notebook-dir=/workspace"],
        env={"JUPYTERHUB_API_TOKEN": TOKEN, "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/"},
        project_dir="/srv/gpulab/projects/alice/vision",
        data_root="/srv/gpulab/data",
        hf_cache_volume="gpulab-hf-alice",
        network="gpulab-net",
        port=8888,
        owner="alice",
        labels={"gpulab.instance": "gpulab", "gpulab.owner": "alice", "gpulab.project": "vision"},
        pids_limit=4096,
        mem_limit=8 * 2**30,
        cpu_limit=2.0,
    )
    base.update(overrides)
    return objects.ContainerInputs(**base)


# --- the container spec as docker run arguments --------------------------------------

HARDENED_OPTIONS = (
    "--network", "gpulab-net",
    "--mount", "type=bind,source=/srv/gpulab/projects/alice/vision,target=/workspace",
    "--mount", "type=bind,source=/srv/gpulab/data/datasets,target=/data/datasets,readonly",
    "--mount", "type=bind,source=/srv/gpulab/data/projects/alice/vision/models,target=/data/models",
    "--mount",
    "type=bind,source=/srv/gpulab/data/projects/alice/vision/outputs,target=/data/outputs",
    "--mount",
    "type=bind,source=/srv/gpulab/data/projects/alice/vision/huggingface,target=/cache/huggingface",
    "--shm-size", "8g",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
    "--pids-limit", "4096",
    "--memory", "8589934592",
    "--cpu-period", "100000",
    "--cpu-quota", "200000",
)  # fmt: skip


def test_docker_run_args_carry_the_whole_spec():
    run = run_args(objects.container_spec(settings()))
    assert run == DockerRun(
        options=(
            "--name",
            "gpulab-alice--vision",
            "--label",
            "gpulab.instance=gpulab",
            "--label",
            "gpulab.owner=alice",
            "--label",
            "gpulab.project=vision",
            "--hostname",
            "vision",
            "--user",
            "1000:100",
            "--workdir",
            "/workspace",
            "--expose",
            "8888/tcp",
            *HARDENED_OPTIONS,
        ),  # fmt: skip
        image="gpulab/project:0123456789abcdef",
        command=("jupyterhub-singleuser", "--notebook-dir=/workspace"),
        env={
            "JUPYTERHUB_API_TOKEN": TOKEN,
            "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/",
            "GPULAB_WORKSPACE": "/workspace",
            "GPULAB_PROJECT_DIR": "/workspace",
            "GPULAB_DATA": "/data",
            "HF_HOME": "/cache/huggingface",
            "HF_TOKEN_PATH": "/tmp/gpulab-huggingface/token",
            "NVIDIA_VISIBLE_DEVICES": "void",
            "CUDA_VISIBLE_DEVICES": "",
        },
    )
    # No environment value stands among the options (they go through --env-file).
    assert not any(TOKEN in o for o in run.options)


def test_gpus_given_as_the_spec_gives_them():
    runtime = objects.GpuAssignment(uuids=(UUID_3, UUID_2), minors=(3, 2), isolation="runtime")
    opts = run_args(objects.container_spec(settings(gpus=runtime))).options
    assert opts[-2:] == (
        "--gpus",
        '"driver=nvidia","device=GPU-33333333-0000-1111-2222-333344445555,'
        'GPU-22222222-0000-1111-2222-333344445555","capabilities=compute,utility"',
    )
    devices = replace(runtime, isolation="devices")
    opts = run_args(objects.container_spec(settings(gpus=devices))).options
    assert [opts[i + 1] for i, o in enumerate(opts) if o == "--device"] == [
        "/dev/nvidia3:/dev/nvidia3:rwm",
        "/dev/nvidia2:/dev/nvidia2:rwm",
        "/dev/nvidiactl:/dev/nvidiactl:rwm",
        "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
        "/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rwm",
    ]
    assert "type=bind,source=/usr/local/nvidia,target=/usr/local/nvidia,readonly" in opts


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["host_config"].update(privileged=True),
        lambda s: s["host_config"].update(port_bindings={"8888/tcp": [("0.0.0.0", 8888)]}),
        lambda s: s.update(entrypoint=["/bin/sh"]),
        lambda s: s["host_config"]["binds"].update({"/": {"bind": "/host", "mode": "rw"}}),
    ],
    ids=["privileged", "published-port", "entrypoint", "bind-disagrees-with-volumes"],
)
def test_a_spec_key_the_script_cannot_apply_is_refused_not_dropped(change):
    spec = objects.container_spec(settings())
    change(spec)
    with pytest.raises(ClusterError):
        run_args(spec)


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "x; rm -rf /"},
        {"name": "-v/:/host"},
        {"image": "--privileged"},
        {"image": "gpulab/project:a b"},
        {"env": {"A B": "1"}},
        {"env": {"JUPYTERHUB_API_TOKEN": "a\nEVIL=1"}},
        {"labels": {"gpulab.owner": "alice\nx"}},
        {"project_dir": "/srv/a:/etc"},
        {"project_dir": "/srv/gpulab/projects/../../etc"},
        {"hf_cache_volume": "../x", "data_scope": "user"},
        {"user": "root"},
        {"shm_size": "8g --privileged"},
    ],
)
def test_hostile_values_are_refused(overrides):
    with pytest.raises(ClusterError):
        batch.render_script(batch.BatchJob("lab", settings(**overrides)))


# --- the batch script and the Epilog, whole ------------------------------------------

GPU_NODES = (
    batch.NodeGpus("gpu-01", ("/dev/nvidia0", "/dev/nvidia1")),
    batch.NodeGpus("gpu-02", ("/dev/nvidia3", "/dev/nvidia2")),
)
CASES = {
    "cluster-batch-cpu": batch.BatchJob("lab", settings()),
    "cluster-batch-gpu-runtime": batch.BatchJob(
        "lab", settings(), batch.SlurmGpus(count=2, type="h200", nodes=GPU_NODES)
    ),
    "cluster-batch-gpu-devices": batch.BatchJob(
        "lab",
        settings(),
        batch.SlurmGpus(count=1, nodes=GPU_NODES, isolation="devices"),
    ),
}


def golden(name: str, text: str) -> str:
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("GPULAB_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    return path.read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_batch_script_matches_golden(name):
    text = batch.render_script(CASES[name])
    assert text == golden(name, text)
    # The protections of the one-machine spec stand in the script, word for word.
    for flag, value in zip(HARDENED_OPTIONS[::2], HARDENED_OPTIONS[1::2], strict=True):
        assert f"{flag} {value}\n" in text.replace(" \\\n", "\n")
    # The token only in the env-file heredoc, never in a command.
    before, heredoc = text.split("<<'GPULAB_ENV' &\n")
    assert "t0k3n" not in before
    assert heredoc.startswith(f"JUPYTERHUB_API_TOKEN={TOKEN}\n")
    assert heredoc.endswith('GPULAB_ENV\nwait "$!"\n')
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_epilog_matches_golden():
    text = batch.render_epilog("lab")
    assert text == golden("cluster-epilog", text)
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def gpu_job(nodes=GPU_NODES, **gpus) -> batch.BatchJob:
    return batch.BatchJob("lab", settings(), batch.SlurmGpus(**{"count": 1, **gpus}, nodes=nodes))


HOSTILE_JOBS = {
    "cluster": batch.BatchJob("lab;reboot", settings()),
    "docker": batch.BatchJob("lab", settings(), docker="docker;id"),
    "node": gpu_job(nodes=(batch.NodeGpus("n1) x", ("/dev/nvidia0",)),)),
    "device-file": gpu_job(nodes=(batch.NodeGpus("n1", ("/dev/nvidia0 /etc/passwd",)),)),
    "no-files": gpu_job(nodes=(batch.NodeGpus("n1", ()),)),
    "proc": gpu_job(nvidia_proc="/proc/$(id)"),
    "isolation": gpu_job(isolation="none"),
    "negative": gpu_job(count=-1),
    "gpus-chosen-by-the-hub": batch.BatchJob(
        "lab", settings(gpus=objects.GpuAssignment(uuids=(UUID_2,), isolation="runtime"))
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_JOBS))
def test_hostile_or_impossible_jobs_are_refused(name):
    with pytest.raises(ClusterError):
        batch.render_script(HOSTILE_JOBS[name])


def test_sbatch_options_whole():
    req = batch.JobRequest(
        name="gpulab-alice--vision",
        mem_mb=8192,
        cpus=2,
        gpus=1,
        gpu_type="h200",
        partition="gpu",
        time_limit="8:00:00",
        output="/srv/gpulab/hub/slurm/%j.out",
    )
    assert batch.sbatch_args(req) == [
        "--parsable",
        "--export=NONE",
        "--no-requeue",
        "--job-name=gpulab-alice--vision",
        "--chdir=/",
        "--output=/srv/gpulab/hub/slurm/%j.out",
        "--cpus-per-task=2",
        "--mem=8192M",
        "--partition=gpu",
        "--time=8:00:00",
        "--gres=gpu:h200:1",
    ]
    assert "--gres=gpu:1" in batch.sbatch_args(replace(req, gpu_type=""))


@pytest.mark.parametrize(
    "change",
    [
        {"name": "--wrap=id"},
        {"partition": "gpu,debug"},
        {"partition": "gpu --wrap=id"},
        {"time_limit": "1; id"},
        {"gpu_type": "h200:2"},
        {"gpus": 0, "gpu_type": "h200"},
        {"mem_mb": 0},
        {"cpus": True},
        {"output": "/srv/../etc/x"},
        {"output": "relative.out"},
    ],
)
def test_hostile_sbatch_requests_are_refused(change):
    req = batch.JobRequest(name="gpulab-alice--vision", mem_mb=1024, gpus=1)
    with pytest.raises(ClusterError):
        batch.sbatch_args(replace(req, **change))


# --- the scripts run under bash with a recording docker ------------------------------

FAKE_DOCKER = """#!/bin/bash
# Records each call as a JSON line: its argv and, for run, the env file read from stdin.
log=@LOG@
if [ "$1" = run ]; then
  env_file=$(cat)
  python3 - "$env_file" "$@" >> "$log" <<'EOF'
import json, sys
print(json.dumps({"argv": sys.argv[2:], "env_file": sys.argv[1]}))
EOF
  exec sleep "${FAKE_RUN_SECONDS:-0}"
fi
python3 -c 'import json, sys; print(json.dumps({"argv": sys.argv[1:]}))' "$@" >> "$log"
if [ "$1" = ps ]; then echo c0ffee; fi
exit "${FAKE_EXIT:-0}"
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
def gpu_node(tmp_path):
    """Node "gpu-02" with device nodes nvidia3 and nvidia2 (GRES order) and the driver's
    information files: Slurm's index 1 is nvidia2, minor 2, UUID_2."""
    dev = tmp_path / "dev"
    proc = tmp_path / "proc"
    dev.mkdir()
    for minor, uuid in ((3, UUID_3), (2, UUID_2), (1, "GPU-11111111-decoy")):
        os.mknod(dev / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))
        info = proc / f"0000:0{minor}:00.0" / "information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Model: \t\t NVIDIA H200\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n")
    nodes = (batch.NodeGpus("gpu-02", (str(dev / "nvidia3"), str(dev / "nvidia2"))),)
    return nodes, str(proc), str(dev)


def run_script(text: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", text], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
        text=True, timeout=20, **kw,
    )  # fmt: skip


def option_pairs(argv: list[str]) -> list[tuple[str, str]]:
    pairs = []
    it = iter(argv[1:])  # after "run"
    for flag in it:
        if not flag.startswith("-"):
            break
        if flag == "--rm":
            continue
        pairs.append((flag, next(it)))
    return sorted(pairs)


@pytest.mark.parametrize("isolation", ["runtime", "devices"])
def test_slurms_gpu_index_becomes_the_device_at_that_position(
    isolation, fake_docker, gpu_node, tmp_path
):
    docker, calls = fake_docker
    nodes, proc, dev = gpu_node
    gpus = batch.SlurmGpus(count=1, nodes=nodes, isolation=isolation, nvidia_proc=proc)
    job = batch.BatchJob("lab", settings(), gpus, docker=docker)
    env = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-02", "SLURM_JOB_GPUS": "1"}
    done = run_script(batch.render_script(job), env)
    assert done.returncode == 0, done.stderr
    (run,) = [c for c in calls() if c["argv"][0] == "run"]
    # What the one-machine spec gives a container holding GPU minor 2 (not minor 1,
    # not nvidia3 at index 0), with this job's labels.
    want_settings = settings(
        gpus=objects.GpuAssignment(uuids=(UUID_2,), minors=(2,), isolation=isolation),
        labels={**settings().labels, "gpulab.slurm.cluster": "lab", "gpulab.slurm.job": "42"},
    )
    want = run_args(objects.container_spec(want_settings))
    got_argv = [a.replace(f"{dev}/nvidia2:", "/dev/nvidia2:") for a in run["argv"]]
    pairs = option_pairs(got_argv)
    env_pairs = [v for f, v in pairs if f == "-e"]
    assert [p for p in pairs if p[0] not in ("-e", "--env-file")] == option_pairs(
        ["run", *want.options]
    )
    assert ("--env-file", "/dev/stdin") in pairs
    got_env = dict(line.split("=", 1) for line in run["env_file"].splitlines() if line)
    got_env.update(dict(e.split("=", 1) for e in env_pairs))
    assert got_env == want.env  # the token reached the container literally...
    assert not Path("/tmp/gpulab-pwned").exists()  # ...and no shell ran what it holds
    assert got_argv[-3:] == [want.image, *want.command]


@pytest.mark.parametrize(
    "env,words",
    [
        ({"SLURM_JOB_GPUS": "0,1"}, "Slurm gave this job GPUs '0,1', not 1"),
        ({"SLURM_JOB_GPUS": "5"}, "GPU index 5 is not in node gpu-02's GRES list"),
        ({"SLURM_JOB_GPUS": "$(id)"}, "GPU index $(id) is not in node gpu-02's GRES list"),
        ({"SLURMD_NODENAME": "gpu-09"}, "node gpu-09 is not in gpulab's list of GPU nodes"),
        ({"SLURM_JOB_ID": "4;id"}, "this script runs as a Slurm batch job"),
    ],
)
def test_a_gpu_the_script_cannot_place_fails_the_job_with_words(env, words, fake_docker, gpu_node):
    docker, calls = fake_docker
    nodes, proc, _ = gpu_node
    gpus = batch.SlurmGpus(count=1, nodes=nodes, nvidia_proc=proc)
    text = batch.render_script(batch.BatchJob("lab", settings(), gpus, docker=docker))
    base = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-02", "SLURM_JOB_GPUS": "1"}
    done = run_script(text, {**base, **env})
    assert done.returncode != 0
    assert words in done.stderr
    assert not [c for c in calls() if c["argv"][0] == "run"]


def test_term_trap_removes_the_container(fake_docker):
    docker, calls = fake_docker
    text = batch.render_script(batch.BatchJob("lab", settings(), docker=docker))
    proc = subprocess.Popen(
        ["bash", "-c", text],
        env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "FAKE_RUN_SECONDS": "30"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not any(c["argv"][0] == "run" for c in calls()) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.monotonic() - started < 5, "the trap waited for the container to end"
    assert proc.returncode == 143
    assert [c["argv"] for c in calls() if c["argv"][0] != "run"] == [
        ["ps", "-aq", "--filter", "label=gpulab.slurm.cluster=lab",
         "--filter", "label=gpulab.slurm.job=42"],
        ["rm", "-f", "c0ffee"],
    ]  # fmt: skip


def test_epilog_removes_the_jobs_containers_and_always_exits_0(fake_docker):
    docker, calls = fake_docker
    text = batch.render_epilog("lab", docker=docker)
    done = run_script(text, {"SLURM_JOB_ID": "42"})
    assert done.returncode == 0
    assert [c["argv"] for c in calls()] == [
        ["ps", "-aq", "--filter", "label=gpulab.slurm.cluster=lab",
         "--filter", "label=gpulab.slurm.job=42"],
        ["rm", "-f", "c0ffee"],
    ]  # fmt: skip
    assert run_script(text, {"SLURM_JOB_ID": "42", "FAKE_EXIT": "1"}).returncode == 0
    before = len(calls())
    assert run_script(text, {"SLURM_JOB_ID": "1;id"}).returncode == 0
    assert len(calls()) == before  # no job id, no docker call


# --- Slurm's output and its words ------------------------------------------------------

# squeue --format as slurm.SQUEUE_FORMAT, from a 22.05 cluster with every GPU taken.
SQUEUE = """\
13|PENDING|Resources|gpu|4294901747|gres:gpu:1||gpulab-a--one
14|PENDING|Priority|gpu|4294901746|gres:gpu:h200:1||gpulab-b--two
15|PENDING|Priority|gpu|4294901745|gres:gpu:1||gpulab-c--three
18|PENDING|Priority|gpu|4294901744|gres:gpu:1||gpulab-d--four
16|PENDING|JobHeldUser|gpu|0|gres:gpu:1||held
17|PENDING|Priority|gpu|4294901743|N/A||cpu-only
19|PENDING|ReqNodeNotAvail, UnavailableNodes:n1|gpu|4294901742|N/A||pinned
20|PENDING|PartitionDown|debug|4294901741|N/A||down
21|PENDING|JobHeldAdmin|gpu|0|N/A||admin-held
9|RUNNING|None|gpu|4294901751|gres:gpu:1|n1|gpulab-e--five
"""


def test_pending_reasons_in_the_users_words():
    queue = parse_squeue(SQUEUE)
    words = {job.id: status_of(job, queue).words for job in queue}
    assert words == {
        13: "waiting for a GPU: next in line",
        14: "waiting for a GPU: 1 job ahead",
        15: "waiting for a GPU: 2 jobs ahead",
        18: "waiting for a GPU: 3 jobs ahead",
        16: "held: it starts once released (scontrol release)",
        17: "waiting for resources: 4 jobs ahead",
        19: "waiting: the nodes it needs are down or drained",
        20: "the partition debug is down: it starts when the cluster's administrator brings it up",
        21: "held by the cluster's administrator",
        9: "running on node n1",
    }
    assert status_of(queue[0], queue).ahead == 0
    assert queue[1].wants_gpu and not queue[5].wants_gpu


@pytest.mark.parametrize(
    "line",
    [
        "13|PENDING|Resources|gpu|4294901747|gres:gpu:1|",  # a field short
        "13|WAITING|Resources|gpu|1|gres:gpu:1||x",  # no such state
        "13a|PENDING|Resources|gpu|1|gres:gpu:1||x",
        "13|PENDING|Resources|gpu|high|gres:gpu:1||x",
        "13|RUNNING|None|gpu|1|gres:gpu:1|n1;id|x",
    ],
)
def test_squeue_lines_are_read_strictly(line):
    with pytest.raises(ClusterError):
        parse_squeue(line)


def test_sinfo_submitted_ids_and_refusals():
    nodes = parse_sinfo(
        "n1|idle|gpu:h200:1|10.0.0.11|none\nn2|down|gpu:h200:2|n2.lab|Not responding\n"
        "n1|idle|gpu:h200:1|10.0.0.11|none\nn3|idle*|gpu:h200:2,gpu:a100:4(S:0,1)|n3|a|b\n"
        "n4|mixed|(null)|10.0.0.14|none\n"
    )
    assert [(n.name, n.state, n.flag, n.gres, n.address) for n in nodes] == [
        ("n1", "idle", "", "gpu:h200:1", "10.0.0.11"),
        ("n2", "down", "", "gpu:h200:2", "n2.lab"),
        ("n3", "idle", "*", "gpu:h200:2,gpu:a100:4(S:0,1)", "n3"),
        ("n4", "mixed", "", "(null)", "10.0.0.14"),
    ]
    assert nodes[2].reason == "a|b"  # the reason is free text, the last field
    assert [n.gpus() for n in nodes] == [1, 2, 6, 0]
    assert [n.gpus("a100") for n in nodes] == [0, 0, 4, 0]
    assert [n.usable for n in nodes] == [True, False, False, True]
    with pytest.raises(ClusterError):
        parse_sinfo("n1;id|idle|gpu|10.0.0.1|none")
    with pytest.raises(ClusterError):
        parse_sinfo("n1|idle|gpu|10.0.0.1;id|none")
    assert parse_submitted("123\n") == 123
    assert parse_submitted("124;lab\n") == 124
    with pytest.raises(ClusterError):
        parse_submitted("sbatch: error: ...")
    assert submit_error(
        "sbatch: error: Batch job submission failed: Requested node configuration is not "
        "available\n"
    ) == (
        "The cluster refused the project's job: no node of the cluster has what this project "
        "asks for (its GPUs, memory or CPUs) (Slurm: sbatch: error: Batch job submission "
        "failed: Requested node configuration is not available)"
    )


def test_the_client_runs_argument_lists_with_only_slurms_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTERHUB_CRYPT_KEY", "hub-secret")
    seen = []
    # Slurm's commands where the client looks for them (a machine without Slurm too):
    # stand-ins that are never run, the runner below answers.
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 99\n")
    (bin_dir / "sbatch").chmod(0o755)

    def run(argv, **kw):
        seen.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, stdout="77;lab\n", stderr="")

    client = Slurm(conf="/etc/slurm-lab/slurm.conf", path=str(bin_dir), run=run)
    assert client.submit("#!/bin/bash\ntrue\n", ["--parsable", "--mem=64M"]) == 77
    (argv, kw) = seen[0]
    assert argv == [str(bin_dir / "sbatch"), "--parsable", "--mem=64M"]
    assert kw["input"] == "#!/bin/bash\ntrue\n"
    assert kw["env"] == {
        "PATH": str(bin_dir),
        "LC_ALL": "C.UTF-8",
        "SLURM_CONF": "/etc/slurm-lab/slurm.conf",
    }
    with pytest.raises(ClusterError):
        client.cancel(77, signal="KILL;id")
    with pytest.raises(ClusterError, match="not installed"):
        Slurm(path="/nonexistent", run=run).submit("", [])

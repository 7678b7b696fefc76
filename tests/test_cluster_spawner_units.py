"""The Slurm spawner's parts that need no cluster (a recording runner stands in for
Slurm's commands, a fake engine for Docker's push): the job's output as the hub reads
it, the wait from the queue to a published port, the push and its digest, the GPUs a
project may ask for, poll, stop and the spawner's state. A real hub on a real cluster:
tests/test_cluster_spawner.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from types import SimpleNamespace

import pytest
from jupyterhub.objects import Hub

from gpulab_hub.cluster import ClusterError, registry, slurm, watch
from gpulab_hub.cluster import spawner as cluster_spawner
from gpulab_hub.cluster.joblog import JobLog, Ready, parse
from gpulab_hub.cluster.spawner import ProjectSlurmSpawner
from gpulab_hub.projects.options import OptionsError

# --- the job's output ---------------------------------------------------------------


@pytest.mark.parametrize(
    "line,kind,text",
    [
        ("gpulab-ready 10.0.0.12:49153", "ready", "gpulab-ready 10.0.0.12:49153"),
        ("gpulab-progress: Fetching the project's image on node n1", "progress",
         "Fetching the project's image on node n1"),
        ("gpulab: node n1 could not fetch the image", "failure",
         "node n1 could not fetch the image"),
        ("gpulab:   Traceback (most recent call last):", "failure",
         "  Traceback (most recent call last):"),
        ("gpulab-ready 10.0.0.12:99999", "other", "gpulab-ready 10.0.0.12:99999"),
        ("gpulab-ready 10.0.0.12:80 and more", "other", "gpulab-ready 10.0.0.12:80 and more"),
        ("gpulab-ready 999.0.0.1:80", "other", "gpulab-ready 999.0.0.1:80"),
        (" gpulab-ready 10.0.0.12:80", "other", "gpulab-ready 10.0.0.12:80"),
        ("gpulab-ready 10.0.0.12:80\x1b[2J", "ready", "gpulab-ready 10.0.0.12:80"),
    ],
)  # fmt: skip
def test_each_line_of_the_jobs_output_is_taken_by_full_match(line, kind, text):
    said = parse(line)
    assert (said.kind, said.text.strip() if kind == "other" else said.text) == (kind, text)
    assert (said.ready is not None) == (kind == "ready")


def test_the_output_is_read_as_it_grows_bounded_and_never_through_a_link(tmp_path):
    path = tmp_path / "job.log"
    log = JobLog(path, limit=200)
    assert log.read() == []  # not written yet
    path.write_text("gpulab-progress: one\ngpulab-pro")
    assert [s.text for s in log.read()] == ["one"]
    with open(path, "a") as f:
        f.write("gress: two\n" + "x" * 500 + "\n")
    said = log.read()
    assert [s.text for s in said][0] == "two" and log.offset == 200
    assert log.read() == []  # the limit: nothing more, however much is written
    path.unlink()
    os.symlink("/etc/passwd", path)
    with pytest.raises(ClusterError, match="is a link"):
        JobLog(path).read()
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ClusterError, match="not a regular file"):
        JobLog(path).read()


# --- from the queue to a published port, with a recording runner ----------------------

JOB = 17
RUNNING = f"{JOB}|RUNNING|None|gpu|4294901750|gres:gpu:h200:1|n2|gpulab-alice--one"
DONE = f"{JOB}|FAILED|NonZeroExitCode|gpu|4294901750|gres:gpu:h200:1|n2|gpulab-alice--one"


def pending(reason: str) -> str:
    return f"{JOB}|PENDING|{reason}|gpu|4294901750|gres:gpu:h200:1||gpulab-alice--one"


OTHER = "12|PENDING|Resources|gpu|4294901760|gres:gpu:1||gpulab-bob--first"


class Squeue:
    """A recording runner for Slurm's commands: each ``squeue --jobs`` call moves to the
    next tick of the script (the job's line, and the queue's lines after it)."""

    def __init__(self, ticks: list[tuple[str | None, str]], on_tick=None):
        self.ticks, self.tick, self.on_tick = ticks, -1, on_tick or (lambda t: None)
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, argv, **kw):
        self.calls.append((argv, kw))
        name = os.path.basename(argv[0])
        if name == "scancel":
            return subprocess.CompletedProcess(argv, 0, "", "")
        if any(a.startswith("--jobs=") for a in argv):
            self.tick = min(self.tick + 1, len(self.ticks) - 1)
            self.on_tick(self.tick)
            line = self.ticks[self.tick][0]
            if line is None:
                return subprocess.CompletedProcess(argv, 1, "", "Invalid job id specified")
            return subprocess.CompletedProcess(argv, 0, line + "\n", "")
        return subprocess.CompletedProcess(argv, 0, self.ticks[self.tick][1], "")


def run_watch(ticks, tmp_path, lines_at=None, timeout=600.0, addresses=None):
    """wait_ready against the ticks; ``lines_at``: tick -> lines the script writes then."""
    log_path = tmp_path / "job.log"

    def on_tick(tick):
        for line in (lines_at or {}).get(tick, []):
            with open(log_path, "a") as f:
                f.write(line + "\n")

    runner = Squeue(ticks, on_tick)
    client = slurm.Slurm(conf="/etc/slurm-lab/slurm.conf", path="/usr/bin:/bin", run=runner)
    client.command = lambda name: f"/usr/bin/{name}"
    events = []
    now = [0.0]

    async def run(fn, *args):
        return fn(*args)

    async def sleep(seconds):
        now[0] += seconds

    def emit(progress, message, note=False):
        events.append((message, note))

    async def go():
        return await watch.wait_ready(
            client, JOB, JobLog(log_path), addresses or {"n1": "10.0.0.11", "n2": "10.0.0.12"},
            project="one", emit=emit, run=run, queue_timeout=timeout, every=1.0,
            clock=lambda: now[0], sleep=sleep,
        )  # fmt: skip

    try:
        return asyncio.run(go()), events, runner
    except ClusterError as e:
        e.events = events
        raise


def test_the_queues_words_then_the_scripts_progress_then_the_address(tmp_path):
    ticks = [
        (pending("Priority"), f"{OTHER}\n{pending('Priority')}\n"),
        (pending("Priority"), f"{OTHER}\n{pending('Priority')}\n"),
        (pending("Resources"), f"{pending('Resources')}\n"),
        (RUNNING, ""),
        (RUNNING, ""),
    ]
    lines = {3: ["gpulab-progress: Fetching the project's image on node n2"],
             4: ["gpulab-progress: Starting the project's container on node n2",
                 "gpulab-ready 10.0.0.12:49153"]}  # fmt: skip
    ready, events, runner = run_watch(ticks, tmp_path, lines)
    assert ready == Ready("10.0.0.12", 49153)
    assert events == [
        (f"In the cluster's queue (Slurm job {JOB}): waiting for a GPU: 1 job ahead", True),
        (f"In the cluster's queue (Slurm job {JOB}): waiting for a GPU: next in line", True),
        ("Running on node n2 (after 3 s in the cluster's queue)", True),
        ("Fetching the project's image on node n2", False),
        ("Starting the project's container on node n2", False),
    ]
    # Only Slurm's own environment reached its commands, and argument lists only.
    for argv, kw in runner.calls:
        assert isinstance(argv, list) and argv[0].startswith("/usr/bin/")
        assert kw["env"] == {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8",
                             "SLURM_CONF": "/etc/slurm-lab/slurm.conf"}  # fmt: skip


def test_a_job_that_ends_before_ready_fails_with_the_scripts_words(tmp_path):
    lines = {1: ["gpulab-progress: Starting the project's container on node n2",
                 "gpulab: the project's container on node n2 stopped before it was ready;"
                 " its last lines:",
                 "gpulab:   ModuleNotFoundError: No module named 'jupyterhub'",
                 "gpulab-ready 10.0.0.12:1"]}  # fmt: skip
    # The ready line came after the job ended (Slurm says FAILED): not taken.
    with pytest.raises(watch.JobFailed) as failed:
        run_watch([(RUNNING, ""), (DONE, "")], tmp_path, lines)
    assert str(failed.value) == (
        f"Project one's job on the cluster (Slurm job {JOB}) failed before the project was "
        "ready: the project's container on node n2 stopped before it was ready; its last lines:"
    )
    assert failed.value.lines == ("ModuleNotFoundError: No module named 'jupyterhub'",)


def test_a_job_slurm_forgot_fails_and_says_so(tmp_path):
    with pytest.raises(watch.JobFailed, match="is gone from the cluster's queue before"):
        run_watch([(pending("Resources"), ""), (None, "")], tmp_path)


def test_a_job_that_waits_too_long_is_given_up_with_the_reason(tmp_path):
    with pytest.raises(watch.JobFailed) as failed:
        run_watch([(pending("Resources"), f"{pending('Resources')}\n")], tmp_path, timeout=120)
    assert str(failed.value) == (
        "The cluster had no room for project one within 2 minutes (Slurm job 17: waiting "
        "for a GPU: next in line), so its job was cancelled. Start it again later, or with "
        "fewer GPUs."
    )


def test_an_address_that_is_not_the_nodes_is_refused(tmp_path):
    lines = {0: ["gpulab-ready 10.0.0.11:49153"]}  # n1's address; Slurm runs it on n2
    with pytest.raises(ClusterError, match="not the cluster address of node n2"):
        run_watch([(RUNNING, "")], tmp_path, lines)


# --- the push and its digest -----------------------------------------------------------

DIGEST = "sha256:" + "c" * 64


def fake_engine(events):
    calls = []

    def call(method, *args, **kw):
        calls.append((method, args, kw))
        return iter(events) if method == "push" else None

    return call, calls


def test_the_push_tags_into_the_registry_and_returns_the_digest():
    events = [
        {"status": "Preparing", "id": "l1"},
        {"status": "Pushing", "id": "l1", "progressDetail": {"current": 5_000_000,
                                                              "total": 20_000_000}},
        {"status": "Layer already exists", "id": "l2", "progressDetail": {}},
        {"status": "Pushed", "id": "l1", "progressDetail": {}},
        {"status": "0123: digest: ...", "aux": {"Tag": "0123", "Digest": DIGEST, "Size": 9}},
    ]  # fmt: skip
    call, calls = fake_engine(events)
    shown = []
    progress = registry.PushProgress(shown.append, every=0.0)
    digest = registry.push(call, "gpulab/project:0123", "127.0.0.1:5000", progress)
    assert digest == DIGEST
    assert calls[0] == ("tag", ("gpulab/project:0123", "127.0.0.1:5000/gpulab/project"),
                        {"tag": "0123"})  # fmt: skip
    assert calls[1][0] == "push" and calls[1][2] == {"tag": "0123", "stream": True,
                                                      "decode": True}  # fmt: skip
    assert shown[0] == "Sending the image to the cluster's registry: 5 of 20 MB"
    assert shown[-1] == "Sending the image to the cluster's registry: 20 of 20 MB"
    assert registry.node_reference("10.0.0.1:5001", "gpulab/project:0123", digest) == (
        f"10.0.0.1:5001/gpulab/project@{DIGEST}"
    )


@pytest.mark.parametrize(
    "events,words",
    [
        ([{"error": "denied: requested access to the resource is denied"}],
         "did not take the project's image: denied"),
        ([{"status": "Pushed", "id": "l1"}], "gave no digest"),
        ([{"aux": {"Digest": "sha256:../../etc"}}], "gave no digest"),
    ],
)  # fmt: skip
def test_a_push_the_registry_refuses_says_so(events, words):
    call, _ = fake_engine(events)
    with pytest.raises(ClusterError, match=words):
        registry.push(call, "gpulab/project:0123", "127.0.0.1:5000", lambda e: None)


@pytest.mark.parametrize("value", ["", "host:5000/evil", "-x:1", "a b:1", "host:5000;id", ".."])
def test_hostile_registry_names_are_refused(value):
    with pytest.raises(ClusterError):
        registry.push(fake_engine([])[0], "gpulab/project:0123", value, lambda e: None)


# --- the spawner: GPUs from sinfo, poll, stop, state, the hub's address ----------------

SINFO = "n1|idle|gpu:h200:1|10.0.0.11|none\nn2|mixed|gpu:h200:2|10.0.0.12|none\n"
SINFO += "n3|down*|gpu:h200:8|10.0.0.13|Not responding\n"


def spawner_of(user: str, project: str, hub_ip: str = "10.0.0.1") -> ProjectSlurmSpawner:
    hub = Hub(ip=hub_ip, port=8081, base_url="/hub/")
    orm = SimpleNamespace(name=project, display_name="", state={}, server=None)
    return ProjectSlurmSpawner(hub=hub, user=SimpleNamespace(name=user), orm_spawner=orm)


@pytest.fixture
def slurm_spawner(monkeypatch):
    """A spawner whose Slurm commands go to a recording runner (``answers``: command ->
    (returncode, stdout, stderr), a list for a sequence)."""
    answers: dict = {"sinfo": (0, SINFO, "")}
    calls = []

    def run(argv, **kw):
        name = os.path.basename(argv[0])
        calls.append([name, *argv[1:]])
        answer = answers[name]
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        return subprocess.CompletedProcess(argv, *answer)

    def make(conf="", path=slurm.DEFAULT_PATH, **kw):
        client = slurm.Slurm(conf=conf, path=path, run=run)
        client.command = lambda name: f"/usr/bin/{name}"
        return client

    monkeypatch.setattr(cluster_spawner, "Slurm", make)
    cluster_spawner._nodes_cache.clear()
    sp = spawner_of("alice", "one")
    sp.node_gpus = {"n1": ["/dev/nvidia0"], "n2": ["/dev/nvidia1", "/dev/nvidia0"]}
    return sp, answers, calls


def test_the_spawn_form_offers_the_gpus_a_node_that_takes_jobs_has(slurm_spawner):
    sp, _, _ = slurm_spawner
    choices = sp.gpu_choices()  # n3 (down) has 8: not counted
    assert (choices.max_count, choices.default_count) == (2, 1)
    sp.gpu_max_per_project = 1
    assert sp.gpu_choices().max_count == 1
    assert sp._gpu_request({}) == (1, "")
    assert sp._gpu_request({"gpus": 0}) == (0, "")
    sp.gpu_type = "h200"
    assert sp._gpu_request({"gpus": 1}) == (1, "h200")
    with pytest.raises(OptionsError, match="asks for 2 h200 GPU"):
        sp._gpu_request({"gpus": 2})
    with pytest.raises(OptionsError, match="not one this hub offers"):
        sp._gpu_request({"gpu_type": "a100"})
    with pytest.raises(OptionsError, match="MIG slices"):
        sp._gpu_request({"mig_profile": "1g.10gb"})
    sp.node_gpus = {}
    with pytest.raises(ClusterError, match="node_gpus"):
        sp._gpu_request({"gpus": 1})


def test_poll_follows_the_job_and_stop_cancels_and_waits(slurm_spawner):
    sp, answers, calls = slurm_spawner
    assert asyncio.run(sp.poll()) == 0  # no job: not running

    def state(s):
        return (0, f"{JOB}|{s}|None|gpu|1|N/A|n1|gpulab-alice--one\n", "")

    sp.load_state({"slurm_job": JOB})
    for squeue, want in [
        (state("RUNNING"), None), (state("PENDING"), None), (state("COMPLETED"), 0),
        (state("FAILED"), 1), ((1, "", "slurm_load_jobs error: Invalid job id specified"), 0),
        ((1, "", "Unable to contact slurm controller"), None),
    ]:  # fmt: skip
        answers["squeue"] = squeue
        assert asyncio.run(sp.poll()) == want, squeue

    answers["scancel"] = (0, "", "")
    answers["squeue"] = [state("RUNNING"), state("COMPLETING"), state("CANCELLED")]
    calls.clear()
    asyncio.run(sp.stop())
    assert [c[0] for c in calls] == ["scancel", "squeue", "squeue", "squeue"]
    assert calls[0] == ["scancel", str(JOB)]
    assert sp.job_id is None and "slurm_job" not in sp.get_state()


@pytest.mark.parametrize("value", ["17;id", True, -3, 10**13, None, 1.5])
def test_a_state_the_hub_cannot_trust_is_not_a_job(value):
    sp = spawner_of("alice", "one")
    sp.load_state({"slurm_job": value})
    assert sp.job_id is None


def test_containers_reach_the_hub_at_its_cluster_address():
    sp = spawner_of("alice", "one")
    assert sp._hub_url_for_nodes() == "http://10.0.0.1:8081"
    sp.hub_address_for_nodes = "10.1.0.1"
    assert sp._hub_url_for_nodes() == "http://10.1.0.1:8081"
    sp.hub_address_for_nodes = "head.lab:9000"
    assert sp._hub_url_for_nodes() == "http://head.lab:9000"
    sp.hub_address_for_nodes = "head/evil:1"
    with pytest.raises(ClusterError):
        sp._hub_url_for_nodes()
    local = spawner_of("alice", "one", hub_ip="127.0.0.1")
    with pytest.raises(ClusterError, match="set GPULAB_HUB_IP to this machine's address"):
        local._hub_url_for_nodes()

"""Jobs of a project on the cluster, in the project's container (no cluster, no hub:
about 1 s): ``%gpu_job run --nodes N --gpus-per-node G`` goes to the hub's API (a
stand-in here) with a folder made first; the job's state comes from the hub while it
waits or runs ("waiting for a GPU: next in line") and from the nodes' results once it
ended ("succeeded", "exit code 1 on node 1", a failed image pull in the hub's words, a
stop); every node's output shows in its logs; a refused job leaves no folder; the
requests a multi-node job cannot be are refused in words; on one machine --nodes is
refused with a sentence; the node wrapper writes the node's log and result, never
through a link.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulab_jupyter.jobs import cli
from gpulab_jupyter.jobs.cluster import ClusterEngine, NotFound
from gpulab_jupyter.jobs.local import ONE_MACHINE, LocalEngine
from gpulab_jupyter.jobs.model import JobError, JobRequest
from gpulab_jupyter.magics.job import gpu_job

REPO = Path(__file__).resolve().parents[1]
JOB = "20261123-141502-a1b2"


# --- the container side: the engine against a stand-in hub ---------------------------


class FakeHub:
    def __init__(self):
        self.views: dict[str, dict] = {}
        self.asked: list[tuple] = []

    def submit(self, body):
        self.asked.append(("submit", body))
        view = {"id": body["id"], "slurm_job": 7, "state": "PENDING", "ended": None,
                "words": "waiting for a GPU: next in line", "progress": "",
                "stop_requested": False, "failure": []}  # fmt: skip
        self.views[body["id"]] = view
        return view

    def jobs(self):
        return list(self.views.values())

    def job(self, job_id):
        if job_id not in self.views:
            raise NotFound("No such job in this project.")
        return self.views[job_id]

    def stop(self, job_id):
        self.asked.append(("stop", job_id))
        self.views[job_id].update(state="CANCELLED", ended=time.time(), stop_requested=True)
        return self.views[job_id]


@pytest.fixture
def cluster_project(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    hub = FakeHub()
    return ClusterEngine(tmp_path, hub=hub), hub, tmp_path


def test_gpu_job_run_with_nodes_goes_to_the_hub_and_reads_back_each_node(cluster_project, capsys):
    engine, hub, project = cluster_project
    gpu_job("run --nodes 2 --gpus-per-node 1 train.py --epochs 3", engine=engine)
    ((_, body),) = hub.asked
    job_id = body["id"]
    assert body == {"id": job_id, "script": "train.py", "args": ["--epochs", "3"], "nodes": 2,
                    "gpus_per_node": 1}  # fmt: skip
    record = engine.status(job_id)
    assert (record.state, record.message) == ("starting", "waiting for a GPU: next in line")
    assert "--nodes 2 --gpus-per-node 1" in cli.describe(record)
    # It runs; the nodes write their output, then their results.
    hub.views[job_id].update(state="RUNNING", words="running on node gpu-0[1-2]")
    folder = project / "jobs" / job_id
    (folder / "output.log").write_text("rank 0: world size 2\n")
    (folder / "output-node1.log").write_text("rank 1: world size 2\n")
    assert engine.status(job_id).state == "running"
    assert engine.stream(job_id) == "rank 0: world size 2\n"  # following: only grows
    for rank in (0, 1):
        (folder / f"node-{rank}.json").write_text(json.dumps({"exit_code": 0, "ended": 5.0}))
    hub.views[job_id].update(state="COMPLETED", ended=6.0, words="ended")
    done = engine.status(job_id)
    assert (done.state, done.exit_code, done.message) == ("succeeded", 0, "finished on 2 nodes")
    assert json.loads((folder / "result.json").read_text())["state"] == "succeeded"
    logs = engine.logs(job_id)
    assert logs == (
        "rank 0: world size 2\n"
        f"\n[gpulab-job] ----- node 1 (jobs/{job_id}/output-node1.log) -----\n"
        "rank 1: world size 2\n"
    )
    del hub.views[job_id]  # Slurm and the hub forgot it: result.json remembers
    assert [r.state for r in engine.list()] == ["succeeded"]


def test_a_failed_node_a_failed_pull_and_a_stop(cluster_project):
    engine, hub, project = cluster_project
    req = JobRequest("train.py", nodes=2)
    a = engine.start(req)
    (project / "jobs" / a.id / "node-1.json").write_text(json.dumps({"exit_code": 1}))
    hub.views[a.id].update(state="FAILED", ended=3.0, words="failed")
    assert (engine.status(a.id).state, engine.status(a.id).message) == (
        "failed", "exit code 1 on node 1",
    )  # fmt: skip
    b = engine.start(req)
    hub.views[b.id].update(
        state="FAILED", ended=3.0, words="failed",
        failure=["node gpu-02 could not fetch the project's image from the cluster's registry"],
    )  # fmt: skip
    failed = engine.status(b.id)
    assert failed.message.startswith("node gpu-02 could not fetch the project's image")
    assert "[gpulab-job] gpulab: node gpu-02 could not fetch" in engine.logs(b.id)
    c = engine.start(req)
    stopped = engine.stop(c.id)
    assert (stopped.state, stopped.message) == ("stopped", "stopped by its user")
    assert ("stop", c.id) in hub.asked


def test_a_refused_job_leaves_no_folder_and_says_why(cluster_project):
    engine, hub, project = cluster_project

    def refuse(body):
        raise JobError("--nodes 9: a job on this cluster may use at most 4 nodes")

    hub.submit = refuse
    with pytest.raises(JobError, match="at most 4 nodes"):
        engine.start(JobRequest("train.py", nodes=9))
    assert list((project / "jobs").iterdir()) == []


@pytest.mark.parametrize(
    "words,message",
    [
        ("run --gpus-per-node 2 train.py", "--gpus-per-node goes with --nodes"),
        ("run --nodes 2 --gpus all train.py", "say the GPUs of each node with --gpus-per-node"),
        ("run --nodes 2 analysis.ipynb", "not a notebook"),
        ("run --nodes 2 --precision auto train.py", "--precision is not offered"),
        ("run --nodes 100 train.py", "--nodes must be a whole number from 1 to 99"),
    ],
)
def test_gpu_job_refuses_what_a_multi_node_job_cannot_be(words, message, cluster_project):
    engine, _, project = cluster_project
    (project / "analysis.ipynb").write_text("{}")
    with pytest.raises(JobError, match=message):
        gpu_job(words, engine=engine)


def test_on_one_machine_nodes_is_refused_with_a_sentence(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(JobError) as e:
        gpu_job("run --nodes 2 --gpus-per-node 1 train.py", engine=LocalEngine(tmp_path))
    assert str(e.value) == ONE_MACHINE
    assert not (tmp_path / "jobs").exists() or not list((tmp_path / "jobs").iterdir())


def test_the_node_wrapper_writes_the_nodes_log_and_result(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "extensions"), GPULAB_PROJECT_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "gpulab_jupyter.jobs.node", "--job", JOB, "--rank", "1",
         "--nodes", "2", "--", sys.executable, "-c", "import sys; print('hello'); sys.exit(3)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    folder = tmp_path / "jobs" / JOB
    log = (folder / "output-node1.log").read_text().splitlines()
    assert log[0].endswith(f"starting: {sys.executable} -c import sys; print('hello'); sys.exit(3)")
    assert "node 1 of 2" in log[0] and log[1] == "hello"
    assert log[2].endswith("failed: exit code 3")
    assert json.loads((folder / "node-1.json").read_text())["exit_code"] == 3
    # A link in the job's place is never written through.
    other = tmp_path / "elsewhere"
    other.mkdir()
    job2 = "20261123-141502-zzzz"
    (tmp_path / "jobs" / job2).symlink_to(other)
    done = subprocess.run(
        [sys.executable, "-m", "gpulab_jupyter.jobs.node", "--job", job2, "--rank", "0",
         "--nodes", "1", "--", "true"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "not a folder gpulab writes into" in done.stderr
    assert list(other.iterdir()) == []

"""Jobs in a project folder, run by real processes (no container needed): a job
outlives whatever started it, streams its output, can be stopped and re-run, and a
job whose container went away reads as lost. Hostile names and links are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpulab_jupyter.handlers import job_of
from gpulab_jupyter.jobs import cli, launch
from gpulab_jupyter.jobs.local import LocalEngine, running_supervisors
from gpulab_jupyter.jobs.model import JobError, JobRequest

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO / "extensions"))


def wait_for(what, timeout: float = 30.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "count.py").write_text(
        textwrap.dedent(
            """
            import sys, time
            n = int(sys.argv[1])
            for i in range(n):
                print(f"step {i}", flush=True)
                time.sleep(0.2)
            print("done")
            """
        )
    )
    (tmp_path / "forever.py").write_text(
        "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.2)\n"
    )
    return tmp_path


def test_a_job_outlives_the_kernel_that_started_it(project):
    # The "kernel": a process that starts the job and exits at once.
    starter = textwrap.dedent(
        f"""
        from gpulab_jupyter.jobs.local import LocalEngine
        from gpulab_jupyter.jobs.model import JobRequest
        r = LocalEngine({str(project)!r}).start(JobRequest("count.py", ("15",)))
        print(r.id, r.state)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", starter], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    job_id, state = done.stdout.split()
    assert state == "running"
    engine = LocalEngine(project)
    # The starter is gone; the job goes on and its output streams to the log.
    assert wait_for(lambda: "step 3" in engine.logs(job_id))
    assert engine.status(job_id).state == "running"
    record = wait_for(lambda: (r := engine.status(job_id)).state == "succeeded" and r)
    assert record, engine.logs(job_id)
    assert record.exit_code == 0 and record.elapsed >= 2.5
    log = (project / "jobs" / job_id / "output.log").read_text()
    assert "step 14" in log and "done" in log and "succeeded: finished" in log
    assert [r.id for r in engine.list()] == [job_id]


def test_stop_ends_the_job_and_its_processes(project):
    engine = LocalEngine(project)
    record = engine.start(JobRequest("forever.py", name="endless"))
    state = json.loads((project / "jobs" / record.id / "state.json").read_text())
    assert wait_for(lambda: "tick" in engine.logs(record.id))
    # The GPU process list names the job of a process whose ancestor is its supervisor.
    supervisors = running_supervisors(engine)
    assert supervisors == {state["pid"]: record.id}
    stat = Path(f"/proc/{state['child']}/stat").read_text()
    parent = int(stat.rsplit(")", 1)[1].split()[1])
    assert job_of(state["child"], [parent, 1], supervisors) == record.id
    assert job_of(os.getpid(), [os.getppid(), 1], supervisors) is None
    stopped = engine.stop(record.id)
    assert stopped.state == "stopped" and "stopped by its user" in stopped.message
    assert wait_for(lambda: not alive(state["child"]), timeout=10)
    # Re-run: the same request, a new job.
    again = engine.rerun(record.id)
    assert again.id != record.id and again.request["name"] == "endless"
    assert engine.stop(again.id).state == "stopped"
    assert running_supervisors(engine) == {}


def test_a_job_whose_container_went_away_reads_as_lost(project):
    engine = LocalEngine(project)
    record = engine.start(JobRequest("forever.py"))
    state = json.loads((project / "jobs" / record.id / "state.json").read_text())
    # What a container stop does to it: everything killed, no result written.
    os.killpg(state["child"], signal.SIGKILL)
    os.kill(state["pid"], signal.SIGKILL)
    lost = wait_for(lambda: (r := engine.status(record.id)).state == "lost" and r, timeout=10)
    assert lost and "stopped or restarted" in lost.message


def test_a_notebook_job_writes_its_executed_copy_next_to_it(project):
    nb = {
        "cells": [
            {"cell_type": "code", "id": "a1", "metadata": {}, "outputs": [],
             "execution_count": None, "source": "print(6 * 7)"},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip
    (project / "nb").mkdir()
    (project / "nb" / "report.ipynb").write_text(json.dumps(nb))
    engine = LocalEngine(project)
    record = engine.start(JobRequest("nb/report.ipynb"))
    assert record.output == f"nb/report.job-{record.id}.ipynb"
    done = wait_for(lambda: (r := engine.status(record.id)).state in ("succeeded", "failed") and r,
                    timeout=120)  # fmt: skip
    assert done and done.state == "succeeded", engine.logs(record.id)
    executed = json.loads((project / record.output).read_text())
    assert "".join(executed["cells"][0]["outputs"][0]["text"]) == "42\n"
    assert json.loads((project / "nb" / "report.ipynb").read_text()) == nb  # untouched


def test_hostile_names_and_links_are_refused(project, tmp_path_factory):
    engine = LocalEngine(project)
    outside = tmp_path_factory.mktemp("outside") / "evil.py"
    outside.write_text("print('escaped')")
    (project / "link.py").symlink_to(outside)
    for target, words in [
        ("../evil.py", "not inside the project"),
        ("link.py", "not inside the project"),
        ("missing.py", "no such file"),
        ("run.sh", r"a Python script \(\.py\) or a notebook"),
    ]:
        with pytest.raises(JobError, match=words):
            engine.start(JobRequest(target))
    for bad in ("../../etc", "20261123-141502-a1b2/../x", "x"):
        with pytest.raises(JobError, match="not a job id"):
            engine.status(bad)
    with pytest.raises(JobError, match="--gpus must be"):
        engine.start(JobRequest("count.py", gpus="all; rm -rf /"))
    with pytest.raises(JobError, match="holds no GPU"):
        LocalEngine(project, machine=launch.Machine((), 4)).start(
            JobRequest("count.py", gpus="all")
        )
    assert not (project / "jobs").exists() or not list((project / "jobs").iterdir())


def test_multi_gpu_launch_is_torchrun_with_the_projects_gpus():
    two_h100 = launch.Machine(capabilities=((9, 0), (9, 0)), cpus=16)
    req = JobRequest("train.py", ("--epochs", "3"), gpus="all", precision="auto")
    argv = launch.command(req, two_h100, "/py")
    assert argv == [
        "/py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "train.py", "--epochs", "3",
    ]  # fmt: skip
    env = launch.environment(req, two_h100, {"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["OMP_NUM_THREADS"] == "8"
    assert env["GPULAB_PRECISION"] == "bf16" and env["PATH"] == "/bin"
    turing_and_ampere = launch.Machine(capabilities=((7, 5), (8, 6)), cpus=4)
    assert launch.environment(req, turing_and_ampere, {})["GPULAB_PRECISION"] == "fp16"
    assert launch.precision_for(()) == "fp32"
    one = JobRequest("train.py", gpus="1")
    assert launch.command(one, two_h100, "/py")[4] == "--nproc-per-node=1"
    with pytest.raises(JobError, match="holds 2 GPU"):
        launch.command(JobRequest("train.py", gpus="4"), two_h100, "/py")


def test_a_cpu_project_asking_for_auto_precision_gets_fp32_quietly(project, capfd):
    engine = LocalEngine(project)
    record = engine.start(JobRequest("count.py", ("1",), precision="auto"))
    assert wait_for(lambda: engine.status(record.id).state == "succeeded")
    assert "FATAL" not in capfd.readouterr().err


def test_the_terminal_command(project, capsys):
    engine = LocalEngine(project)
    assert cli.main(["run", "--follow", "count.py", "3"], engine=engine) == 0
    out = capsys.readouterr().out
    assert "Started job" in out and "step 2" in out and "succeeded" in out
    assert cli.main(["list"], engine=engine) == 0
    assert "succeeded" in capsys.readouterr().out
    assert cli.main(["logs", "nope"], engine=engine) == 2
    assert "not a job id" in capsys.readouterr().err


def test_gpu_job_magic_in_a_kernel_that_then_dies(project):
    """%gpu_job in a real IPython kernel; the kernel is shut down, the job goes on."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(
        kernel_name="python3", env=dict(ENV, GPULAB_PROJECT_DIR=str(project)), cwd=str(project)
    )
    try:
        outputs = []
        kc.execute_interactive(
            "%load_ext gpulab_jupyter.magics\n%gpu_job run count.py 20",
            output_hook=outputs.append,
            timeout=60,
        )
        shown = [o["content"]["data"] for o in outputs if o["msg_type"] == "display_data"]
        assert shown and "keeps running when you close" in shown[0]["text/plain"]
        assert "<p>Started job" in shown[0]["text/html"]
        errors = []
        kc.execute_interactive(
            "%gpu_job run ../outside.py", output_hook=errors.append, timeout=30
        )
        assert any("not inside the project" in str(e["content"]) for e in errors)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    engine = LocalEngine(project)
    (record,) = engine.list()
    assert engine.status(record.id).state == "running"  # the kernel is gone, not the job
    done = wait_for(lambda: engine.status(record.id).state == "succeeded", timeout=30)
    assert done and "step 19" in engine.logs(record.id)


def test_when_the_project_would_be_stopped_and_what_keeps_it():
    from datetime import UTC, datetime, timedelta

    from gpulab_jupyter.idle import activity_body, idle_timeout

    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    last = now - timedelta(minutes=30)
    body = activity_body({}, last, 7200, now)
    assert body["stop_at"] == (last + timedelta(hours=2)).timestamp()
    assert body["kept_by"] == []
    busy = {"gpulab_jobs_last_activity": now, "gpulab_gpu_last_activity": now - timedelta(hours=1)}
    assert activity_body(busy, now, 7200, now)["kept_by"] == ["job"]
    assert activity_body({}, now, 0, now) == {
        "idle_timeout": 0, "last_activity": now.timestamp(), "stop_at": None, "kept_by": ["use"],
    }  # fmt: skip
    assert idle_timeout({"GPULAB_IDLE_TIMEOUT": "3600"}) == 3600
    assert idle_timeout({"GPULAB_IDLE_TIMEOUT": "1e9"}) == 0  # only whole seconds


def test_a_busy_gpu_or_a_running_job_marks_the_server_active(project):
    import asyncio

    from gpulab_jupyter.activity import ActivityReporter

    class History:  # what GPUSampler.history() answers (docs/gpu-status-api.md)
        def __init__(self, utilization):
            self.utilization = utilization

        def history(self, since):
            return {"gpus": {"GPU-1": {"utilization": self.utilization}}}

    engine = LocalEngine(project)
    settings: dict = {}
    idle = ActivityReporter(settings, engine, History([0, 1, None, 2]))
    assert asyncio.run(idle.check()) == {"jobs": False, "gpu": False, "cells": False}
    assert settings == {}
    busy = ActivityReporter(settings, engine, History([0, 0, 37]))
    assert asyncio.run(busy.check())["gpu"] and "gpulab_gpu_last_activity" in settings
    record = engine.start(JobRequest("forever.py"))
    try:
        assert asyncio.run(idle.check())["jobs"] and "gpulab_jobs_last_activity" in settings
    finally:
        engine.stop(record.id)
    # A cell running on the server's side (gpulab_jupyter/cells.py) counts the same way.
    from gpulab_jupyter.cells import RunningCells

    cells = RunningCells()
    settings["gpulab_cells"] = cells
    assert not asyncio.run(idle.check())["cells"]
    cells.start({"request_id": "r1", "cell_id": "c1", "document_path": "train.ipynb"})
    assert asyncio.run(idle.check())["cells"] and "gpulab_cells_last_activity" in settings

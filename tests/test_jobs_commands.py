"""Jobs that run any command, as tmux or nohup would (``gpulab-job run -- bash train.sh``,
``%gpu_job run -- accelerate launch train.py``): the words parsed, the command checked
(an argument list, never a shell line; bounded; every word shown as itself), real jobs
of each form run by real processes, re-runs, the lists' headers, and what ``--gpus``
says on a host without GPU. The same forms in a real project container are in
test_jobs_container.py."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
from test_jobs_local import ENV, wait_for

from gpulab_jupyter.diagnosis import NoGpu
from gpulab_jupyter.jobs import cli, launch, supervise
from gpulab_jupyter.jobs.local import LocalEngine
from gpulab_jupyter.jobs.model import (
    MAX_ARG_LEN,
    MAX_ARGS,
    JobError,
    JobRequest,
    check_request,
    command_line,
)

# What a launcher does with its words, shown: the shims of accelerate and deepspeed
# print the argument list they got, one JSON line.
SHIM = "#!{python}\nimport json, os, sys\nprint('{name}', json.dumps(sys.argv[1:]), flush=True)\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.sh").write_text('echo "train.sh got: $*"\necho "cwd: $(pwd)"\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(
        "import sys\nprint('pkg.train', sys.argv[1:], flush=True)\n"
    )
    (tmp_path / "count.py").write_text("import sys\nprint('count', sys.argv[1:])\n")
    (tmp_path / "ds.json").write_text("{}")
    return tmp_path


@pytest.fixture
def path_env(tmp_path_factory) -> dict:
    """A PATH with ``accelerate`` and ``deepspeed`` (shims) and this Python as ``python``."""
    shims = tmp_path_factory.mktemp("bin")
    for name in ("accelerate", "deepspeed"):
        (shims / name).write_text(SHIM.format(python=sys.executable, name=name))
        (shims / name).chmod(0o755)
    (shims / "python").symlink_to(sys.executable)
    return {"PATH": f"{shims}:{os.environ['PATH']}"}


def finished(engine, job_id):
    return wait_for(lambda: (r := engine.status(job_id)).state in ("succeeded", "failed") and r)


# --- the words -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "words, target, args, command, gpus",
    [
        (["run", "--", "bash", "train.sh"], "", [], ["bash", "train.sh"], ""),
        (["run", "--gpus", "all", "--", "accelerate", "launch", "train.py"], "", [],
         ["accelerate", "launch", "train.py"], "all"),
        (["run", "--", "deepspeed", "train.py", "--deepspeed", "ds.json"], "", [],
         ["deepspeed", "train.py", "--deepspeed", "ds.json"], ""),
        (["run", "--", "python", "-m", "pkg.train", "--", "-h"], "", [],
         ["python", "-m", "pkg.train", "--", "-h"], ""),
        (["run", "train.py", "--epochs", "3"], "train.py", ["--epochs", "3"], [], ""),
        (["run", "--gpus", "all", "train.py", "-h"], "train.py", ["-h"], [], "all"),
    ],
)  # fmt: skip
def test_run_takes_a_script_or_a_command_after_the_double_dash(words, target, args, command, gpus):
    parsed = cli.parse(words)
    req = cli.request(parsed)
    assert (req.target, list(req.args), list(req.command), req.gpus) == (
        target, args, command, gpus,
    )  # fmt: skip


def test_run_with_nothing_to_run_says_what_to_write():
    for words in (["run"], ["run", "--gpus", "all"], ["run", "--"]):
        with pytest.raises(JobError, match=r"-- bash train.sh"):
            cli.parse(words, "%gpu_job", raise_errors=True)


def test_the_magics_line_keeps_a_quoted_shell_script_one_word():
    from gpulab_jupyter.magics.job import gpu_job

    class Recorder:
        def start(self, req):
            self.req = req
            raise JobError("recorded")

    rec = Recorder()
    with pytest.raises(JobError, match="recorded"):
        gpu_job("""run -- bash -c 'echo "a b"; echo c' x""", engine=rec)
    assert rec.req.command == ("bash", "-c", 'echo "a b"; echo c', "x")


# --- the checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, words",
    [
        (("bash", "-c", "echo a\necho b"), "LINE FEED"),
        (("echo", "\x1b[2Jcleared"), "ESCAPE"),
        (("echo", "\0"), r"U\+0000 NUL"),
        (("echo", "safe.py\u202e"), "RIGHT-TO-LEFT OVERRIDE"),
        (("echo",) * (MAX_ARGS + 1), f"at most {MAX_ARGS} words"),
        (("echo", "x" * (MAX_ARG_LEN + 1)), f"at most {MAX_ARG_LEN} characters each"),
        (("echo",) + ("x" * 4000,) * 5, "characters in all"),
        (("-rf", "x"), "is not a program to run"),
        (("rm -rf /",), "is not a program to run"),
        (("", "x"), "is not a program to run"),
        (("../outside.sh",), "not inside the project"),
        (("./missing.sh",), "no such file in the project"),
        (("./train.sh",), r"not executable: make it so \(chmod \+x ./train.sh\)"),
    ],
)
def test_a_command_that_could_mislead_or_escape_is_refused(project, command, words):
    with pytest.raises(JobError, match=words):
        check_request(JobRequest(command=command), project)


def test_a_program_through_a_link_out_of_the_project_is_refused(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "evil.sh"
    outside.write_text("echo escaped")
    outside.chmod(0o755)
    (project / "tools").mkdir()
    (project / "tools" / "go.sh").symlink_to(outside)
    with pytest.raises(JobError, match="not inside the project"):
        check_request(JobRequest(command=("tools/go.sh",)), project)


def test_a_command_goes_with_no_script_and_on_one_machine(project):
    with pytest.raises(JobError, match="not both"):
        check_request(JobRequest("count.py", command=("bash", "train.sh")), project)
    with pytest.raises(JobError, match="not a command"):
        check_request(JobRequest(command=("bash", "train.sh"), nodes=2), project)
    with pytest.raises(JobError, match=r"or put any other command after --"):
        check_request(JobRequest("train.sh"), project)


def test_an_unknown_program_is_refused_before_any_job_is_made(project, path_env):
    with pytest.raises(
        JobError,
        match=r"torchrunn: no such command in this .* \(not on its PATH\)",
    ):
        LocalEngine(project).start(JobRequest(command=("torchrunn", "x.py")), path_env)
    assert not (project / "jobs").exists() or not list((project / "jobs").iterdir())


def test_a_rerun_asks_for_the_same_command():
    req = JobRequest(command=("accelerate", "launch", "train.py"), gpus="all", name="ft")
    kept = json.loads(json.dumps(dataclasses.asdict(req)))  # what job.json keeps
    assert JobRequest.of(kept) == req
    old = {"target": "count.py", "args": ["1"], "gpus": "", "precision": "", "name": ""}
    assert JobRequest.of(old) == JobRequest("count.py", ("1",))  # records made before


def test_the_command_shows_exactly_as_typed():
    cmd = {"command": ["bash", "-c", 'echo "$1"; rm x', "_", "a b"]}
    assert command_line(cmd) == """-- bash -c 'echo "$1"; rm x' _ 'a b'"""
    assert command_line({"target": "train.py", "args": ["--tag", "v 2"]}) == "train.py --tag 'v 2'"


def test_a_commands_gpus_are_what_it_sees_and_its_launcher_starts_the_processes():
    two = launch.Machine(capabilities=((9, 0), (9, 0)), cpus=16)
    req = JobRequest(command=("accelerate", "launch", "train.py"), gpus="all")
    assert launch.command(req, two, "/py") == ["accelerate", "launch", "train.py"]
    assert launch.environment(req, two, {})["CUDA_VISIBLE_DEVICES"] == "0,1"
    with pytest.raises(JobError, match="holds 2 GPU"):
        launch.command(dataclasses.replace(req, gpus="4"), two, "/py")


# --- no GPU on this host ---------------------------------------------------------------


def test_gpus_on_a_host_without_gpu_says_so_and_how_to_run_on_the_cpu():
    from gpulab_jupyter import diagnosis

    host_without = diagnosis.without_nvml({"GPULAB_HOST_GPUS": ""}, diagnosis.NO_LIBRARY)
    machine = launch.Machine((), 4, host_without)
    with pytest.raises(JobError) as e:
        launch.command(JobRequest("train.py", ("--epochs", "3"), gpus="all"), machine, "/py")
    said = str(e.value)
    assert said.startswith("--gpus all: This host has no NVIDIA driver: gpulab found no GPU")
    assert "To run on the CPU, leave out --gpus: gpulab-job run train.py --epochs 3" in said
    assert "-- torchrun --nproc-per-node=4 train.py --epochs 3" in said
    assert "start it again" not in said and "NVML" not in said
    # On a host with GPUs, a project started without one is offered a restart with GPUs.
    given_none = diagnosis.no_gpu_given(
        {"GPULAB_HOST_GPUS": "NVIDIA A10", "NVIDIA_VISIBLE_DEVICES": "void"}
    )
    machine = launch.Machine((), 4, given_none)
    with pytest.raises(JobError) as e:
        launch.command(JobRequest(command=("bash", "train.sh"), gpus="1"), machine, "/py")
    said = str(e.value)
    assert "This project was started without a GPU. This host has GPUs (NVIDIA A10)." in said
    assert "gpulab-job run -- bash train.sh." in said and "start it again with a GPU" in said
    assert isinstance(machine.why_no_gpu, NoGpu)


# --- real jobs -------------------------------------------------------------------------


def test_each_command_form_runs_for_real_with_its_words_untouched(project, path_env):
    engine = LocalEngine(project)
    (project / "tools").mkdir()
    (project / "tools" / "go.sh").write_text('#!/bin/sh\necho "go.sh: $1"\n')
    (project / "tools" / "go.sh").chmod(0o755)
    forms = {
        ("bash", "train.sh", "--epochs", "3"): "train.sh got: --epochs 3",
        ("accelerate", "launch", "train.py", "--lr", "1e-4"):
            'accelerate ["launch", "train.py", "--lr", "1e-4"]',
        ("deepspeed", "train.py", "--deepspeed", "ds.json"):
            'deepspeed ["train.py", "--deepspeed", "ds.json"]',
        ("python", "-m", "pkg.train", "--tag", "a b"): "pkg.train ['--tag', 'a b']",
        ("bash", "-c", 'echo "[$1]"; echo done', "_", "x; touch pwned"): "[x; touch pwned]\ndone",
        ("echo", "$(touch pwned)", "`touch pwned`", "*"): "$(touch pwned) `touch pwned` *",
        ("./tools/go.sh", "here"): "go.sh: here",
    }  # fmt: skip
    started = {words: engine.start(JobRequest(command=words), path_env) for words in forms}
    for words, record in started.items():
        done = finished(engine, record.id)
        log = engine.logs(record.id)
        assert done and done.state == "succeeded", log
        assert forms[words] in log, log
        assert done.argv == list(words)  # run as it is: no shell, no interpreter added
    assert f"cwd: {project}" in engine.logs(started[("bash", "train.sh", "--epochs", "3")].id)
    assert not (project / "pwned").exists()  # no word was read by a shell
    # A re-run runs the same command again.
    first = started[("python", "-m", "pkg.train", "--tag", "a b")]
    again = engine.rerun(first.id, path_env)
    assert again.id != first.id and again.request["command"] == list(first.request["command"])
    assert finished(engine, again.id).state == "succeeded"
    # The list: headers, then each job's command as a shell reads it (no "--").
    lines = cli.table(engine.list())
    assert lines[0].split() == ["JOB", "STATE", "TIME", "COMMAND"]
    assert any(line.endswith("  python -m pkg.train --tag 'a b' (finished)") for line in lines)
    assert not [line for line in lines if " -- " in line]


def test_a_command_that_fails_or_cannot_start_says_so(project, path_env):
    engine = LocalEngine(project)
    failed = engine.start(JobRequest(command=("bash", "-c", "exit 7")), path_env)
    assert finished(engine, failed.id).message == "exit code 7"
    # The program is gone between the check and the start: a failed job that says why,
    # not one that reads as lost.
    (project / "gone.sh").write_text("#!/bin/sh\n")
    (project / "gone.sh").chmod(0o755)
    record = engine.start(JobRequest(command=("./gone.sh",)), path_env)
    assert finished(engine, record.id).state == "succeeded"
    (project / "gone.sh").unlink()
    folder = project / "jobs" / record.id
    for name in ("result.json", "state.json"):
        (folder / name).unlink()
    assert supervise.run(folder) == 0
    gone = engine.status(record.id)
    assert gone.state == "failed" and gone.message.startswith("./gone.sh could not start: No such")


def test_gpu_job_in_a_kernel_runs_commands_lists_with_headers_and_explains_no_gpu(
    project, path_env
):
    """%gpu_job in a real IPython kernel on this host, which has no GPU."""
    from jupyter_client.manager import start_new_kernel

    env = dict(ENV, GPULAB_PROJECT_DIR=str(project), GPULAB_HOST_GPUS="", **path_env)
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(project))
    try:

        def run(code: str) -> list[dict]:
            outputs = []
            kc.execute_interactive(code, output_hook=outputs.append, timeout=60)
            return outputs

        run("%load_ext gpulab_jupyter.magics")
        out = run("%gpu_job run -- python -m pkg.train --from-magic")
        shown = [o["content"]["data"] for o in out if o["msg_type"] == "display_data"]
        assert shown and shown[0]["text/plain"].startswith("Started job"), out
        job_id = shown[0]["text/plain"].split()[2]
        assert finished(LocalEngine(project), job_id).state == "succeeded"
        out = run("%gpu_job run -- bash train.sh 'a b'")
        shown = [o["content"]["data"] for o in out if o["msg_type"] == "display_data"]
        bash_id = shown[0]["text/plain"].split()[2]
        assert finished(LocalEngine(project), bash_id).state == "succeeded"
        out = run("%gpu_job list")
        (table,) = [o["content"]["data"] for o in out if o["msg_type"] == "display_data"]
        lines = table["text/plain"].splitlines()
        assert lines[0].split() == ["JOB", "STATE", "TIME", "COMMAND"]
        # COMMAND is what runs, as a shell reads it: not the "--" that was typed before it
        rows = {line.split()[0]: line for line in lines[1:]}
        assert rows[job_id].endswith("  python -m pkg.train --from-magic (finished)")
        assert rows[bash_id].endswith("  bash train.sh 'a b' (finished)")
        assert " -- " not in table["text/plain"]
        assert "<th style='text-align:left'>COMMAND</th>" in table["text/html"]
        shown = "<td><code>bash train.sh &#x27;a b&#x27; (finished)</code></td>"
        assert shown in table["text/html"]
        assert "--" not in table["text/html"].replace("--from-magic", "")
        out = run("%gpu_job run --gpus all count.py")
        said = "".join(json.dumps(o["content"]) for o in out)
        assert "This host has no NVIDIA driver" in said, said
        assert "To run on the CPU, leave out --gpus: gpulab-job run count.py" in said
        assert "FATAL ERROR" not in said and "NVML) not found" not in said
        assert "start it again" not in said
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_jobs_api_takes_a_command_and_answers_it_as_typed(project, path_env):
    from gpulab_jupyter.jobs.handlers import record_json

    engine = LocalEngine(project)
    record = engine.start(JobRequest(command=("bash", "train.sh", "a b")), path_env)
    body = record_json(finished(engine, record.id))
    assert body["command_line"] == "-- bash train.sh 'a b'"
    assert body["request"]["command"] == ["bash", "train.sh", "a b"]


def test_script_arguments_are_checked_as_commands_are(project):
    with pytest.raises(JobError, match="ESCAPE"):
        check_request(JobRequest("count.py", ("\x1b]0;title\x07",)), project)


def test_job_ids_are_ascii_digits_on_both_sides():
    """The user side and the hub read a job id with the same grammar: digits outside
    ASCII (which ``\\d`` also matches) are refused on both, never on one only."""
    import re

    from gpulab_hub.cluster import jobsapi
    from gpulab_jupyter.jobs import model

    good, arabic = (
        "20261126-120000-abcd",
        "\u0662\u0660\u0662\u0666\u0661\u0661\u0662\u0666-120000-abcd",
    )
    for text in (good, arabic, "2026112-120000-abcd", "20261126-120000-ABCD"):
        hub = re.fullmatch(jobsapi.JOB_ID, text) is not None
        assert (model.JOB_ID.fullmatch(text) is not None) == hub == (text == good), text

"""Jobs of every command form in a real project container, through the project server's
jobs API and ``%gpu_job`` in a kernel there (one project start on the shared hub):
``-- bash train.sh``, ``-- python -m pkg.train``, a launcher named as a file of the
project, ``bash -c`` with a word a shell would misread; a re-run; ``%gpu_job list``
with headers; and ``--gpus all`` on this host without GPU, in gpulab's words."""

from __future__ import annotations

import time

import pytest
from security.people import execute, log_in_admin, make_user

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT = "jcowner", "jc-proj"
SERVER = f"/user/{OWNER}/{PROJECT}"
FILES = {
    "train.sh": 'echo "train.sh got: $*"\n',
    "pkg/__init__.py": "",
    "pkg/train.py": "import sys\nprint('pkg.train', sys.argv[1:], flush=True)\n",
    # a launcher as accelerate's is: a program that runs the script it is given
    "tools/launch": '#!/bin/sh\necho "launch: $*"\nexec python "$@"\n',
    "count.py": "import sys\nprint('count', sys.argv[1:], flush=True)\n",
}


@pytest.fixture(scope="module")
def owner(hub):
    user = make_user(hub, log_in_admin(hub), OWNER)
    user.start_project(PROJECT)
    for path, text in FILES.items():
        folder = path.rpartition("/")[0]
        if folder:
            user.api("PUT", f"{SERVER}/api/contents/{folder}", json={"type": "directory"})
        body = {"type": "file", "format": "text", "content": text}
        r = user.api("PUT", f"{SERVER}/api/contents/{path}", json=body)
        assert r.status_code in (200, 201), r.text
    yield user
    user.stop_project(PROJECT)


def run_job(owner, body: dict) -> dict:
    r = owner.api("POST", f"{SERVER}/api/gpulab/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return wait(owner, r.json()["id"])


def wait(owner, job_id: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        got = owner.api("GET", f"{SERVER}/api/gpulab/v1/jobs/{job_id}").json()
        if got["state"] not in ("starting", "running") or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def test_each_command_form_runs_in_the_project_container(owner):
    made_executable = run_job(owner, {"command": ["chmod", "+x", "tools/launch"]})
    assert made_executable["state"] == "succeeded", made_executable
    forms = {
        ("bash", "train.sh", "--epochs", "3"): "train.sh got: --epochs 3",
        ("python", "-m", "pkg.train", "--tag", "a b"): "pkg.train ['--tag', 'a b']",
        ("./tools/launch", "count.py", "--n", "2"): "launch: count.py --n 2\ncount ['--n', '2']",
        ("bash", "-c", 'echo "[$1]"', "_", "x; touch pwned"): "[x; touch pwned]",
    }
    for words, expected in forms.items():
        job = run_job(owner, {"command": list(words)})
        assert job["state"] == "succeeded", job
        assert expected in job["log_tail"], job["log_tail"]
        assert job["argv"] == list(words)
    r = owner.api("GET", f"{SERVER}/api/contents/pwned")
    assert r.status_code == 404  # no word was read by a shell
    r = owner.api("POST", f"{SERVER}/api/gpulab/v1/jobs", json={"command": ["bash\n", "x"]})
    assert r.status_code == 400 and "does not show as itself" in r.text
    # A re-run runs the same command, shown the same way.
    first = run_job(owner, {"command": ["python", "-m", "pkg.train", "--tag", "a b"]})
    assert first["command_line"] == "-- python -m pkg.train --tag 'a b'"
    r = owner.api("POST", f"{SERVER}/api/gpulab/v1/jobs/{first['id']}/rerun")
    assert r.status_code == 200, r.text
    again = wait(owner, r.json()["id"])
    assert again["state"] == "succeeded" and again["command_line"] == first["command_line"]


def test_gpu_job_in_the_projects_kernel(owner):
    code = """
import time
from IPython.utils.capture import capture_output
get_ipython().run_line_magic("load_ext", "gpulab_jupyter.magics")

def magic(line):
    with capture_output() as seen:
        try:
            get_ipython().run_line_magic("gpu_job", line)
        except Exception as e:
            print("refused:", e)
    print(seen.stdout, seen.stderr)
    for o in seen.outputs:
        print(o.data["text/plain"])

magic("run -- bash train.sh from-magic")
time.sleep(2)
magic("list")
magic("run --gpus all count.py")
"""
    out = execute(owner.base, SERVER, owner.token, code)
    assert "JOB" in out and "STATE" in out and "COMMAND" in out, out
    assert "  bash train.sh from-magic" in out and "-- bash" not in out, out
    assert "This host has no NVIDIA driver" in out, out
    assert "To run on the CPU, leave out --gpus: gpulab-job run count.py" in out, out
    assert "FATAL ERROR" not in out and "start it again" not in out, out

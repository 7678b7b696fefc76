"""A hub crash costs nobody their running work (issue: holds under faults).

The hub is killed with SIGKILL while projects run, one project's container dies
while it is down, and `gpulab up` starts it again: the running project is
re-adopted (same container, same files, same URL, its shares still work), the
dead one is shown as stopped and can start again.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import PREFIX, hub_env, start_hub
from security.people import execute, log_in_admin, make_user, share_by_link

from gpulab_hub import pidfile

pytestmark = [pytest.mark.docker]


# In a kernel: write a script, start it as a job with %gpu_job, print the job's id.
JOB_FROM_KERNEL = """
open('ticks.py', 'w').write(
    "import time\\nfor i in range(900):\\n    print('tick', i, flush=True)\\n    time.sleep(1)\\n")
get_ipython().run_line_magic('gpu_job', 'run ticks.py')
from gpulab_jupyter.jobs.local import LocalEngine
print(LocalEngine('/workspace').list()[0].id)
"""


@pytest.fixture
def crash_hub(docker_engine, tmp_path_factory):
    home = tmp_path_factory.mktemp("gpulab-crash")
    env = hub_env(home)
    hub = start_hub(home, env)
    yield hub
    hub.gpulab("down")


def kill_hard(pid: int, timeout: float = 30) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the hub (pid {pid}) did not die")


def test_a_killed_hub_readopts_running_projects_and_forgets_dead_ones(crash_hub, docker_engine):
    admin = log_in_admin(crash_hub)
    rita, rob = (make_user(crash_hub, admin, name) for name in ("rita", "rob"))
    rita.start_project("keep")
    rita.start_project("dies")
    share_by_link(rita, "keep", rob, "collaborator")
    rita.execute("keep", "open('before.txt', 'w').write('written before the crash')")
    # A job started from a kernel (the kernel is deleted right after): it runs on.
    job_id = rita.execute("keep", JOB_FROM_KERNEL).strip()
    keep = docker_engine.call("inspect_container", f"{PREFIX}-rita--keep")

    hub_process = pidfile.read(crash_hub.home / "hub" / "gpulab-hub.pid")
    kill_hard(hub_process.pid)
    docker_engine.call("remove_container", f"{PREFIX}-rita--dies", force=True)
    again = start_hub(crash_hub.home, crash_hub.env)
    assert "gpulab is running" in again.up_output, again.up_output

    # Re-adopted: the same container, its files, the same URL, and the share.
    model = rita.api("GET", "/hub/api/users/rita").json()
    assert model["servers"]["keep"]["ready"], model
    assert model["servers"]["keep"]["url"] == "/user/rita/keep/"
    after = docker_engine.call("inspect_container", f"{PREFIX}-rita--keep")
    assert after["Id"] == keep["Id"] and after["State"]["StartedAt"] == keep["State"]["StartedAt"]
    out = rita.execute("keep", "print(open('before.txt').read())")
    assert out.strip() == "written before the crash"
    # The job outlived its kernel and the hub: still running, its log growing.
    job = rita.api("GET", f"/user/rita/keep/api/gpulab/v1/jobs/{job_id}")
    assert job.status_code == 200 and job.json()["state"] == "running", job.text
    assert "tick 2" in job.json()["log_tail"], job.json()
    stopped = rita.api("POST", f"/user/rita/keep/api/gpulab/v1/jobs/{job_id}/stop")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.text
    out = execute(crash_hub.url, "/user/rita/keep", rob.token, "print('collaborator in')")
    assert out.strip() == "collaborator in"
    # The project whose container died meanwhile is stopped, and starts again.
    assert "dies" not in model["servers"] or not model["servers"]["dies"]["ready"], model
    rita.start_project("dies")
    assert rita.execute("dies", "print(2 + 2)").strip() == "4"

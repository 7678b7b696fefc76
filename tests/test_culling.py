"""Idle projects are stopped by JupyterHub's idle culler (a service `gpulab up`
starts), and their GPUs freed; a project with a running job is spared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import hub_env, start_hub
from security.people import log_in_admin, make_user

from gpulab_hub import culling
from gpulab_hub.gpus import allocator, keeper, reclaim

# Seconds without activity before a project is stopped: the culler then looks every 2 s
# and servers report every 2 s, so a project kept by a job is 4 s stale at most.
TIMEOUT = 10

JOB = "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(1)\n"


def test_the_culler_service_stops_at_the_hubs_first_signal():
    """Started with SIGINT ignored (as a hub in the background starts its services), the
    culler still stops at JupyterHub's SIGINT, so stopping the hub does not wait 30 s."""
    env = dict(os.environ, JUPYTERHUB_API_TOKEN="t", JUPYTERHUB_API_URL="http://127.0.0.1:9/hub/api")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab_hub.culling", "--timeout=60", "--cull-every=15"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        time.sleep(3)  # running, its first round done
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) is not None
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def culling_hub(docker_engine, tmp_path_factory):
    """One hub with a short idle timeout for the module's tests (a hub costs a minute or
    more to start); each test has its own user and projects."""
    home = tmp_path_factory.mktemp("gpulab-cull")
    hub = start_hub(home, hub_env(home, GPULAB_IDLE_TIMEOUT=str(TIMEOUT)))
    yield hub
    hub.gpulab("down")


def servers(user) -> dict:
    return user.api("GET", f"/hub/api/users/{user.name}").json()["servers"]


@pytest.mark.docker
def test_the_culler_stops_idle_projects_but_not_one_with_a_running_job(culling_hub):
    admin = log_in_admin(culling_hub)
    cleo = make_user(culling_hub, admin, "cleo")
    cleo.start_project("idle")
    cleo.start_project("training")
    server = "/user/cleo/training"
    r = cleo.api(
        "PUT", f"{server}/api/contents/train.py", json={"type": "file", "format": "text",
                                                         "content": JOB},
    )  # fmt: skip
    assert r.status_code in (200, 201), r.text
    r = cleo.api("POST", f"{server}/api/gpulab/v1/jobs", json={"target": "train.py"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "running"
    cull = culling.intervals(TIMEOUT)
    started = time.monotonic()
    deadline = started + TIMEOUT + 3 * cull["cull_every"] + 30
    while "idle" in servers(cleo):
        assert time.monotonic() < deadline, f"the idle project was not stopped: {servers(cleo)}"
        time.sleep(2)
    culled_after = time.monotonic() - started
    # Stopped, never deleted: the project and its folder are still there.
    assert (culling_hub.home / "projects" / "cleo" / "idle" / "Dockerfile").is_file()
    # The project with the job is still there after twice the timeout, its job running.
    while time.monotonic() - started < 2 * TIMEOUT + cull["cull_every"]:
        time.sleep(2)
    assert "training" in servers(cleo), "the project with a running job was stopped"
    # The home page says the project runs a job.
    home = cleo.http.get(culling_hub.url + "/hub/home", timeout=30)
    assert home.status_code == 200 and "1 job running" in home.text
    # What JupyterLab's notice reads: the timeout, and that the job keeps it.
    r = cleo.api("GET", f"{server}/api/gpulab/v1/activity")
    assert r.status_code == 200 and r.json()["idle_timeout"] == TIMEOUT, r.text
    assert "job" in r.json()["kept_by"], r.json()
    r = cleo.api("GET", f"{server}/api/gpulab/v1/jobs/{job['id']}")
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert "3\n" in r.json()["log_tail"]
    print(f"\nidle project stopped {culled_after:.0f} s after start (timeout {TIMEOUT} s)")
    r = cleo.api("POST", f"{server}/api/gpulab/v1/jobs/{job['id']}/stop")
    assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
    log = culling_hub.log
    assert culling.SERVICE in log


SILENT = "import time\ntime.sleep(40)\nprint('slept', flush=True)\n"


def reclaim_plan(user, project: str, now: float) -> keeper.Plan:
    """What GPU reclaim decides at ``now`` on the hub's own record of ``user``'s servers
    (their ``last_activity``, what the keeper reads), were ``project`` holding a GPU:
    idle release after ``TIMEOUT`` seconds, nobody waiting."""
    model = user.api("GET", f"/hub/api/users/{user.name}").json()
    held = {"GPU-0": (allocator.Holder(user.name, project, since=now - 3600),)}
    rules = reclaim.Rules(grace=60, idle_after=TIMEOUT, release_after=TIMEOUT)
    return keeper.plan([], keeper.state_of([model]), keeper.Host(holdings=held), {}, now, rules)


@pytest.mark.docker
def test_a_cell_running_on_the_server_keeps_its_project_then_idle_it_is_culled(culling_hub):
    """A cell that prints nothing for 40 s, run on the server's side with no browser open
    (gpulab_jupyter/cells.py): four timeouts long, and the project stays; once it has
    ended and nothing else runs, the project is stopped like any idle one. GPU reclaim,
    deciding on the same hub's record, never picks it while the cell runs and picks it
    once it has been idle as long as its rule says."""
    from cells_kit import (
        cell_text,
        code_cell,
        kernel_of,
        post_execute,
        put_notebook,
        room_id,
        saved,
        wait_done,
    )
    from security.people import open_room

    admin = log_in_admin(culling_hub)
    dana = make_user(culling_hub, admin, "dana")
    dana.start_project("cells")
    server, path = "/user/dana/cells", "slow.ipynb"
    put_notebook(dana, server, path, [code_cell("s1", SILENT)])
    room_ws = open_room(dana.base, server, path, token=dana.token)  # JupyterLab's tab...
    kernel = kernel_of(dana, server, path)
    r = post_execute(dana.token, dana.base, server, kernel, SILENT, "s1",
                     room_id(dana, server, path), path)  # fmt: skip
    assert r.status_code == 202, r.text
    room_ws.close()  # ...closed: nothing but the cell is left
    started = time.monotonic()
    kept_by = set()
    while time.monotonic() - started < 36:
        assert "cells" in servers(dana), "the project with a running cell was stopped"
        kept_by |= set(dana.api("GET", f"{server}/api/gpulab/v1/activity").json()["kept_by"])
        if time.monotonic() - started > 2 * TIMEOUT:  # silent for twice the idle rule
            plan = reclaim_plan(dana, "cells", time.time())
            assert not plan.warn and not plan.stop, f"reclaim picked a running cell: {plan}"
        time.sleep(2)
    assert "cell" in kept_by, kept_by
    done = wait_done(dana.token, dana.base, server, kernel, r.json()["request_id"], timeout=60)
    assert done.get("status") == "ok", done
    # Idle from here: on the hub's record as it stands, reclaim picks the project once
    # it has been idle for the rule's time, and not before.
    assert not reclaim_plan(dana, "cells", time.time()).warn
    later = reclaim_plan(dana, "cells", time.time() + TIMEOUT + 5)
    assert [w.key for w in later.warn] == [("dana", "cells")], later
    time.sleep(3)
    assert cell_text(saved(dana, server, path), "s1") == "slept\n"
    cull = culling.intervals(TIMEOUT)
    ended = time.monotonic()
    while "cells" in servers(dana):
        assert time.monotonic() - ended < TIMEOUT + 3 * cull["cull_every"] + 60, (
            "the project was not stopped once its cell had ended"
        )
        time.sleep(2)
    print(f"\nkept {ended - started:.0f} s by a silent cell; stopped "
          f"{time.monotonic() - ended:.0f} s after it ended (timeout {TIMEOUT} s)")  # fmt: skip

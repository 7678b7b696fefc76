"""A small build never waits behind a big one (images/builds.py's quick lane), on a hub of
its own whose quick lane lasts 20 s (``build_quick_s``, in jupyterhub_config.d).

One user, three projects, one build of theirs at a time (``build_max_per_user`` 1):

- "big"'s Dockerfile ends in a step that sleeps 150 s; its build holds the user's slot;
- "small" was built before; then a line was appended to its Dockerfile (as %gpu_install
  does). Its restart runs beside big's build and is ready long before big's ends; its
  spawn page said that big's build was running and that this one runs beside it (read
  from the hub's log, which keeps what the build pool told each start: a start this
  quick may end before a progress stream could connect);
- "huge" ends in a step that sleeps 600 s: a big build that a user would like to pass for
  a small one. Its step is stopped at 20 s, the step's container is gone while big still
  builds, and its spawn page says what it waits for: big's build, by name. Its spawn page
  offers "Stop starting"; the user stops it (the button's call), and after big's build
  ended no build of huge runs.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid

import pytest
from conftest import PREFIX, hub_env, print_container_logs, start_hub
from hubclient import HubUser
from security.people import log_in_admin, make_user

pytestmark = [pytest.mark.docker, pytest.mark.slow]

USER = "lanes"
QUICK_S = 20
BIG_S, HUGE_S = 150, 600
RUN = uuid.uuid4().hex[:12]  # no layer of an earlier run fits these steps


@pytest.fixture(scope="module")
def lanehub(docker_engine, local_debian, tmp_path_factory, request):
    home = tmp_path_factory.mktemp("gpulab-lanes-home")
    site = home / "jupyterhub_config.d"
    site.mkdir(mode=0o755)
    (site / "50-quick-lane.py").write_text(f"c.ProjectSpawner.build_quick_s = {QUICK_S}\n")
    (site / "50-quick-lane.py").chmod(0o644)
    h = start_hub(home, hub_env(home, GPULAB_CONTAINER_PREFIX=PREFIX + "lane"))
    yield h
    if request.session.testsfailed:
        print("\n----- hub log (last 80 lines) -----\n" + "\n".join(h.log.splitlines()[-80:]))
        print_container_logs(docker_engine)
    down = h.gpulab("down")
    assert down.returncode == 0, down.stderr


@pytest.fixture(scope="module")
def owner(lanehub) -> HubUser:
    user = make_user(lanehub, log_in_admin(lanehub), USER)
    yield user
    for name in user.api("GET", f"/hub/api/users/{USER}").json()["servers"]:
        user.stop_project(name)


def append_line(user: HubUser, project: str, line: str) -> None:
    """From inside the running project, as %gpu_install does: one line more at the end of
    its Dockerfile; then the project is stopped."""
    out = user.execute(
        project,
        f"with open('/workspace/Dockerfile', 'a') as f: f.write({line!r} + '\\n')\n"
        "print(open('/workspace/Dockerfile').read().splitlines()[-1])\n",
    )
    assert out.strip() == line, out
    user.stop_project(project)


def start(user: HubUser, project: str) -> None:
    r = user.api("POST", f"/hub/api/users/{USER}/servers/{project}", json={})
    assert r.status_code in (201, 202), r.text


class Progress:
    """A start's spawn page messages as they come (JupyterHub's progress stream)."""

    def __init__(self, user: HubUser, project: str):
        self.events: list[dict] = []
        r = user.api(
            "GET", f"/hub/api/users/{USER}/servers/{project}/progress", stream=True, timeout=900
        )
        assert r.status_code == 200, r.text

        def read() -> None:
            for line in r.iter_lines():
                if line.startswith(b"data:"):
                    self.events.append(json.loads(line[5:]))

        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()

    def messages(self) -> list[str]:
        return [e.get("message", "") for e in list(self.events)]

    def wait_for(self, words: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            said = [m for m in self.messages() if words in m]
            if said:
                return said[0]
            time.sleep(0.3)
        raise AssertionError(f"the spawn page never said {words!r}: {self.messages()}")


def pool_said(hub, project: str) -> list[str]:
    """What the build pool told ``project``'s starts, as the hub's log keeps it."""
    mark = f"gpulab: build of {USER}:{project}: "
    return [line.split(mark, 1)[1] for line in hub.log.splitlines() if mark in line]


def pending(user: HubUser, project: str) -> str | None:
    server = user.api("GET", f"/hub/api/users/{USER}").json()["servers"].get(project)
    return server and (server.get("pending") or ("ready" if server["ready"] else None))


def steps_running(marker: str) -> list[str]:
    """Running containers (a build's RUN step among them) whose command holds ``marker``."""
    out = subprocess.run(
        ["docker", "ps", "--no-trunc", "--format", "{{.Command}}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [line for line in out.stdout.splitlines() if marker in line]


def test_a_small_rebuild_runs_beside_a_big_build_and_a_big_one_waits(lanehub, owner):
    for project in ("big", "small", "huge"):
        owner.make_project(project, project)
        owner.start_project(project, timeout=600)
    append_line(owner, "small", f"RUN echo small-{RUN} > /tmp/small")
    append_line(owner, "big", f"RUN echo big-{RUN} && sleep {BIG_S}")
    append_line(owner, "huge", f"RUN echo huge-{RUN} && sleep {HUGE_S}")

    start(owner, "big")
    big = Progress(owner, "big")
    big.wait_for(f"sleep {BIG_S}", timeout=300)  # its long step runs: the user's slot is held
    began = time.monotonic()

    start(owner, "small")
    owner.wait_ready("small", timeout=BIG_S)
    took = time.monotonic() - began
    print(f"\nsmall's rebuild, beside big's build: ready in {took:.1f} s")
    assert pending(owner, "big") == "spawn", "big's build should still run"
    said = pool_said(lanehub, "small")
    assert said == [
        "Your other image build (project big) is running: this rebuild runs beside it for up"
        f" to {QUICK_S} s (a rebuild that reuses its cached steps needs seconds)"
    ], said
    assert owner.execute("small", "print(open('/tmp/small').read())").strip() == f"small-{RUN}"

    start(owner, "huge")
    huge = Progress(owner, "huge")
    huge.wait_for(f"sleep {HUGE_S}", timeout=120)  # its long step began, in the quick lane
    assert steps_running(f"huge-{RUN}"), "huge's step should run in the quick lane"
    waits = huge.wait_for("Waiting for your other image build", timeout=QUICK_S + 60)
    assert waits == (
        "Waiting for your other image build (project big) to finish: this build ran past"
        f" {QUICK_S} s beside it, more than a quick rebuild; it then goes on from the steps"
        " it finished (you may run 1 at a time on this hub). Stop starting to give up the wait."
    ), waits
    # the big build that would pass for a small one runs no longer than the lane allows
    deadline = time.monotonic() + 30
    while steps_running(f"huge-{RUN}") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not steps_running(f"huge-{RUN}"), "huge's step still runs beside big's build"
    assert steps_running(f"big-{RUN}"), "big's build should still run"
    assert pending(owner, "huge") == "spawn"

    # the spawn page, as its owner sees it: the wait's words come in its progress stream
    # (above), and it offers to stop the start; its button's call stops it
    page = owner.http.get(f"{owner.base}/hub/spawn-pending/{USER}/huge", timeout=30)
    assert page.status_code == 200, page.status_code
    assert 'id="stop-server-btn"' in page.text and "Stop starting huge" in page.text
    owner.stop_project("huge", timeout=120)
    assert pending(owner, "huge") is None

    owner.wait_ready("big", timeout=BIG_S + 300)
    # big's build ended and gave the user's slot back: huge's stopped start takes none
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert not steps_running(f"huge-{RUN}"), "huge's stopped start built after all"
        assert pending(owner, "huge") is None
        time.sleep(1)

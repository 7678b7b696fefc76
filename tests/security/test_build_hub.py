"""Builds through the real hub: one user's endless builds never make another user's
start wait, and a running project reaches the hub but no other service of the host."""

from __future__ import annotations

import time

import pytest
from conftest import PREFIX
from hostservice import SECRET, HostService, host_address
from people import log_in_admin, make_user

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]
BUILD_NETS = f"{PREFIX}-net-build-"


@pytest.fixture(scope="module")
def admin(hub):
    return log_in_admin(hub)


def timed(fn) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def running_steps(dk) -> list[dict]:
    """Build steps running now, on this hub's build networks."""
    return [
        c for net in build_networks(dk) for c in dk.call("containers", filters={"network": net})
    ]


def wait_for(what, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := what():
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_endless_builds_never_make_another_users_start_wait(hub, admin, docker_engine):
    quiet = make_user(hub, admin, "bldquiet")
    attacker = make_user(hub, admin, "bldattack")
    quiet.start_project("calm")  # its first build
    quiet.stop_project("calm")
    quiet_s = timed(lambda: quiet.start_project("calm"))  # unchanged: no build
    quiet.stop_project("calm")

    for i in range(3):
        folder = hub.home / "projects" / attacker.name / f"slow{i}"
        folder.mkdir(parents=True)
        (folder / "Dockerfile").write_text(
            f"FROM {PREFIX}/base:latest\nRUN echo slow{i}; sleep 600\n"
        )
        r = attacker.api("POST", f"/hub/api/users/{attacker.name}/servers/slow{i}", json={})
        assert r.status_code in (201, 202), r.text
    try:
        wait_for(lambda: running_steps(docker_engine))
        time.sleep(3)  # the other two builds had time to start, if the hub let them
        assert len(running_steps(docker_engine)) == 1  # one build per user at a time
        loaded_s = timed(lambda: quiet.start_project("calm"))
        print(f"unchanged start: quiet {quiet_s:.1f} s, beside endless builds {loaded_s:.1f} s")
        # within 2x its quiet time (plus the 0.5 s of wait_ready's polling)
        assert loaded_s <= 2 * quiet_s + 0.5, (quiet_s, loaded_s)

        # the running project reaches the hub, and no other service of the host
        service = HostService()
        try:
            code = (
                "import socket\n"
                "def dial(ip, port):\n"
                "    try:\n"
                "        with socket.create_connection((ip, port), timeout=3) as s:\n"
                "            s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); return s.recv(300)\n"
                "    except OSError as e:\n"
                "        return 'closed'\n"
                "import os, urllib.parse\n"
                "hub = urllib.parse.urlparse(os.environ['JUPYTERHUB_API_URL'])\n"
                f"print(dial({host_address()!r}, {service.port}))\n"
                f"print(dial(hub.hostname, {service.port}))\n"
                "print(dial(hub.hostname, hub.port))\n"
            )
            out = quiet.execute("calm", code).splitlines()
        finally:
            service.close()
        assert out[0] == "closed" and out[1] == "closed", out
        assert "HTTP/1." in out[2][:12] and SECRET not in "".join(out), out
    finally:
        # the killed builds fail; the waiting ones then build, and are killed in turn
        def all_failed():
            for c in running_steps(docker_engine):
                docker_engine.call("kill", c["Id"])
            model = attacker.api("GET", f"/hub/api/users/{attacker.name}").json()
            return not any(f"slow{i}" in model["servers"] for i in range(3))

        wait_for(all_failed, timeout=180)
    quiet.stop_project("calm")
    wait_for(lambda: not running_steps(docker_engine) and not build_networks(docker_engine))


def build_networks(dk) -> list[str]:
    return [n["Name"] for n in dk.call("networks") if n["Name"].startswith(BUILD_NETS)]

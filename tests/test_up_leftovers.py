"""A hub that fails to start, or is killed outright, leaves nothing running.

JupyterHub starts its proxy before it binds its own port and stops it only once it is
running: a hub whose port is taken used to exit with its proxy still running (holding
the proxy's ports). `gpulab up` now stops what the hub left (cli/orphans.py), and
`gpulab down` stops a proxy whose hub was killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from conftest import _EARLY, GPULAB, hub_env

from gpulab_hub import pidfile
from gpulab_hub.cli import orphans

pytestmark = pytest.mark.docker


def processes_naming(text: str) -> list[str]:
    """Live processes whose command line contains ``text`` (pgrep -a -f)."""
    done = subprocess.run(["pgrep", "-a", "-f", "--", text], capture_output=True, text=True)
    return [
        line
        for line in done.stdout.splitlines()
        if int(line.split()[0]) != os.getpid() and pidfile.identity(int(line.split()[0]))
    ]


def proxy_of(env: dict) -> str:
    """What only this hub's proxy has on its command line: its API port."""
    return f"--api-port {env['GPULAB_PROXY_API_PORT']}"


@pytest.fixture
def home(docker_engine, tmp_path):
    for launch in _EARLY:  # the session hub's base image is built first (conftest)
        launch.wait()
    yield tmp_path / "home"


def test_a_hub_whose_port_is_taken_fails_and_leaves_no_proxy(home):
    env = hub_env(home)
    with socket.socket() as taken:  # someone else's program holds the hub's port
        taken.bind(("0.0.0.0", int(env["GPULAB_HUB_PORT"])))
        taken.listen()
        up = subprocess.run([GPULAB, "up"], env=env, capture_output=True, text=True, timeout=300)
    print(up.stdout, up.stderr)
    assert up.returncode != 0
    assert "The hub exited at start" in up.stderr
    assert "Address already in use" in up.stderr  # the hub log's reason, shown
    assert "Stopped what the hub had started" in up.stderr
    assert "configurable-http-proxy" in up.stderr
    assert processes_naming(proxy_of(env)) == []
    assert orphans.services_of(int(env["GPULAB_HUB_PORT"])) == []


def test_down_stops_the_proxy_of_a_killed_hub(home):
    env = hub_env(home, GPULAB_SSH_PORT="0")
    up = subprocess.run([GPULAB, "up"], env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    hub, _ = pidfile.check(home / "hub" / "jupyterhub.pid", "jupyterhub")
    assert hub is not None
    proxy = processes_naming(proxy_of(env))
    assert len(proxy) == 1, proxy
    os.kill(hub.pid, signal.SIGKILL)  # the hub dies outright: no cleanup of its own
    deadline = time.monotonic() + 10
    while pidfile.identity(hub.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(proxy_of(env)) == proxy, "the proxy went with the hub"
    services = orphans.services_of(int(env["GPULAB_HUB_PORT"]))
    assert services, "no service of the hub was running"
    down = subprocess.run([GPULAB, "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "Stopped the proxy a stopped hub had left running" in down.stdout
    assert processes_naming(proxy_of(env)) == []
    assert "Stopped a service a stopped hub had left running" in down.stdout
    assert [p for p in services if pidfile.identity(p)] == []

"""One `gpulab up` of a hub at a time: while one is setting up (minutes: the Docker
engine, the firewall, the base image, before the hub writes its PID file), a second is
refused in words and starts nothing, where both used to start a hub.

In the first test the first is stood in for by a process holding the lock a `gpulab up`
holds from its first step to its last (cli UP_LOCK); in the second, two real ones race."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests
from conftest import _EARLY, GPULAB, hub_env

from gpulab_hub.cli import HUB_PIDFILE, UP_LOCK

HOLD = """
import sys, time
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_gpulab_up_during_the_first_is_refused_and_starts_nothing(tmp_path):
    env = hub_env(tmp_path)
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(hub_dir / UP_LOCK)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        second = subprocess.run([GPULAB, "up"], env=env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 1, second.stdout + second.stderr
    assert "Another `gpulab up` of this hub" in second.stderr
    assert "is under way" in second.stderr
    assert took < 30
    assert not (hub_dir / HUB_PIDFILE).exists()
    assert not (hub_dir / "hub.log").exists()


@pytest.mark.docker
def test_two_gpulab_up_at_once_start_one_hub(docker_engine, tmp_path):
    """Two real `gpulab up` of one hub started together: one sets up and starts the
    hub, the other is refused in words; one hub answers, its log says it started once."""
    for launch in _EARLY:  # the session hub's base image first (conftest.start_hub)
        launch.wait()
    env = hub_env(tmp_path)
    ups = [
        subprocess.Popen([GPULAB, "up"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    try:
        done = [p.communicate(timeout=900) for p in ups]
        codes = sorted(p.returncode for p in ups)
        said = "\n".join(out + err for out, err in done)
        assert codes == [0, 1], said
        refused = next(err for (out, err), p in zip(done, ups, strict=True) if p.returncode)
        assert "Another `gpulab up` of this hub" in refused
        log = (tmp_path / "hub" / "hub.log").read_text(errors="replace")
        assert log.count("JupyterHub is now running") == 1, log[-3000:]
        assert (tmp_path / "hub" / HUB_PIDFILE).exists()
        r = requests.get(env["GPULAB_BIND_URL"] + "/hub/api/", timeout=10)
        assert r.status_code == 200
    finally:
        for p in ups:
            if p.poll() is None:
                p.kill()
        down = subprocess.run([GPULAB, "down"], env=env, capture_output=True, text=True)
        assert down.returncode == 0, down.stderr

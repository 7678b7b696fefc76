"""One `gpulab up` of a hub at a time: while one is setting up (minutes: the Docker
engine, the firewall, the base image, before the hub writes its PID file), a second is
refused in words and starts nothing, where both used to start a hub.

The first is stood in for by a process holding the lock a `gpulab up` holds from its
first step to its last (cli UP_LOCK), as a real one under way does."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import GPULAB, hub_env

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

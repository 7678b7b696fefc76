"""A stale PID file (after a reboot, the number belongs to someone else) never
makes `gpulab down` signal an unrelated process: gpulab records each process's
boot, start time and command line, and signals only while they all match."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulab_hub import host, pidfile

GPULAB = str(Path(sys.executable).parent / "gpulab")
PREFIX = os.environ.get("GPULAB_TEST_PREFIX", "gpulabfault")


@pytest.fixture
def sleepers():
    """Start unrelated processes (`sleep`); each is ended at the end, by its own PID."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        p = subprocess.Popen(["sleep", "300"])
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def gpulab_down(home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPULAB_HOME=str(home), GPULAB_CONTAINER_PREFIX=f"{PREFIX}-pidfile")
    return subprocess.run(
        [GPULAB, "down"], env=env, capture_output=True, text=True, timeout=120, check=True
    )


def test_identity_reads_proc_and_tells_a_reused_pid_apart(sleepers, tmp_path):
    p = sleepers()
    # Popen returns once exec has begun; the kernel sets the new command line a moment
    # later, so an empty one is read for a few milliseconds (pidfile.write waits too).
    me = pidfile.identity(p.pid)
    for _ in range(100):
        if me is None or me.cmdline:
            break
        time.sleep(0.01)
        me = pidfile.identity(p.pid)
    assert me is not None and me.cmdline == ("sleep", "300") and me.start > 0
    path = tmp_path / "x.pid"
    assert pidfile.write(path, p.pid)
    assert pidfile.check(path, "sleep") == (me, "")
    # the same PID, another process (after a reboot; or started later)
    for other in (
        dataclasses.replace(me, boot="an-earlier-boot"),
        dataclasses.replace(me, start=1),
    ):
        pidfile.jsonfile.write_atomic(path, {**dataclasses.asdict(other), "cmdline": ["x"]})
        found, stale = pidfile.check(path, "sleep")
        assert found is None and f"process {p.pid} is now another one" in stale
        assert not host.stop_pid(p.pid, expect=other) and alive(p)


def test_gpulab_down_leaves_an_unrelated_process_alone(sleepers, tmp_path):
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    reused, also_reused = sleepers(), sleepers()
    # gpulab's PID file of old (a bare number), and one recorded before a reboot
    (hub_dir / "gpulab-hub.pid").write_text(str(reused.pid))
    before_reboot = dataclasses.replace(pidfile.identity(also_reused.pid), boot="an-earlier-boot")
    record = {**dataclasses.asdict(before_reboot), "cmdline": ["/usr/sbin/dockerd"]}
    pidfile.jsonfile.write_atomic(hub_dir / "dockerd.pid", record)
    out = gpulab_down(tmp_path).stdout
    assert alive(reused) and alive(also_reused)
    assert f"The hub's PID file was stale, so nothing was signalled: {hub_dir}" in out
    assert f"process {reused.pid} (sleep 300, started" in out and "which is not jupyterhub" in out
    assert "The Docker engine's PID file was stale, so nothing was signalled" in out
    assert f"process {also_reused.pid} is now another one" in out
    assert "Stopped the hub" not in out and "Stopped the Docker engine" not in out
    assert not (hub_dir / "gpulab-hub.pid").exists() and not (hub_dir / "dockerd.pid").exists()


def test_gpulab_down_stops_the_process_it_recorded(sleepers, tmp_path):
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    hub = sleepers()
    assert pidfile.write(hub_dir / "gpulab-hub.pid", hub.pid)
    out = gpulab_down(tmp_path).stdout
    assert "Stopped the hub." in out
    assert hub.wait(timeout=10) == -15  # SIGTERM

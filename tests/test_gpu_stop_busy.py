"""A stop goes on while another hub process holds the GPU records: the queue's cancel
and the GPUs' release, which a project's stop calls before and after stopping its
container, log that the record is busy and return, instead of raising blocking.Busy
(which left the container running: the stop failed before it was stopped).

The record's lock is held by another process, as a second hub process or a long
change holds it."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from gpulab_hub import blocking, jsonfile
from gpulab_hub.gpus import queue, waiting
from gpulab_hub.gpus import spawner as gpu_spawner

HOLD = """
import sys, time
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def held(monkeypatch):
    """hold(path): another process holds ``path``'s lock file until the test ends."""
    monkeypatch.setattr(jsonfile.LockedRecord, "lock_timeout", 0.3)
    procs = []

    def hold(record_path) -> None:
        lock = f"{record_path}.lock"
        p = subprocess.Popen(
            [sys.executable, "-c", HOLD, lock, "30"], stdout=subprocess.PIPE, text=True
        )
        procs.append(p)
        assert p.stdout.readline().strip() == "held"

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def traits(tmp_path) -> gpu_spawner.GpuTraits:
    return gpu_spawner.GpuTraits(
        allocations_file=str(tmp_path / "gpu-allocations.json"),
        queue_file=str(tmp_path / "gpu-queue.json"),
        usage_file=str(tmp_path / "gpu-usage.jsonl"),
    )


def test_a_busy_queue_is_logged_and_the_stop_goes_on(tmp_path, held, caplog):
    s = traits(tmp_path)
    store = queue.QueueStore(tmp_path / "gpu-queue.json")
    with store.locked():
        store._write(store._read())  # a queue file exists: someone waited once
    held(tmp_path / "gpu-queue.json")
    with pytest.raises(blocking.Busy):  # what the stop met before
        with queue.QueueStore(tmp_path / "gpu-queue.json").locked():
            pass
    caplog.set_level(logging.ERROR)
    t0 = time.monotonic()
    assert waiting.cancel(s, "alice", "first") is False
    waiting.leave(s, None, "", "alice", "first")
    assert time.monotonic() - t0 < 5
    assert "not taken out of the queue" in caplog.text and "busy" in caplog.text


def test_busy_gpu_records_are_logged_and_the_release_returns(tmp_path, held, caplog):
    s = traits(tmp_path)
    held(tmp_path / "gpu-allocations.json")
    caplog.set_level(logging.ERROR)
    assert gpu_spawner.release(s, "alice", "first") == []
    assert "GPUs of alice/first not released" in caplog.text and "busy" in caplog.text

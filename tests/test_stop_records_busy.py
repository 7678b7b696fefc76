"""A project's stop stops its container while another process holds the GPU queue's
and the GPU allocations' records (a second hub process, a long change): the stop's
record work logs that the record is busy and the container goes anyway. Before, a
helper documented "never raises" let the lock's refusal (blocking.Busy) escape, and
the stop failed before the container was stopped, its GPUs held on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from security.people import log_in_admin, make_user

from gpulab_hub import layout
from gpulab_hub.gpus import allocator, queue

HOLD = """
import sys, time
from filelock import FileLock
locks = [FileLock(p) for p in sys.argv[1:]]
for lock in locks:
    lock.acquire()
print("held", flush=True)
time.sleep(600)
"""
OWNER, PROJECT = "stopheld", "held"


def containers(dk, name: str) -> list[dict]:
    return dk.call("containers", all=True, filters={"name": f"{OWNER}--{name}"})


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_a_stop_while_the_gpu_records_are_held_leaves_no_container_running(hub, docker_engine):
    admin = log_in_admin(hub)
    user = make_user(hub, admin, OWNER)
    user.start_project(PROJECT)
    assert containers(docker_engine, PROJECT), "the project's container did not start"
    # The queue has a record (a start waited once), as on any hub that queued a start.
    record = hub.home / "hub" / layout.QUEUE
    waiting = queue.QueueStore(record)
    waiting.enqueue(allocator.Request(owner="someone", project="else", count=1))
    waiting.cancel("someone", "else")
    allocations = hub.home / "hub" / "gpu-allocations.json"
    locks = [f"{record}.lock", f"{allocations}.lock"]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, *locks], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        r = user.api("DELETE", f"/hub/api/users/{OWNER}/servers/{PROJECT}")
        assert r.status_code in (202, 204), r.text
        deadline = time.monotonic() + 120
        while True:
            model = user.api("GET", f"/hub/api/users/{OWNER}?include_stopped_servers=1").json()
            server = model["servers"].get(PROJECT, {})
            if not server.get("ready") and not server.get("pending"):
                break
            assert time.monotonic() < deadline, f"the stop did not end: {server}"
            time.sleep(0.5)
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert containers(docker_engine, PROJECT) == [], "the container outlived its stop"
    log = hub.log
    assert f"GPU queue: {OWNER}/{PROJECT} not taken out of the queue" in log
    assert f"GPUs of {OWNER}/{PROJECT} not released" in log
    print(f"\nthe stop with both records held took {took:.1f} s")

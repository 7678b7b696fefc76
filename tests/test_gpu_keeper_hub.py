"""The GPU keeper against the real hub: a queued start the hub does not know of (as
after a hub restart) is started by itself, and an entry for a project that does not
exist leaves the queue. CPU only: the entries ask for 0 GPUs, so the start runs
through the hub's real start path without GPUs to queue for."""

from __future__ import annotations

import time

import pytest
from security.people import log_in_admin, make_user

from gpulab_hub.gpus import queue
from gpulab_hub.gpus.allocator import Request

NAME = "keeperkim"


def server(user, project: str) -> dict | None:
    return user.api("GET", f"/hub/api/users/{user.name}").json()["servers"].get(project)


@pytest.mark.docker
def test_a_queued_start_the_hub_forgot_starts_by_itself_and_a_gone_one_is_cancelled(hub):
    admin = log_in_admin(hub)
    kim = make_user(hub, admin, NAME)
    kim.start_project("queued")  # its image built once
    kim.stop_project("queued")
    q = queue.QueueStore(hub.home / "hub" / "gpu-queue.json")
    q.enqueue(Request(NAME, "queued", 0))
    q.enqueue(Request(NAME, "gone", 0))  # no such project
    deadline = time.monotonic() + 30
    while not server(kim, "queued"):
        assert time.monotonic() < deadline, "the keeper did not start the queued project"
        time.sleep(0.5)
    assert kim.wait_ready("queued", timeout=300)["ready"]
    deadline = time.monotonic() + 30
    while [e for e in q.entries() if e.owner == NAME]:
        assert time.monotonic() < deadline, f"entries left in the queue: {q.entries()}"
        time.sleep(0.5)
    assert server(kim, "gone") is None  # never started
    kim.stop_project("queued")

"""One rule for blocking work (gpulab_hub/blocking.py): store locks and Docker calls never
run on the event loop's thread, and a lock held too long ends in words for the user.

The tests run with GPULAB_LOOP_GUARD=strict (conftest.py), as do the hubs they start."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import threading
import time
import types

import docker.errors
import pytest
import requests
from filelock import FileLock
from hubclient import HubUser

from gpulab_hub import blocking, host, jsonfile

SSH_BUSY_WORDS = (
    "The SSH keys record is busy: another change to the SSH keys record is under way; try "
    "again in a moment."
)
BUSY_WORDS = (
    "The notes record is busy: another change to the notes record is under way; try "
    "again in a moment."
)


class SharingPolicyStore(jsonfile.LockedRecord):
    """A record of the hub's folder, as the stores kept in files are (jsonfile.py):
    ``{"alice/one": {"collaborators_may_start": true}}``."""

    what = "The notes record"

    def set(self, owner: str, project: str, **values: bool) -> None:
        with self.locked():
            records = self._read()
            records[f"{owner}/{project}"] = values
            self._write(records)

    def get(self, owner: str, project: str):
        with self.locked():
            found = self._read().get(f"{owner}/{project}", {})
        return types.SimpleNamespace(collaborators_may_start=found.get("collaborators_may_start"))


def test_the_tests_run_with_the_strict_guard():
    assert os.environ["GPULAB_LOOP_GUARD"] == "strict"


def test_a_store_locked_on_the_event_loop_fails_and_off_it_works(tmp_path):
    store = SharingPolicyStore(tmp_path / "sharing.json")

    async def on_the_loop():
        return store.set("alice", "one", collaborators_may_start=True)

    with pytest.raises(blocking.OnLoop, match="on the event-loop thread"):
        asyncio.run(on_the_loop())
    assert not (tmp_path / "sharing.json").exists()  # nothing was written

    async def on_the_records_pool():
        await blocking.run(
            blocking.RECORDS, store.set, "alice", "one", collaborators_may_start=True
        )
        return await blocking.run(blocking.RECORDS, store.get, "alice", "one")

    assert asyncio.run(on_the_records_pool()).collaborators_may_start is True


def test_the_docker_client_is_never_made_on_the_event_loop(tmp_path):
    """Its constructor asks the engine's version: on the loop, the guard stops it before
    any connection; off the loop it only fails to reach an engine that is not there."""
    nowhere = f"unix://{tmp_path}/no-docker.sock"

    async def make():
        return host.docker_client(base_url=nowhere)

    with pytest.raises(blocking.OnLoop):
        asyncio.run(make())
    with pytest.raises(docker.errors.DockerException):
        host.docker_client(base_url=nowhere)


def test_the_warning_mode_lets_it_through_and_says_so_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("GPULAB_LOOP_GUARD", "warn")
    store = SharingPolicyStore(tmp_path / "sharing.json")

    async def twice():
        store.get("alice", "one")
        store.get("alice", "two")

    asyncio.run(twice())
    said = [r.getMessage() for r in caplog.records if "event-loop thread" in r.getMessage()]
    assert len(said) <= 1  # once per kind of work (none if an earlier test said it already)


def _hold(path: str, ready, release) -> None:
    with FileLock(path):
        ready.set()
        release.wait(30)


def test_a_lock_held_elsewhere_ends_in_a_sentence_not_a_hang(tmp_path):
    """Another process (another hub, a stuck CLI) holds the record: the change gives up
    after the store's timeout with words a page shows as they are, and writes nothing."""

    class QuickStore(SharingPolicyStore):
        lock_timeout = 0.5

    store = QuickStore(tmp_path / "sharing.json")
    store.set("alice", "one", collaborators_may_start=True)
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path / "sharing.json.lock"), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        started = time.monotonic()
        with pytest.raises(blocking.Busy) as caught:
            store.set("alice", "one", collaborators_may_start=False)
        assert time.monotonic() - started < 5
        assert str(caught.value) == BUSY_WORDS
        assert caught.value.status_code == 503  # a page shows it as 503, in these words
    finally:
        release.set()
        holder.join(30)
    assert store.get("alice", "one").collaborators_may_start is True  # unchanged
    store.set("alice", "one", collaborators_may_start=False)  # free again: it works
    assert store.get("alice", "one").collaborators_may_start is False


def test_a_lock_held_by_another_thread_times_out_too(tmp_path):
    class QuickStore(SharingPolicyStore):
        lock_timeout = 0.3

    store = QuickStore(tmp_path / "sharing.json")
    held, done = threading.Event(), threading.Event()

    def hold():
        with store.locked():
            held.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        with pytest.raises(blocking.Busy, match="is busy: another change"):
            store.get("alice", "one")
    finally:
        done.set()
        t.join()


def test_pools_are_named_bounded_and_made_on_first_use():
    async def where():
        return threading.current_thread().name

    async def main():
        names = {}
        for pool in (blocking.DOCKER, blocking.BUILDS, blocking.RECORDS, blocking.PUBLIC):
            names[pool] = await blocking.run(pool, lambda: threading.current_thread().name)
        return names

    names = asyncio.run(main())
    for pool, name in names.items():
        assert name.startswith(f"gpulab-{pool}_")
        assert blocking.pool(pool)._max_workers == blocking._sizes.get(pool, blocking.SIZES[pool])
    with pytest.raises(KeyError, match="gpulab's pools are"):
        blocking.pool("everything")


# --- in a real hub --------------------------------------------------------------------


@pytest.mark.docker
def test_a_page_whose_record_is_held_answers_503_in_words_and_the_hub_keeps_serving(hub):
    """The SSH keys record (a file of the hub's folder) is held by another process: a
    change on the SSH page says so (503, in words, after the lock's timeout) and, while
    it waits, the hub answers other requests at once (the wait is on the records pool,
    not the loop)."""
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    page = admin.http.get(f"{hub.url}/hub/gpulab/ssh", timeout=30)
    assert page.status_code == 200
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
    form = {"_xsrf": xsrf, "action": "delete", "fingerprint": "SHA256:" + "A" * 43}
    keys = hub.home / "hub" / "ssh" / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(keys / ".keys.lock"))
    with lock:
        result = {}

        def change():
            result["page"] = admin.http.post(f"{hub.url}/hub/gpulab/ssh", data=form, timeout=60)

        t = threading.Thread(target=change)
        t.start()
        time.sleep(1)  # the change now waits for the lock
        quick = time.monotonic()
        assert requests.get(f"{hub.url}/hub/api/", timeout=10).status_code == 200
        assert time.monotonic() - quick < 2, "the hub stopped answering while a page waited"
        t.join(60)
    page = result["page"]
    assert page.status_code == 503, page.text[:500]
    assert SSH_BUSY_WORDS in page.text
    assert "Traceback" not in page.text
    # Free again: the change is done (there was no such key to delete: 404, in words).
    again = admin.http.post(f"{hub.url}/hub/gpulab/ssh", data=form, timeout=30)
    assert again.status_code == 404 and "You have no key SHA256:" in again.text

"""The admin overview on the hub in-process (pagehub.py): what an admin reads there
(a sign-up waiting, a stopped project, a GPU holding and a queued start as their
stores wrote them, disk use) and what each action answers: approve, stop of a
project that is not running, delete (asked first, then gpulab's deletion, which
archives the files). The page in Chromium, with a running project:
tests/test_browser_admin.py."""

from __future__ import annotations

import asyncio
import html
import re

from pages_fixtures import OWNER, PROJECT, TITLE

from gpulab_hub import gpus, hubsettings
from gpulab_hub.gpus import allocator, queue

pytest_plugins = ("pages_fixtures",)  # the in-process hub's fixtures

PAGE = "/hub/gpulab/admin"
WAITING = "erin"
UUID = "GPU-0000aaaa-1111-2222-3333-444455556666"


def records(home) -> None:
    """alice's project holds a GPU (one this host does not have); bob's start waits."""
    layout = hubsettings.default_layout(home)
    device = gpus.Device(index="0", uuid=UUID, name="NVIDIA H100 80GB HBM3",
                         memory_total=80 << 30, capability="9.0")  # fmt: skip
    store = allocator.AllocationStore(layout.allocations_file)
    store.allocate([device], allocator.Request(OWNER, PROJECT, count=1), allocator.Policy())
    queue.QueueStore(layout.queue_file).enqueue(allocator.Request("bob", "big", count=2))
    (home / "projects" / OWNER / PROJECT / "weights.bin").write_bytes(b"\1" * (2 << 20))


def said(text: str) -> str:
    m = re.search(r'id="admin-said">([^<]*)<', text)
    return html.unescape(m.group(1)) if m else ""


async def test_the_admin_reads_what_runs_and_approves_stops_and_deletes(pages):
    await pages.project(OWNER, PROJECT, TITLE)
    await asyncio.to_thread(records, pages.home)
    pages.user("bob")
    assert pages.app.authenticator.create_user(WAITING, "a long passphrase 4 erin") is not None

    page = await pages.get(PAGE, "admin")
    assert page.code == 200, page.text[:500]
    text = page.text
    assert f'class="admin-waiting" data-user="{WAITING}"' in page.body and "Approve" in text
    assert f'data-owner="{OWNER}" data-project="{PROJECT}" data-state="stopped"' in page.body
    assert f"a GPU not seen on this host now ({UUID})" in text
    assert "bob" in text and "2 GPUs" in text  # the queued start
    disk = re.search(
        rf'data-user="{OWNER}">.*?class="text-end disk"[^>]*>([^<]*)<', page.body, re.S
    )
    assert disk and disk.group(1).endswith("MiB"), disk and disk.group(1)

    approved = await pages.post_form(PAGE, "admin", {"action": "approve", "name": WAITING})
    assert approved.code == 200
    assert (
        said(approved.body) == f"Approved the account \u201c{WAITING}\u201d: they can log in now."
    )
    assert f'data-user="{WAITING}"' in approved.body  # now a hub user
    assert 'class="admin-waiting"' not in approved.body

    stop = {"action": "stop", "owner": OWNER, "project": PROJECT}
    stopped = await pages.post_form(PAGE, "admin", stop)
    assert said(stopped.body) == (
        f"Nothing to stop: {OWNER}'s project \u201c{PROJECT}\u201d was not running."
    )

    unknown = await pages.post_form(PAGE, "admin", {**stop, "project": "nothing"})
    assert unknown.code == 404
    assert f"{OWNER} has no project named \u201cnothing\u201d." in unknown.text

    delete = {"action": "delete", "owner": OWNER, "project": PROJECT}
    asked = await pages.post_form(PAGE, "admin", delete)
    assert f"Delete {OWNER}'s project &ldquo;{PROJECT}&rdquo;?" in asked.body
    assert (pages.home / "projects" / OWNER / PROJECT).is_dir()  # nothing deleted yet
    deleted = await pages.post_form(PAGE, "admin", {**delete, "confirm": "yes"})
    assert re.fullmatch(
        rf"Deleted {OWNER}'s project \u201c{PROJECT}\u201d\. Its files were moved to the hub's "
        rf"archive as deleted/{OWNER}-\d{{8}}T\d{{6}}Z; you can restore them from there\.",
        said(deleted.body),
    ), said(deleted.body)
    assert not (pages.home / "projects" / OWNER / PROJECT).exists()
    assert f'data-project="{PROJECT}"' not in deleted.body
    assert f"a GPU not seen on this host now ({UUID})" not in deleted.body  # its GPU is free

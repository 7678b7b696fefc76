"""The admin overview /hub/gpulab/admin: what the page reads off the event loop, on
real files and real records (the GPU allocation record and queue written by their
own stores; project folders with links, hard links and a FIFO planted as a hostile
user would). The page itself, in Chromium: test_browser_admin.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpulab_hub import gpus, hubsettings
from gpulab_hub.admin import facts
from gpulab_hub.gpus import allocator, queue

H100 = "NVIDIA H100 80GB HBM3"
UUID0 = "GPU-0000aaaa-1111-2222-3333-444455556666"
UUID1 = "GPU-1111bbbb-1111-2222-3333-444455556666"
DEVICES = [
    gpus.Device(index="0", uuid=UUID0, name=H100, memory_total=80 << 30, capability="9.0"),
    gpus.Device(index="1", uuid=UUID1, name=H100, memory_total=80 << 30, capability="9.0"),
]
LABELS = {UUID0: f"GPU 0 ({H100})", UUID1: f"GPU 1 ({H100})"}
MIB = 1 << 20


def settings(tmp_path: Path) -> hubsettings.Layout:
    return hubsettings.Layout(
        records_dir=tmp_path / "hub",
        projects_root=tmp_path / "projects",
        data_root=tmp_path / "data",
        state_root=tmp_path / "hub" / "projects",
        allocations_file=tmp_path / "hub" / "gpu-allocations.json",
        image_repo="gpulab/project",
        base_image="gpulab/base:latest",
        allowed_base_images=("gpulab/base:latest",),
        prefix="gpulab",
        network="gpulab-net",
        queue_file=tmp_path / "hub" / "gpu-queue.json",
    )


# --- the records: who holds which GPU since when, who waits ---


def test_holdings_and_the_queue_as_their_stores_wrote_them(tmp_path):
    w = settings(tmp_path)
    t0 = time.time() - 3600
    store = allocator.AllocationStore(w.allocations_file, clock=lambda: t0)
    store.allocate(DEVICES, allocator.Request("alice", "train", count=1), allocator.Policy())
    later = allocator.AllocationStore(w.allocations_file, clock=lambda: t0 + 600)
    later.allocate(DEVICES, allocator.Request("bob", "sweep", count=1), allocator.Policy())
    q = queue.QueueStore(w.queue_file, clock=lambda: t0 + 1200)
    q.enqueue(allocator.Request("carol", "big", count=2))
    q2 = queue.QueueStore(w.queue_file, clock=lambda: t0 + 1300)
    q2.enqueue(allocator.Request("dana", "slice", mig_profile="1g.10gb"))

    r = facts.records(w, labels=lambda: LABELS)
    assert [(h.label, h.owner, h.project, h.since) for h in r.holdings] == [
        (f"GPU 0 ({H100})", "alice", "train", t0),
        (f"GPU 1 ({H100})", "bob", "sweep", t0 + 600),
    ]
    assert r.holdings[0].since_iso == time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))
    assert [h.label for h in r.held_by("alice", "train")] == [f"GPU 0 ({H100})"]
    assert r.held_by("alice", "other") == []
    assert [(e.owner, e.project, e.asks) for e in r.queued] == [
        ("carol", "big", "2 GPUs"),
        ("dana", "slice", "a 1g.10gb MIG slice"),
    ]
    assert r.problems == () and r.kept_free == ()


def test_a_gpu_kept_free_for_the_queue_and_a_gpu_gone_from_the_host(tmp_path):
    w = settings(tmp_path)
    store = allocator.AllocationStore(w.allocations_file)
    store.allocate(DEVICES, allocator.Request("alice", "train", count=2), allocator.Policy())
    raw = w.allocations_file.read_text()
    # the keeper's placeholder for a waiting start, as gpus/queue.py records it
    placeholder = f'"owner": "{queue.RESERVED}"'
    w.allocations_file.write_text(raw.replace('"owner": "alice"', placeholder, 1))
    r = facts.records(w, labels=lambda: {UUID1: LABELS[UUID1]})  # GPU 0 left the host
    assert [(h.owner, h.label) for h in r.holdings] == [("alice", f"GPU 1 ({H100})")]
    assert r.kept_free == (f"a GPU not seen on this host now ({UUID0})",)


def test_a_damaged_record_is_said_and_the_rest_still_shows(tmp_path):
    w = settings(tmp_path)
    w.allocations_file.parent.mkdir(parents=True)
    w.allocations_file.write_text("{not json")
    queue.QueueStore(w.queue_file).enqueue(allocator.Request("carol", "big", count=1))
    r = facts.records(w, labels=lambda: LABELS)
    assert r.holdings == ()
    assert len(r.problems) == 1
    assert r.problems[0].startswith("The GPU allocation record cannot be read:")
    assert "damaged" in r.problems[0]
    assert [(e.owner, e.asks) for e in r.queued] == [("carol", "1 GPU")]


def test_no_record_yet_is_an_empty_overview(tmp_path):
    r = facts.records(settings(tmp_path), labels=dict)
    assert (r.holdings, r.queued, r.problems, r.kept_free) == ((), (), (), ())


# --- disk use: bounded, no link followed ---


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))


def test_disk_use_counts_the_users_files_once_and_follows_no_link(tmp_path):
    root = tmp_path / "projects"
    write(root / "alice" / "train" / "work" / "weights.bin", 3 * MIB)
    write(root / "alice" / "eval" / "Dockerfile", 100)
    (root / "alice" / "eval" / "deep" / "er").mkdir(parents=True)
    # a hard link of the weights: the same blocks, counted once
    os.link(root / "alice" / "train" / "work" / "weights.bin", root / "alice" / "eval" / "w2")
    # what an attacker plants: a link to a big folder outside, a link to a big file, a FIFO
    write(tmp_path / "outside" / "huge.bin", 8 * MIB)
    os.symlink(tmp_path / "outside", root / "alice" / "train" / "escape")
    os.symlink(tmp_path / "outside" / "huge.bin", root / "alice" / "train" / "big")
    os.mkfifo(root / "alice" / "train" / "pipe")

    disk = facts.measure(root, "alice")
    assert disk.complete and disk.note == ""
    assert 3 * MIB <= disk.used < 4 * MIB  # not the 8 MiB behind the links, nor twice 3 MiB
    assert disk.words.endswith("MiB") and not disk.words.startswith("at least")
    assert disk.entries == 11  # 2 projects, work, weights, Dockerfile, deep, er, w2, 2 links, fifo


def test_a_user_folder_that_is_a_link_is_not_walked(tmp_path):
    root = tmp_path / "projects"
    write(tmp_path / "elsewhere" / "secret.bin", 2 * MIB)
    root.mkdir()
    os.symlink(tmp_path / "elsewhere", root / "mallory")
    disk = facts.measure(root, "mallory")
    assert (disk.used, disk.complete) == (0, False)
    assert disk.note == "the user's folder is not counted: it is a link"
    nobody = facts.measure(root, "nobody")  # no folder yet: nothing used
    assert (nobody.used, nobody.complete, nobody.words) == (0, True, "nothing yet")


def test_a_walk_stops_at_its_cap_and_says_at_least(tmp_path):
    root = tmp_path / "projects"
    for n in range(30):
        write(root / "bob" / "p" / f"f{n:02}", 4096)
    disk = facts.measure(root, "bob", max_entries=10)
    assert not disk.complete
    assert disk.note == "stopped counting after 10 files and folders"
    assert disk.words.startswith("at least ")
    slow = facts.measure(root, "bob", max_seconds=-1)
    assert slow.note.startswith("stopped counting after") and slow.note.endswith(" s")


def test_the_disk_figure_is_kept_a_minute(tmp_path):
    root = tmp_path / "projects"
    write(root / "carol" / "p" / "a", 1 * MIB)
    now = [1000.0]
    cache = facts.DiskCache(ttl=60, clock=lambda: now[0])
    first = cache.used(root, ["carol"])["carol"]
    write(root / "carol" / "p" / "b", 2 * MIB)
    now[0] += 59
    assert cache.used(root, ["carol"])["carol"] == first  # not walked again
    now[0] += 2
    assert cache.used(root, ["carol"])["carol"].used > first.used + MIB
    write(root / "carol" / "p" / "c", 2 * MIB)
    cache.forget("carol")
    assert cache.used(root, ["carol"])["carol"].used > first.used + 3 * MIB

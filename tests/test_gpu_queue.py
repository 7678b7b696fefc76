"""The GPU wait queue: fair-share order and grants as pure logic, and its store on a
real file under several processes at once (no GPU, no Docker)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab_hub.gpus import Device
from gpulab_hub.gpus.allocator import (
    AllocationError,
    AllocationStore,
    Holder,
    Policy,
    Request,
    choose,
)
from gpulab_hub.gpus.queue import (
    Blocker,
    Entry,
    Grant,
    QueueError,
    QueueStore,
    blockers,
    next_grant,
    order,
    waiting_words,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
T0 = 1_750_000_000.0


def gpu(i: int, name: str = H100) -> Device:
    return Device(str(i), f"GPU-{i:04d}", name, 80 << 30, "9.0")


def wait(owner: str, project: str, t: float, count: int = 1, gpu_type: str = "") -> Entry:
    return Entry(Request(owner, project, count, gpu_type), T0 + t)


def held_by(*pairs: tuple[int, str]) -> dict:
    return {f"GPU-{i:04d}": (Holder(who, "p", T0),) for i, who in pairs}


# --- words ---------------------------------------------------------------------------


def test_waiting_words_name_place_and_holders_to_an_admin():
    b = Blocker("GPU 1", "bob", "sweep", idle_min=35.4)
    assert waiting_words(2, [b], "root", admin=True) == (
        "waiting for a GPU: 2 ahead; GPU 1 is held by bob/sweep (idle 35 min)"
    )
    assert waiting_words(0, [Blocker("GPU 0", "alice", "train"), b], admin=True) == (
        "waiting for a GPU: next in line; GPU 0 is held by alice/train (in use); "
        "GPU 1 is held by bob/sweep (idle 35 min)"
    )
    job = [Blocker("GPU 0", "carol", "fit", idle_min=90, job=True)]
    assert waiting_words(1, job, admin=True) == (
        "waiting for a GPU: 1 ahead; GPU 0 is held by carol/fit (running a job)"
    )
    many = [Blocker(f"GPU {i}", f"u{i}", "p") for i in range(6)]
    assert waiting_words(3, many, admin=True).endswith("GPU 3 is held by u3/p (in use); and 2 more")
    assert waiting_words(0) == "waiting for a GPU: next in line"
    with pytest.raises(ValueError):
        waiting_words(-1)


def test_waiting_words_name_no_other_users_project_to_anyone_else():
    """docs/security.md: only admins see others' GPU use. A user is told her own
    projects by name, another user's as "another project" (idle minutes kept: they say
    a reclaim may come)."""
    holders = [
        Blocker("GPU 1", "victim", "acquisition-due-diligence", idle_min=12.7),
        Blocker("GPU 0", "mallory", "one"),
        Blocker("GPU 2", "bob", "fit", idle_min=90, job=True),
        Blocker("GPU 3", "carol", "train", idle_min=40),
    ]
    words = waiting_words(1, holders, "carol")
    assert words == (
        "waiting for a GPU: 1 ahead; GPU 1 is in use by another project, idle 12 min; "
        "GPU 0 is in use by another project; GPU 2 is in use by another project, "
        "running a job; GPU 3 is held by carol/train (idle 40 min)"
    )
    for name in ("victim", "acquisition", "mallory", "one", "bob", "fit"):
        assert name not in words
    assert waiting_words(1, holders) == waiting_words(1, holders, "nobody")  # safe default


def test_the_holders_in_a_refusals_way_become_the_words_of_the_spawn_page():
    devices = [gpu(0), gpu(1)]
    held = {"GPU-0000": (Holder("alice", "train", T0),), "GPU-0001": (Holder("bob", "sweep", T0),)}
    with pytest.raises(AllocationError) as refused:
        choose(devices, held, Request("cat", "p", 1), Policy())
    who = blockers(refused.value.busy, {("bob", "sweep"): 35.0}, jobs=[("alice", "train")])
    assert waiting_words(2, who, "cat", admin=True) == (
        "waiting for a GPU: 2 ahead; GPU 0 is held by alice/train (running a job); "
        "GPU 1 is held by bob/sweep (idle 35 min)"
    )
    assert waiting_words(2, who, "cat") == (
        "waiting for a GPU: 2 ahead; GPU 0 is in use by another project, running a job; "
        "GPU 1 is in use by another project, idle 35 min"
    )
    # the refusal itself, as the spawner tells it with the queue off: names for an
    # admin, "another project" for anyone else
    assert "alice/train since" in refused.value.told(admin=True)
    assert refused.value.told(admin=False) == (
        "cat/p asked for 1 GPU, but 0 of 2 GPUs are free (none). "
        f"GPU 0 ({H100}) is held by another project; GPU 1 ({H100}) is held by another project."
    )


# --- order and grants (pure) ---------------------------------------------------------


def test_order_is_budget_then_least_usage_then_first_come():
    a, b, c, d = wait("ann", "p", 0), wait("bob", "p", 1), wait("cat", "p", 2), wait("dan", "p", 2)
    usage = {"ann": 9.0, "bob": 1.0, "cat": 1.0, "dan": 0.5}
    assert order([a, b, c, d], usage) == [d, b, c, a]
    assert order([a, b, c, d], usage, over_budget={"dan"}) == [b, c, a, d]
    assert order([a, b, c, d], {}) == [a, b, c, d]  # FIFO; equal times keep arrival order
    assert order([a, b, d, c], {}) == [a, b, d, c]


def test_next_grant_serves_the_lightest_user_first():
    devices = [gpu(0), gpu(1)]
    q = [wait("heavy", "p", 0), wait("light", "p", 5), wait("mid", "p", 9)]
    got = next_grant(q, devices, held_by((0, "x")), Policy(), {"heavy": 30, "mid": 2})
    assert got == [Grant(q[1], (gpu(1),))]
    # both GPUs free: the two lightest, each its own GPU
    got = next_grant(q, devices, {}, Policy(), {"heavy": 30, "mid": 2})
    assert got == [Grant(q[1], (gpu(0),)), Grant(q[2], (gpu(1),))]
    # the over-budget user gets a GPU nobody else in the queue wants
    got = next_grant(q[:1], devices, {}, Policy(), {"heavy": 30}, over_budget={"heavy"})
    assert got == [Grant(q[0], (gpu(0),))]


def test_a_waiting_two_gpu_start_is_not_starved_by_one_gpu_starts_behind_it():
    devices = [gpu(0), gpu(1), gpu(2)]
    big, small = wait("ann", "big", 0, count=2), wait("bob", "small", 1)
    held = held_by((0, "x"), (1, "y"))
    assert next_grant([big, small], devices, held, Policy(), {}) == []  # GPU 2 kept for big
    held = {}
    assert next_grant([big, small], devices, held, Policy(), {}) == [
        Grant(big, (gpu(0), gpu(1))),
        Grant(small, (gpu(2),)),
    ]


def test_a_start_this_host_can_never_serve_does_not_hold_up_the_others():
    devices = [gpu(0), gpu(1, A100)]
    policy = Policy(allowed_types=("H100", "A100"))
    never = wait("ann", "three", 0, count=3)  # this host has 2 GPUs
    a100 = wait("bob", "a", 1, gpu_type="A100")
    h100 = wait("cat", "h", 2, gpu_type="H100")
    got = next_grant([never, a100, h100], devices, held_by((1, "x")), policy, {})
    assert got == [Grant(h100, (gpu(0),))]  # the A100 start waits for its own kind only


ENTRIES = st.lists(
    st.builds(
        lambda o, p, c, t: wait(f"u{o}", f"p{p}", t, c),
        st.integers(0, 3),
        st.integers(0, 5),
        st.integers(0, 2),
        st.integers(0, 50),
    ),
    max_size=8,
    unique_by=lambda e: e.key,
)


@settings(max_examples=150, deadline=None)
@given(
    entries=ENTRIES,
    n_gpus=st.integers(1, 4),
    busy=st.sets(st.integers(0, 3)),
    usage=st.dictionaries(st.sampled_from(["u0", "u1", "u2", "u3"]), st.floats(0, 50)),
)
def test_grants_never_double_book_and_serve_the_first_in_line_that_fits(
    entries, n_gpus, busy, usage
):
    devices = [gpu(i) for i in range(n_gpus)]
    held = held_by(*((i, "other") for i in busy if i < n_gpus))
    grants = next_grant(entries, devices, held, Policy(), usage)
    given_out = [d.uuid for g in grants for d in g.devices]
    assert len(given_out) == len(set(given_out))  # no GPU to two starts
    assert not set(given_out) & set(held)  # nor one somebody holds
    for g in grants:
        assert len(g.devices) == g.entry.request.count
    first = order(entries, usage)[:1]
    if first:
        try:
            choose(devices, held, first[0].request, Policy())
            fits = True
        except AllocationError:
            fits = False
        assert fits == (first[0] in [g.entry for g in grants])


# --- the store -----------------------------------------------------------------------


def test_enqueue_cancel_position_and_restart(tmp_path):
    t = [T0]
    path = tmp_path / "gpu-queue.json"
    q = QueueStore(path, clock=lambda: t[0])
    for who in ("ann", "bob", "cat"):
        t[0] += 10
        q.enqueue(Request(who, "p", 1))
    assert q.position("cat", "p") == 2
    assert q.position("cat", "p", usage={"ann": 5, "bob": 5}) == 0  # fair share: cat first
    assert q.position("dan", "p") is None
    # asking again changes the request and keeps the place
    again = q.enqueue(Request("ann", "p", 2))
    assert again == Entry(Request("ann", "p", 2), T0 + 10)
    assert q.cancel("bob", "p") is True
    assert q.cancel("bob", "p") is False
    # a "restart": a new store object on the same file finds the queue as it was
    assert QueueStore(path).entries() == [
        Entry(Request("ann", "p", 2), T0 + 10),
        Entry(Request("cat", "p", 1), T0 + 30),
    ]
    assert QueueStore(path).position("cat", "p") == 1


def test_names_that_are_not_names_are_refused(tmp_path):
    q = QueueStore(tmp_path / "q.json")
    for bad in (Request("../x", "p", 1), Request("a", "p\n", 1), Request("a", "p", -1)):
        with pytest.raises(QueueError):
            q.enqueue(bad)
    assert q.entries() == []


def test_a_damaged_queue_file_is_moved_aside_and_the_hub_goes_on(tmp_path, caplog):
    path = tmp_path / "gpu-queue.json"
    path.write_text('{"version": 1, "queue": [{"owner": "ann"')  # torn by a crash
    with caplog.at_level(logging.ERROR, logger="gpulab_hub"):
        assert QueueStore(path).entries() == []
    assert len(list(tmp_path.glob("gpu-queue.json.corrupt-*"))) == 1
    assert "The GPU queue" in caplog.text and "started again" in caplog.text


def test_a_link_in_the_queue_files_place_is_never_followed(tmp_path):
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps({"version": 1, "queue": []}))
    path = tmp_path / "gpu-queue.json"
    path.symlink_to(secret)
    q = QueueStore(path)
    q.enqueue(Request("ann", "p", 1))
    assert json.loads(secret.read_text()) == {"version": 1, "queue": []}
    assert not path.is_symlink() and q.entries()[0].owner == "ann"


def test_grant_records_the_gpus_and_takes_the_entry_out(tmp_path):
    devices = [gpu(0), gpu(1)]
    allocs = AllocationStore(tmp_path / "gpu-allocations.json", clock=lambda: T0)
    allocs.allocate(devices, Request("x", "p", 1), Policy())  # GPU 0 is held
    q = QueueStore(tmp_path / "gpu-queue.json", clock=lambda: T0)
    q.enqueue(Request("ann", "a", 1))
    q.enqueue(Request("bob", "b", 1))
    got = q.grant(allocs, devices, Policy(), usage={"ann": 3.0})
    assert [(g.entry.owner, [d.uuid for d in g.devices]) for g in got] == [("bob", ["GPU-0001"])]
    assert allocs.held_by("bob", "b") == ["GPU-0001"]
    assert [e.owner for e in QueueStore(q.path).entries()] == ["ann"]
    allocs.release("x", "p")
    got = q.grant(allocs, devices, Policy(), usage={"ann": 3.0})
    assert [(g.entry.owner, [d.uuid for d in g.devices]) for g in got] == [("ann", ["GPU-0000"])]
    assert q.entries() == []


def _hub(args) -> list[tuple[str, str, list[str]]]:
    """One hub process: enqueue its starts, serving the queue after each and at the end."""
    folder, devices, hub, n = args
    q = QueueStore(Path(folder) / "gpu-queue.json")
    allocs = AllocationStore(Path(folder) / "gpu-allocations.json")
    got = []
    for i in range(n + 1):
        if i < n:
            q.enqueue(Request(hub, f"p{i}", 1))
        for g in q.grant(allocs, devices, Policy(), usage={}):
            got.append((g.entry.owner, g.entry.project, [d.uuid for d in g.devices]))
    return got


def test_processes_enqueueing_and_granting_at_once_lose_nothing_and_grant_nothing_twice(
    tmp_path,
):
    devices = [gpu(i) for i in range(3)]
    hubs, per_hub = 4, 8
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(hubs) as pool:
        first = pool.map(_hub, [(str(tmp_path), devices, f"hub{h}", per_hub) for h in range(hubs)])
    granted = [g for out in first for g in out]
    assert sorted(u for *_, uuids in granted for u in uuids) == [d.uuid for d in devices]
    waiting = QueueStore(tmp_path / "gpu-queue.json").entries()  # a new store: a restart
    keys = [(o, p) for o, p, _ in granted] + [e.key for e in waiting]
    assert sorted(keys) == sorted((f"hub{h}", f"p{i}") for h in range(hubs) for i in range(per_hub))
    # every holder stops; several hubs serve the queue again at once
    allocs = AllocationStore(tmp_path / "gpu-allocations.json")
    for o, p, _ in granted:
        allocs.release(o, p)
    with ctx.Pool(hubs) as pool:
        second = pool.map(_hub, [(str(tmp_path), devices, f"hub{h}", 0) for h in range(hubs)])
    again = [g for out in second for g in out]
    assert sorted(u for *_, uuids in again for u in uuids) == [d.uuid for d in devices]
    assert not {(o, p) for o, p, _ in again} & {(o, p) for o, p, _ in granted}
    left = QueueStore(tmp_path / "gpu-queue.json").entries()
    assert len(left) == hubs * per_hub - 2 * len(devices)
    record = AllocationStore(tmp_path / "gpu-allocations.json").holdings()
    assert {u: hs[0].key for u, hs in record.items()} == {uuids[0]: (o, p) for o, p, uuids in again}


OPS = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "cancel", "grant", "stop", "restart"]),
        st.integers(0, 5),  # which project
        st.integers(0, 2),  # GPUs it asks for
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(ops=OPS)
def test_any_sequence_of_starts_cancels_grants_stops_and_restarts_keeps_the_books(ops):
    """Against a model: a waiting start is in the queue until it is granted or
    cancelled, never in it twice; no GPU is ever held by two projects."""
    devices = [gpu(i) for i in range(2)]
    with tempfile.TemporaryDirectory() as d:
        t = [T0]
        stores = lambda: (  # noqa: E731
            QueueStore(Path(d) / "q.json", clock=lambda: t[0]),
            AllocationStore(Path(d) / "a.json", clock=lambda: t[0]),
        )
        q, allocs = stores()
        waiting: dict[tuple[str, str], int] = {}  # the model: key -> GPUs asked for
        running: set[tuple[str, str]] = set()
        for op, n, count in ops:
            t[0] += 1
            key = (f"u{n % 3}", f"p{n}")
            if op == "enqueue" and key not in running:
                q.enqueue(Request(*key, count))
                waiting[key] = count
            elif op == "cancel":
                assert q.cancel(*key) == (waiting.pop(key, None) is not None)
            elif op == "grant":
                for g in q.grant(allocs, devices, Policy(), usage={}):
                    assert waiting.pop(g.entry.key) == len(g.devices)
                    running.add(g.entry.key)
            elif op == "stop" and key in running:
                allocs.release(*key)
                running.discard(key)
            elif op == "restart":
                q, allocs = stores()
            assert {e.key: e.request.count for e in q.entries()} == waiting
            held = allocs.holdings()
            assert all(len(hs) == 1 for hs in held.values())  # exclusive: one holder each
            assert {h.key for hs in held.values() for h in hs} <= running

"""The GPU usage ledger on a real file: appends from several processes at once, a
torn last line after a crash, bounded reads, hours over a window, budgets, CSV."""

from __future__ import annotations

import csv
import io
import multiprocessing
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab_hub.gpus.allocator import Holder
from gpulab_hub.gpus.usage import Budgets, Record, UsageError, UsageLedger

T0 = 1_750_000_000.0  # 2025-06-15T15:06:40Z
H = 3600.0


def rec(owner: str, start_h: float, end_h: float, util: float | None = 50.0, **kw) -> Record:
    return Record(
        owner=owner,
        project=kw.get("project", "p"),
        uuid=kw.get("uuid", "GPU-0000"),
        label=kw.get("label", "GPU 0 (NVIDIA H100 80GB HBM3)"),
        start=T0 + start_h * H,
        end=T0 + end_h * H,
        util=util,
    )


def test_hours_by_user_counts_only_the_window_and_holdings_under_way(tmp_path):
    ledger = UsageLedger(tmp_path / "gpu-usage.jsonl")
    ledger.append([rec("ann", 0, 2), rec("bob", 1, 4), rec("ann", 5, 6, util=None)])
    now = T0 + 6 * H
    assert ledger.hours_by_user(window=3 * H, now=now) == {"bob": 1.0, "ann": 1.0}
    assert ledger.hours_by_user(window=100 * H, now=now) == {"ann": 3.0, "bob": 3.0}
    held = {"GPU-0001": (Holder("cat", "q", now - 0.5 * H),), "GPU-0002": (Holder("ann", "p", 0),)}
    assert ledger.hours_by_user(window=3 * H, now=now, held=held) == {
        "bob": 1.0,
        "ann": 4.0,  # 1 h recorded + the whole 3 h window on GPU 2
        "cat": 0.5,
    }
    # a "restart": a new ledger object reads the same file
    assert UsageLedger(ledger.path).hours_by_user(window=100 * H, now=now)["bob"] == 3.0


def test_a_torn_last_line_is_skipped_and_the_next_record_is_kept(tmp_path, caplog):
    path = tmp_path / "gpu-usage.jsonl"
    ledger = UsageLedger(path)
    ledger.append([rec("ann", 0, 1)])
    with open(path, "ab") as f:
        f.write(b'{"owner":"bob","project":"p","uuid":"GPU-0')  # the crash, mid-write
    assert [r.owner for r in ledger.records()] == ["ann"]
    assert ledger.skipped == 1
    ledger.append([rec("cat", 1, 2)])
    assert [r.owner for r in UsageLedger(path).records()] == ["ann", "cat"]
    assert "1 damaged or torn line" in caplog.text


def test_reads_are_bounded_to_the_end_of_the_file(tmp_path):
    ledger = UsageLedger(tmp_path / "gpu-usage.jsonl", max_bytes=1000)
    ledger.append([rec(f"u{i}", i, i + 1) for i in range(100)])  # ~17 kB
    got = [r.owner for r in ledger.records()]
    assert 3 < len(got) < 10 and got[-1] == "u99"
    assert got == [f"u{i}" for i in range(100 - len(got), 100)]  # whole records only
    assert ledger.skipped == 0


def test_records_that_are_not_usage_are_refused_and_a_link_is_never_followed(tmp_path):
    with pytest.raises(UsageError):
        rec("../x", 0, 1)
    with pytest.raises(UsageError):
        rec("ann", 2, 1)  # ends before it starts
    with pytest.raises(UsageError):
        rec("ann", 0, 1, util=140.0)
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "gpu-usage.jsonl").symlink_to(target)
    ledger = UsageLedger(tmp_path / "gpu-usage.jsonl")
    with pytest.raises(UsageError, match="not a link"):
        ledger.append([rec("ann", 0, 1)])
    assert target.read_text() == ""


def test_budgets_per_user_group_and_default_and_the_home_page_words():
    b = Budgets(
        users={"ann": 40.0},
        groups={"students": 10.0, "course": 5.0},
        members={"students": ["bob", "cat"], "course": ["cat"]},
        default=20.0,
    )
    assert [b.of(u) for u in ("ann", "bob", "cat", "dan")] == [40.0, 10.0, 5.0, 20.0]
    assert b.over({"ann": 39.9, "bob": 10.0, "cat": 4.0, "dan": 25.0}) == {"bob", "dan"}
    assert b.words("ann", 6.24) == "GPU this week: 6.2 h of 40 h"
    assert Budgets().words("ann", 6.24) == "GPU this week: 6.2 h"
    assert Budgets().over({"ann": 1e9}) == frozenset()


def test_csv_export_lists_each_holding_and_never_writes_a_formula(tmp_path):
    ledger = UsageLedger(tmp_path / "gpu-usage.jsonl")
    ledger.append([rec("ann", 0, 1.5, util=73.25), rec("bob", 2, 3, util=None, label="-1+1")])
    out = io.StringIO()
    assert ledger.export_csv(out) == 2
    rows = list(csv.reader(io.StringIO(out.getvalue())))
    assert rows == [
        ["user", "project", "gpu", "gpu_uuid", "from", "to", "gpu_hours", "avg_util"],
        ["ann", "p", "GPU 0 (NVIDIA H100 80GB HBM3)", "GPU-0000", "2025-06-15T15:06:40Z",
         "2025-06-15T16:36:40Z", "1.500", "73.2"],
        ["bob", "p", "'-1+1", "GPU-0000", "2025-06-15T17:06:40Z", "2025-06-15T18:06:40Z",
         "1.000", ""],
    ]  # fmt: skip


def _writer(args) -> None:
    path, who, n = args
    ledger = UsageLedger(Path(path))
    for i in range(n):
        ledger.append([rec(who, i, i + 1, project=f"p{i}")])


def test_processes_appending_at_once_lose_no_record(tmp_path):
    path = tmp_path / "gpu-usage.jsonl"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_writer, [(str(path), f"u{w}", 40) for w in range(4)])
    got = sorted((r.owner, r.project) for r in UsageLedger(path).records())
    assert got == sorted((f"u{w}", f"p{i}") for w in range(4) for i in range(40))


@settings(max_examples=60, deadline=None)
@given(
    spans=st.lists(
        st.tuples(st.sampled_from(["ann", "bob"]), st.floats(0, 50), st.floats(0, 10)),
        max_size=12,
    ),
    window=st.floats(0.5, 60),
)
def test_hours_in_a_window_never_exceed_the_window_nor_the_holding(spans, window):
    with tempfile.TemporaryDirectory() as d:
        ledger = UsageLedger(Path(d) / "u.jsonl")
        ledger.append([rec(o, s, s + length) for o, s, length in spans])
        got = ledger.hours_by_user(window * H, now=T0 + 60 * H)
    for who in ("ann", "bob"):
        mine = [length for o, _, length in spans if o == who]
        n = len(mine)
        assert 0 <= got.get(who, 0.0) <= min(sum(mine), n * window) + 1e-6


def test_a_holding_found_dead_is_recorded_once_when_dropped(tmp_path, monkeypatch):
    """A project whose container vanished (a crash, an admin's docker rm) loses its GPUs
    when the queue or a start finds it dead: its holding still reaches the ledger, once."""
    from faults_kit import inventory

    from gpulab_hub.gpus import allocator
    from gpulab_hub.gpus import spawner as gpu_spawner

    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: inventory(2))
    s = gpu_spawner.GpuTraits(allocations_file=str(tmp_path / "gpu-allocations.json"))
    store = gpu_spawner.store_of(s)
    devices, policy = inventory(2).devices, gpu_spawner.policy_of(s)
    store.allocate(devices, allocator.Request("alice", "train", 1), policy)
    store.allocate(devices, allocator.Request("bob", "sweep", 1), policy)
    ledger = UsageLedger(tmp_path / "gpu-usage.jsonl")
    # a start that would not fit even without the dead: refused, nothing dropped or recorded
    with pytest.raises(allocator.AllocationError):
        store.allocate(
            devices, allocator.Request("carol", "fit", 3), policy, alive=lambda o, p: o != "bob"
        )
    assert list(ledger.records()) == []
    # carol's start finds bob dead: bob's holding ends, recorded
    store.allocate(
        devices, allocator.Request("carol", "fit", 1), policy, alive=lambda o, p: o != "bob"
    )
    assert [(r.owner, r.project) for r in ledger.records()] == [("bob", "sweep")]
    # the queue's sweep finds alice dead
    assert store.release_dead(lambda o, p: o != "alice") == [("alice", "train")]
    assert store.release_dead(lambda o, p: o != "alice") == []
    assert [(r.owner, r.project) for r in ledger.records()] == [
        ("bob", "sweep"),
        ("alice", "train"),
    ]

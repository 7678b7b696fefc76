"""The GPU usage ledger in the hub's database (a SQLite file, migrated as the hub does):
one transaction a stop, hours over a window summed by query, the retention, writers in
several processes at once, budgets, CSV, and the import of the ledger file of gpulab
before its database (this release's state fixture) at the upgrade."""

from __future__ import annotations

import csv
import io
import json
import multiprocessing
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyterhub import orm

from gpulab_hub import stateversion
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables
from gpulab_hub.gpus import usagefile
from gpulab_hub.gpus.allocator import Holder
from gpulab_hub.gpus.usage import DAY, Budgets, Record, UsageError, UsageLedger

T0 = 1_750_000_000.0  # 2025-06-15T15:06:40Z
H = 3600.0
REPO = Path(__file__).resolve().parents[1]
FIXTURE = sorted((REPO / "tests" / "fixtures").glob("state-*"))[-1]


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


def upgraded(folder: Path) -> str:
    """The hub's database in ``folder``, upgraded as a hub start upgrades it."""
    url = f"sqlite:///{folder / 'jupyterhub.sqlite'}"
    migrate.upgrade(url)
    return url


@pytest.fixture
def db(tmp_path):
    yield upgraded(tmp_path)
    db_engine.dispose()


def rows(url: str) -> int:
    with db_engine.begin(url) as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(tables.usage)).scalar()


def test_hours_by_user_counts_only_the_window_and_holdings_under_way(db):
    now = T0 + 6 * H
    ledger = UsageLedger(db, clock=lambda: now)
    ledger.append([rec("ann", 0, 2), rec("bob", 1, 4), rec("ann", 5, 6, util=None)])
    assert ledger.hours_by_user(window=3 * H, now=now) == {"bob": 1.0, "ann": 1.0}
    assert ledger.hours_by_user(window=100 * H, now=now) == {"ann": 3.0, "bob": 3.0}
    held = {"GPU-0001": (Holder("cat", "q", now - 0.5 * H),), "GPU-0002": (Holder("ann", "p", 0),)}
    assert ledger.hours_by_user(window=3 * H, now=now, held=held) == {
        "bob": 1.0,
        "ann": 4.0,  # 1 h recorded + the whole 3 h window on GPU 2
        "cat": 0.5,
    }
    # a "restart": a new ledger object reads the same table
    assert UsageLedger(db).hours_by_user(window=100 * H, now=now)["bob"] == 3.0
    assert UsageLedger(db).owners() == {"ann", "bob"}


def test_the_records_of_one_stop_are_written_whole_or_not_at_all(db):
    ledger = UsageLedger(db, clock=lambda: T0 + 10 * H)
    ledger.append([rec("ann", 0, 1)])
    with pytest.raises(UsageError):
        ledger.append([rec("bob", 1, 2), "not a record"])
    # a row the database refuses (a label too long for its column) takes the others back
    engine = db_engine.of(db)
    with pytest.raises(sa.exc.SQLAlchemyError):
        with engine.begin() as conn:
            conn.execute(tables.usage.insert(), [
                {"owner": "cat", "project": "p", "uuid": "u", "label": "", "started": 1.0,
                 "ended": 2.0},
                {"owner": None, "project": "p", "uuid": "u", "label": "", "started": 1.0,
                 "ended": 2.0},
            ])  # fmt: skip
    assert [r.owner for r in ledger.records()] == ["ann"]


def test_retention_deletes_old_rows_and_fair_share_over_the_window_stays_right(db):
    now = T0 + 200 * DAY
    ledger = UsageLedger(db, clock=lambda: now, retention=30 * DAY)
    old = [rec("ann", h, h + 2) for h in range(0, 24 * 100, 24)]  # daily, 100 days, long ago
    ledger.append(old)  # the append's own prune deletes them: they ended > 30 days ago
    assert rows(db) == 0
    week = now - 7 * DAY
    recent = [
        Record("ann", "p", "GPU-0", "GPU 0", week - 3 * H, week + 2 * H),  # 2 h in the window
        Record("ann", "p", "GPU-0", "GPU 0", now - 10 * DAY, now - 9 * DAY),  # outside it
        Record("bob", "p", "GPU-1", "GPU 1", now - 5 * H, now - 1 * H),
    ]
    ledger.append(recent)
    assert rows(db) == 3
    assert ledger.hours_by_user(window=7 * DAY, now=now) == pytest.approx({"ann": 2.0, "bob": 4.0})
    # 31 days on, a new record's transaction deletes what ended more than 30 days before
    later = now + 31 * DAY
    ledger = UsageLedger(db, clock=lambda: later, retention=30 * DAY)
    ledger.append([Record("cat", "p", "GPU-0", "GPU 0", later - H, later)])
    assert [r.owner for r in ledger.records()] == ["cat"]
    assert ledger.hours_by_user(window=7 * DAY, now=later) == {"cat": 1.0}


def test_a_retention_shorter_than_the_fair_share_window_is_refused():
    from gpulab_hub.gpus.usage import check_retention

    check_retention(90 * DAY, 7 * DAY)
    with pytest.raises(ValueError, match="must be at least the fair-share window"):
        check_retention(3 * DAY, 7 * DAY)


def test_records_that_are_not_usage_are_refused(db):
    with pytest.raises(UsageError):
        rec("../x", 0, 1)
    with pytest.raises(UsageError):
        rec("ann", 2, 1)  # ends before it starts
    with pytest.raises(UsageError):
        rec("ann", 0, 1, util=140.0)
    # a row someone wrote by hand that is no record is skipped, and counted
    with db_engine.begin(db) as conn:
        conn.execute(tables.usage.insert(), {
            "owner": "=HYPERLINK(x)", "project": "p", "uuid": "u", "label": "", "started": 1.0,
            "ended": 2.0,
        })  # fmt: skip
    ledger = UsageLedger(db)
    assert ledger.records() == [] and ledger.skipped == 1


def test_a_record_names_its_jupyterhub_user_and_goes_with_them(tmp_path):
    url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    factory = orm.new_session_factory(url)
    session = factory()
    session.add(orm.User(name="ann"))
    session.commit()
    migrate.upgrade(url)
    ledger = UsageLedger(url, clock=lambda: T0 + 10 * H)
    ledger.append([rec("ann", 0, 1), rec("gone", 0, 1)])  # "gone": no such user (NULL)
    with db_engine.begin(url) as conn:
        ids = dict(conn.execute(sa.select(tables.usage.c.owner, tables.usage.c.user_id)).all())
    ann = session.query(orm.User).filter_by(name="ann").one()
    assert ids == {"ann": ann.id, "gone": None}
    session.delete(ann)  # JupyterHub deletes the user: their usage goes with them
    session.commit()
    session.close()
    factory.kw["bind"].dispose()
    assert [r.owner for r in ledger.records()] == ["gone"]
    db_engine.dispose()


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


def test_csv_export_lists_each_holding_and_never_writes_a_formula(db):
    ledger = UsageLedger(db, clock=lambda: T0 + 10 * H)
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
    url, who, n = args
    db_engine.dispose()  # the parent's connections are not this process's
    ledger = UsageLedger(url, clock=lambda: T0 + 100 * H)
    for i in range(n):
        ledger.append([rec(who, i, i + 1, project=f"p{i}")])
    db_engine.dispose()


def test_processes_appending_at_once_lose_no_record(db):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_writer, [(db, f"u{w}", 40) for w in range(4)])
    got = sorted((r.owner, r.project) for r in UsageLedger(db).records())
    assert got == sorted((f"u{w}", f"p{i}") for w in range(4) for i in range(40))


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory):
    yield upgraded(tmp_path_factory.mktemp("usage"))
    db_engine.dispose()


@settings(max_examples=60, deadline=None)
@given(
    spans=st.lists(
        st.tuples(st.sampled_from(["ann", "bob"]), st.floats(0, 50), st.floats(0, 10)),
        max_size=12,
    ),
    window=st.floats(0.5, 60),
)
def test_hours_in_a_window_never_exceed_the_window_nor_the_holding(shared_db, spans, window):
    with db_engine.begin(shared_db) as conn:
        conn.execute(tables.usage.delete())
    ledger = UsageLedger(shared_db, clock=lambda: T0 + 60 * H)
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
    url = upgraded(tmp_path)  # the database beside the allocation record, as the layout's
    assert gpu_spawner.db_url_of(s) == url
    store = gpu_spawner.store_of(s)
    devices, policy = inventory(2).devices, gpu_spawner.policy_of(s)
    store.allocate(devices, allocator.Request("alice", "train", 1), policy)
    store.allocate(devices, allocator.Request("bob", "sweep", 1), policy)
    ledger = UsageLedger(url)
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
    assert sorted((r.owner, r.project) for r in ledger.records()) == [
        ("alice", "train"),
        ("bob", "sweep"),
    ]  # (in the order they started)


# --- the ledger file of gpulab before its database, imported at the upgrade -------------


def _hub_of_fixture(tmp_path: Path) -> Path:
    hub = tmp_path / "hub"
    shutil.copytree(FIXTURE / "hub", hub)
    return hub


def test_the_upgrade_imports_every_record_of_the_old_ledger_once_and_keeps_the_file(tmp_path):
    hub = _hub_of_fixture(tmp_path)
    path = hub / "gpu-usage.jsonl"
    before = path.read_bytes()
    expected = json.loads((FIXTURE / "expected.json").read_text())["gpu-usage"]
    url = f"sqlite:///{hub / 'jupyterhub.sqlite'}"

    done = migrate.upgrade(url, imports=[usagefile.LedgerImport(path)])

    kept = hub / "gpu-usage.jsonl.imported"
    assert f"Imported {len(expected)} GPU usage record(s) from {path}" in " ".join(done.imported)
    assert not path.exists() and kept.read_bytes() == before  # the pre-upgrade backup
    got = [
        {"owner": r.owner, "project": r.project, "uuid": r.uuid, "label": r.label,
         "start": r.start, "end": r.end, "util": r.util}
        for r in UsageLedger(url).records()
    ]  # fmt: skip
    assert sorted(got, key=lambda r: r["start"]) == sorted(expected, key=lambda r: r["start"])
    with sqlite3.connect(hub / "jupyterhub.sqlite") as con:
        assert con.execute("SELECT name, rows, skipped FROM gpulab_imports").fetchall() == [
            ("gpu-usage", len(expected), 0)
        ]
    # again (a second start): nothing to import, nothing added
    again = migrate.upgrade(url, imports=[usagefile.LedgerImport(path)])
    assert not again.changed
    assert len(UsageLedger(url).records()) == len(expected)
    # a crash between the commit and the rename: the next start renames, imports nothing
    shutil.copy(kept, path)
    third = migrate.upgrade(url, imports=[usagefile.LedgerImport(path)])
    assert "was imported before" in " ".join(third.imported)
    assert len(UsageLedger(url).records()) == len(expected)
    assert not path.exists() and (hub / "gpu-usage.jsonl.imported.1").read_bytes() == before
    db_engine.dispose()


def test_an_old_ledger_of_a_newer_format_ends_the_upgrade_and_is_left_as_it_is(tmp_path):
    hub = _hub_of_fixture(tmp_path)
    path = hub / "gpu-usage.jsonl"
    lines = path.read_text().splitlines()
    current = stateversion.KINDS["gpu-usage"].current
    lines[-1] = json.dumps({"version": current + 1, **json.loads(lines[-1])})
    path.write_text("\n".join(lines) + "\n")
    before = path.read_bytes()
    url = f"sqlite:///{hub / 'jupyterhub.sqlite'}"
    with pytest.raises(db_engine.DatabaseError, match="written by a newer gpulab"):
        migrate.upgrade(url, imports=[usagefile.LedgerImport(path)])
    assert path.read_bytes() == before
    # the whole upgrade was taken back: no gpulab tables, nothing imported
    with sqlite3.connect(hub / "jupyterhub.sqlite") as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    assert not any(n.startswith(tables.PREFIX) for n in names)
    db_engine.dispose()


def test_the_import_skips_torn_and_damaged_lines_and_says_how_many(tmp_path):
    path = tmp_path / "gpu-usage.jsonl"
    good = json.dumps({"owner": "ann", "project": "p", "uuid": "GPU-0", "label": "GPU 0",
                       "start": T0, "end": T0 + H, "util": None})  # fmt: skip
    path.write_bytes(
        (good + "\n" + '{"owner": "=evil"}\n' + "x" * 5000 + "\n" + good + "\n"
         + '{"owner":"bob","proj').encode()
    )  # fmt: skip
    url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    done = migrate.upgrade(url, imports=[usagefile.LedgerImport(path)])
    assert "(3 damaged or torn line(s) skipped)" in " ".join(done.imported)
    assert [r.owner for r in UsageLedger(url).records()] == ["ann", "ann"]
    db_engine.dispose()


def test_the_import_never_follows_a_link(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text(json.dumps({"owner": "ann", "project": "p", "uuid": "GPU-0",
                                  "label": "", "start": T0, "end": T0 + H}) + "\n")  # fmt: skip
    (tmp_path / "gpu-usage.jsonl").symlink_to(target)
    url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    with pytest.raises(db_engine.DatabaseError, match="cannot be imported"):
        migrate.upgrade(url, imports=[usagefile.LedgerImport(tmp_path / "gpu-usage.jsonl")])
    assert (tmp_path / "gpu-usage.jsonl").is_symlink()
    db_engine.dispose()


def test_gpulab_backup_and_restore_carry_the_usage_table(tmp_path):
    """`gpulab backup` copies the hub's database with SQLite's online backup API (gpulab's
    tables with JupyterHub's); `gpulab restore` puts it back, every usage row with it."""
    from traitlets.config import Config

    from gpulab_hub import hubsettings
    from gpulab_hub.backup import make, restore

    hub = _hub_of_fixture(tmp_path / "old")
    where = hubsettings.default_layout(hub.parent)
    migrate.upgrade(where.db_url, imports=[usagefile.LedgerImport(where.usage_file)])
    ledger = UsageLedger(where.db_url, clock=lambda: T0 + 10 * H)
    ledger.append([rec("ann", 0, 1), rec("bob", 2, 4)])
    before = [r for r in ledger.records()]
    assert len(before) == 4  # the fixture's two, imported, and these two
    archive = tmp_path / "a.tar.gz"
    make.make(
        archive, home=hub.parent, hub_dir=hub, config=Config(), where=where, projects=False,
        environ={}, say=lambda line: None,
    )  # fmt: skip
    new = tmp_path / "new"
    restore.restore(
        archive, home=new, hub_dir=new / "hub", projects_root=new / "projects", force=False,
        running="", environ={}, say=lambda line: None,
    )  # fmt: skip
    restored = hubsettings.default_layout(new).db_url
    assert migrate.current(restored) == migrate.head()
    assert UsageLedger(restored).records() == before
    db_engine.dispose()

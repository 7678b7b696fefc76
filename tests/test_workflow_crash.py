"""A hub killed (SIGKILL) at every step of a project's rename or deletion: the next
start finishes it (workflows/recovery.py), and the project, its records and its folders
agree, under the new name or gone, never half.

Each test makes alice's project ``one`` with something in every place a rename or
deletion touches (test_project_rename.records_hub: folders, image record, data, a user
share, a group share and its role, a share code, a token, sharing settings, a public
link, a choice of secrets, a multi-node job), in a SQLite database file and, again, in a
PostgreSQL database (tests/pg_kit.py), as production runs it. A child process
runs the real rename (rename.move) or deletion (deletion.delete_project, then
JupyterHub's removal of the server row) and kills itself with SIGKILL right after the
step named; the test then does what the hub's start does (hubconfig.finish_interrupted:
recovery.finish_interrupted) and compares everything with an uninterrupted run's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from jupyterhub import orm
from test_project_rename import records_hub, snapshot
from traitlets.config import Config

from gpulab_hub.db import engine as db_engine
from gpulab_hub.workflows import deletion, journal, recovery, rename
from gpulab_hub.workflows import records as registry

HERE = Path(__file__).resolve().parent
FOLDERS = 3  # the project folder, its data folders, its image record and build logs


def _record_steps() -> list[str]:
    return [c.__name__ for c in registry.REGISTRY if c.per_project and c.moves and not c.server]


RENAME_STEPS = [
    "journal",
    *(f"folder{n}" for n in range(1, FOLDERS + 1)),
    *_record_steps(),
    "rename_row",
    *(c.__name__ for c in registry.REGISTRY if c.server),
]
DELETE_STEPS = [
    "journal",
    "server_records",
    *(f"take_away{n}" for n in range(1, FOLDERS + 1)),
    "file_records",
    "delete_project",  # gpulab's part done; JupyterHub has not removed the server row
]


# --- the child: the real workflow, killed right after one step -------------------------
def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _after(owner, name: str, when) -> None:
    """Replace ``owner.name`` by a call of it that is followed by SIGKILL when
    ``when()`` says so (counting calls)."""
    real = getattr(owner, name)

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        if when(*args):
            _kill()
        return result

    setattr(owner, name, wrapped)


def _nth(n: int):
    calls = [0]

    def when(*_args) -> bool:
        calls[0] += 1
        return calls[0] == n

    return when


def _always(*_args) -> bool:
    return True


def _arm_rename(step: str) -> None:
    if step == "journal":
        _after(journal, "begin", _always)
    elif step.startswith("folder"):
        _after(rename, "move_folder", _nth(int(step[len("folder") :])))
    elif step == "rename_row":
        _after(rename, "rename_row", _always)
    else:
        (cls,) = [c for c in registry.REGISTRY if c.__name__ == step]
        _after(cls, "move", lambda _self, owner, old, new: new == "two")


def _arm_delete(step: str) -> None:
    if step == "journal":
        _after(journal, "begin", _always)
    elif step == "server_records":
        _after(deletion, "forget_server_records", _always)
    elif step.startswith("take_away"):
        _after(deletion, "_take_away", _nth(int(step[len("take_away") :])))
    elif step == "file_records":
        _after(deletion, "_forget_records", _always)
    elif step != "delete_project":
        raise ValueError(step)


def _session(url: str):
    return orm.new_session_factory(url)()


def _spawner_of(db):
    return orm.User.find(db, "alice").orm_spawners["one"]


def _place(where: rename.Where) -> deletion.Place:
    return deletion.Place(
        projects_root=where.projects_root,
        state_root=where.state_root,
        data_root=where.data_root,
        hub_dir=where.hub_dir,
        archive=True,
        allocations_file=where.hub_dir / "gpu-allocations.json",
        prefix="gpulabcrash",
        hf_volume="gpulabcrash-hf-alice",
    )


def _fake_spawner(db, where: rename.Where):
    """What deletion.delete_project reads of JupyterHub's spawner (ProjectSpawner)."""
    orm_spawner = _spawner_of(db)
    place = _place(where)
    return SimpleNamespace(
        name="one",
        user=SimpleNamespace(name="alice", db=db),
        orm_spawner=orm_spawner,
        config=Config({"GpulabDeletion": {"archive": True}}),
        projects_root=str(place.projects_root),
        state_root=str(place.state_root),
        data_root=str(place.data_root),
        records_dir=str(place.hub_dir),
        allocations_file=str(place.allocations_file),
        prefix=place.prefix,
        hf_cache_volume="{prefix}-hf-{username}",
        escape=lambda name: name,
        log=SimpleNamespace(info=lambda *a: None),
    )


def run_rename(url: str, where: rename.Where) -> None:
    import logging

    db = _session(url)
    rename.move(db, _spawner_of(db), where, "two", None, logging.getLogger("crash"))


def run_delete(url: str, where: rename.Where) -> None:
    db = _session(url)
    spawner = _fake_spawner(db, where)
    asyncio.run(deletion.delete_project(spawner))
    if os.environ.get("GPULAB_CRASH_STEP") == "delete_project":
        _kill()
    db.delete(spawner.orm_spawner)  # JupyterHub's part: the server row goes
    db.commit()


def child(kind: str, url: str, saved: str, step: str) -> None:
    import json

    from jupyterhub import scopes

    from gpulab_hub.sharing import roles

    scopes.define_custom_scopes(roles.CUSTOM_SCOPES)
    where = rename.Where.of_saved(json.loads(saved))
    if step:
        (_arm_rename if kind == "rename" else _arm_delete)(step)
    (run_rename if kind == "rename" else run_delete)(url, where)


# --- the tests -------------------------------------------------------------------------
def _hub(tmp_path: Path, url: str | None = None):
    db, spawner, where, token, log = records_hub(tmp_path, url)
    url = db.get_bind().url.render_as_string(hide_password=False)
    db.close()
    db.get_bind().dispose()
    db_engine.dispose()  # no connection left to it (PostgreSQL copies it as a template)
    return url, where


def _where_in(root: Path) -> rename.Where:
    """records_hub's folders under ``root`` (test_project_rename.py)."""
    return rename.Where(root / "projects", root / "hub" / "projects", root / "hub", root / "data")


@pytest.fixture(scope="module")
def made(tmp_path_factory, request) -> dict:
    """records_hub made once a backend (its folders and its database), copied for each
    test: the making is most of a test's time otherwise."""
    found = {}

    def of(backend: str) -> tuple[Path, str]:
        if backend not in found:
            root = tmp_path_factory.mktemp(f"made-{backend}")
            url = None
            if backend == "postgresql":
                import pg_kit

                url = pg_kit.fresh_database(request.getfixturevalue("pg_server"))
            found[backend] = (root, _hub(root, url)[0])
        return found[backend]

    return of


@pytest.fixture(params=["sqlite", "postgresql"])
def copied(request, made, tmp_path) -> tuple[str, rename.Where]:
    """A copy of alice's project as records_hub makes it, in a SQLite file or in a
    PostgreSQL database (tests/pg_kit.py): its database's URL and its folders."""
    import shutil

    root, url = made(request.param)
    shutil.copytree(root, tmp_path / "hub-copy", symlinks=True)
    where = _where_in(tmp_path / "hub-copy")
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hub-copy' / 'db' / 'jupyterhub.sqlite'}", where
    import pg_kit

    return pg_kit.fresh_database(request.getfixturevalue("pg_server"), copy_of=url), where


def _run_child(kind: str, url: str, where: rename.Where, step: str) -> int:
    import json

    env = {**os.environ, "GPULAB_CRASH_STEP": step}
    args = (kind, url, json.dumps(where.saved()), step)
    code = f"import test_workflow_crash as t; t.child(*{args!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode not in (0, -signal.SIGKILL):
        print(done.stdout, done.stderr)
    return done.returncode


def _restart(url: str) -> list[str]:
    """What the hub's start does (hubconfig.finish_interrupted), outside a hub."""
    return recovery.finish_interrupted(url)


def _journal(url: str) -> list[journal.Entry]:
    db = _session(url)
    try:
        return journal.pending(db)
    finally:
        db.close()


def _snapshots(url: str, where: rename.Where) -> dict:
    db = _session(url)
    try:
        return {name: snapshot(db, where, name) for name in ("one", "two")}
    finally:
        db.close()


@pytest.fixture(scope="module")
def renamed_whole(tmp_path_factory) -> dict:
    """Alice's project after an uninterrupted rename, as the crashed ones must end."""
    url, where = _hub(tmp_path_factory.mktemp("whole-rename"))
    assert _run_child("rename", url, where, "") == 0
    assert _journal(url) == []
    return _snapshots(url, where)


@pytest.fixture(scope="module")
def deleted_whole(tmp_path_factory) -> dict:
    url, where = _hub(tmp_path_factory.mktemp("whole-delete"))
    assert _run_child("delete", url, where, "") == 0
    assert _journal(url) == []
    return _snapshots(url, where)


@pytest.mark.parametrize("step", RENAME_STEPS)
def test_a_rename_killed_after_each_step_is_finished_at_the_next_start(
    step, renamed_whole, copied
):
    url, where = copied
    before = _snapshots(url, where)
    assert before["one"]["files"] == ["kept.txt"] and before["two"]["server"] is None
    assert _run_child("rename", url, where, step) == -signal.SIGKILL
    (entry,) = _journal(url)  # the rename was written down, and not crossed out
    assert (entry.kind, entry.project, entry.new_name) == ("rename", "one", "two")
    said = _restart(url)
    assert len(said) == 1 and "rename of alice's project 'one' to 'two'" in said[0], said
    assert "finished as the hub started" in said[0], said
    assert _journal(url) == []
    assert _snapshots(url, where) == renamed_whole
    assert _restart(url) == []  # a second start finds nothing to do


@pytest.mark.parametrize("step", DELETE_STEPS)
def test_a_deletion_killed_after_each_step_is_finished_at_the_next_start(
    step, deleted_whole, copied
):
    url, where = copied
    assert _run_child("delete", url, where, step) == -signal.SIGKILL
    (entry,) = _journal(url)
    assert (entry.kind, entry.project) == ("delete", "one")
    said = _restart(url)
    assert len(said) == 1 and "deletion of alice's project 'one'" in said[0], said
    assert _journal(url) == []
    after = _snapshots(url, where)
    assert after == deleted_whole
    assert after["one"]["server"] is None and after["one"]["files"] == []
    archived = list((where.hub_dir / "deleted").glob("alice-*/projects/one/kept.txt"))
    assert archived, "the project's files were archived, not lost"
    assert _restart(url) == []


def test_the_whole_runs_end_as_the_workflows_say(renamed_whole, deleted_whole):
    """The comparisons above are with real outcomes: everything under the new name, and
    nothing left of a deleted project."""
    assert renamed_whole["two"]["files"] == ["kept.txt"] and renamed_whole["two"]["roles"]
    assert renamed_whole["one"]["server"] is None and renamed_whole["one"]["files"] == []
    assert deleted_whole["one"]["server"] is None and deleted_whole["one"]["links"] == []
    assert deleted_whole["two"]["server"] is None


@pytest.mark.parametrize("in_the_way", ["folder", "link"])
def test_a_rename_that_cannot_be_finished_stays_in_the_journal(tmp_path, in_the_way):
    """A folder of the new name made while the hub was down, or a link there to a folder
    elsewhere (as a hostile hand would plant it): the start says so, moves nothing onto
    it and writes nothing through it, and keeps the row for the next start."""
    url, where = _hub(tmp_path)
    assert _run_child("rename", url, where, "journal") == -signal.SIGKILL
    way = where.projects_root / "alice" / "two"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    way.mkdir() if in_the_way == "folder" else way.symlink_to(elsewhere)
    said = _restart(url)
    assert len(said) == 1 and "could not be finished" in said[0], said
    assert len(_journal(url)) == 1
    assert (where.projects_root / "alice" / "one" / "kept.txt").exists()
    assert list(elsewhere.iterdir()) == []
    way.rmdir() if in_the_way == "folder" else way.unlink()
    assert "finished as the hub started" in _restart(url)[0]
    assert _journal(url) == []


def test_every_moving_store_says_what_it_holds(tmp_path):
    """records.ProjectRecords.holds, which the finish relies on, for each store that
    moves (test_project_records plants a record in every store): true for a project
    planted, false for a name never used and for another owner's project."""
    from test_project_records import planted_hub

    hub = planted_hub(tmp_path)
    for record in registry.files(hub.where.records(hub.db)):
        if record.per_project and record.moves:
            assert record.holds("alice", "one"), type(record).__name__
            assert not record.holds("alice", "never"), type(record).__name__
            assert not record.holds("carol", "one"), type(record).__name__

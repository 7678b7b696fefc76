"""gpulab's tables in JupyterHub's database (gpulab_hub/db/): made by gpulab's migration
beside JupyterHub's tables, upgraded once (a backup of the SQLite file first), a newer
revision refused, a JupyterHub user's deletion cascading to gpulab's rows, and never on
the event loop. SQLite files in a temporary folder (the fast lane)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from jupyterhub import orm

from gpulab_hub import blocking
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables


@pytest.fixture(autouse=True)
def _engines():
    yield
    db_engine.dispose()


def url_of(path) -> str:
    return f"sqlite:///{path}"


def table_names(path) -> set[str]:
    with sqlite3.connect(path) as con:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def hub_with_user(path, name="ann") -> int:
    """A database as JupyterHub leaves it (its tables, its revision) with one user."""
    factory = orm.new_session_factory(url_of(path))
    db = factory()
    try:
        user = orm.User(name=name)
        db.add(user)
        db.commit()
        return user.id
    finally:
        db.close()
        factory.kw["bind"].dispose()


def _gpulabs(obj, name, type_, reflected, compare_to) -> bool:
    table = obj if type_ == "table" else getattr(obj, "table", None)
    return table is None or (
        table.name.startswith(tables.PREFIX) and table.name != tables.VERSION_TABLE
    )


def test_a_fresh_database_gets_jupyterhubs_tables_and_gpulabs_from_the_migration(tmp_path):
    path = tmp_path / "jupyterhub.sqlite"
    done = migrate.upgrade(url_of(path))
    assert (done.before, done.after) == (None, migrate.head())
    assert done.backup is None  # there was no database to back up
    names = table_names(path)
    assert {"gpulab_usage", "gpulab_imports", tables.VERSION_TABLE} <= names
    assert {"users", "spawners", "alembic_version"} <= names  # JupyterHub's, as it makes them
    with sqlite3.connect(path) as con:
        (ours,) = con.execute(f"SELECT version_num FROM {tables.VERSION_TABLE}").fetchone()
        (theirs,) = con.execute("SELECT version_num FROM alembic_version").fetchone()
    assert ours == migrate.head()
    assert theirs != ours  # JupyterHub's revision is its own
    # JupyterHub accepts the database as its own (its revision check passes).
    orm.new_session_factory(url_of(path)).kw["bind"].dispose()
    # The migration made exactly what tables.py defines (the migration made them: no
    # create_all anywhere), indexes included.
    # (tables.py names JupyterHub's users and servers only by foreign key: their tables
    # are JupyterHub's, compared by nobody here.)
    whole = sa.MetaData()
    for t in orm.Base.metadata.tables.values():
        t.to_metadata(whole)
    for t in tables.METADATA.tables.values():
        t.to_metadata(whole)
    engine = sa.create_engine(url_of(path))
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"include_object": _gpulabs, "compare_type": True}
        )
        assert compare_metadata(ctx, whole) == []
    engine.dispose()


def test_the_upgrade_backs_the_database_up_first_and_a_second_upgrade_changes_nothing(tmp_path):
    path = tmp_path / "jupyterhub.sqlite"
    hub_with_user(path)
    before = table_names(path)
    assert not any(n.startswith(tables.PREFIX) for n in before)

    done = migrate.upgrade(url_of(path))
    assert done.before is None and done.after == migrate.head()
    assert done.backup is not None and done.backup.parent == tmp_path
    assert done.backup.name.startswith("jupyterhub.sqlite.gpulab-upgrade-")
    assert stat.S_IMODE(os.stat(done.backup).st_mode) == 0o600
    # The backup is the database as it was before the upgrade: the user, no gpulab tables.
    assert table_names(done.backup) == before
    with sqlite3.connect(done.backup) as con:
        assert con.execute("SELECT name FROM users").fetchall() == [("ann",)]
    assert "backed up first" in done.words(url_of(path))

    again = migrate.upgrade(url_of(path))
    assert not again.changed and again.backup is None
    assert sorted(p.name for p in tmp_path.iterdir() if "gpulab-upgrade" in p.name) == [
        done.backup.name
    ]
    assert "up to date" in again.words(url_of(path))
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT name FROM users").fetchall() == [("ann",)]


def test_a_database_of_a_newer_gpulab_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "jupyterhub.sqlite"
    migrate.upgrade(url_of(path))
    with sqlite3.connect(path) as con:
        con.execute(f"UPDATE {tables.VERSION_TABLE} SET version_num = '9999_from_the_future'")
    with pytest.raises(db_engine.DatabaseError, match="newer gpulab"):
        migrate.upgrade(url_of(path))
    assert not [p for p in tmp_path.iterdir() if "gpulab-upgrade" in p.name]
    with sqlite3.connect(path) as con:
        rev = con.execute(f"SELECT version_num FROM {tables.VERSION_TABLE}").fetchone()
    assert rev == ("9999_from_the_future",)


def test_deleting_a_user_in_jupyterhub_deletes_their_gpulab_rows(tmp_path):
    path = tmp_path / "jupyterhub.sqlite"
    ann = hub_with_user(path, "ann")
    bob = hub_with_user(path, "bob")
    migrate.upgrade(url_of(path))
    row = {"project": "p", "uuid": "GPU-1", "label": "GPU 0", "started": 0.0, "ended": 1.0}
    with db_engine.begin(url_of(path)) as conn:
        conn.execute(tables.usage.insert(), [
            {**row, "user_id": ann, "owner": "ann"}, {**row, "user_id": bob, "owner": "bob"}
        ])  # fmt: skip
        # gpulab's connections check foreign keys: a row of a user the hub lacks is refused
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.execute(tables.usage.insert(), {**row, "user_id": 999, "owner": "zed"})
    # JupyterHub deletes the user as it does (its own session, its own engine).
    factory = orm.new_session_factory(url_of(path))
    db = factory()
    db.delete(db.query(orm.User).filter_by(name="ann").one())
    db.commit()
    db.close()
    factory.kw["bind"].dispose()
    with db_engine.begin(url_of(path)) as conn:
        left = conn.execute(sa.select(tables.usage.c.owner)).scalars().all()
    assert left == ["bob"]


def test_gpulabs_database_is_never_used_on_the_event_loop(tmp_path, monkeypatch):
    monkeypatch.setenv(blocking.GUARD_ENV, "strict")
    url = url_of(tmp_path / "jupyterhub.sqlite")
    migrate.upgrade(url)

    async def on_loop():
        with db_engine.begin(url) as conn:
            conn.execute(sa.select(1))

    async def off_loop():
        return await blocking.run(blocking.RECORDS, migrate.current, url)

    with pytest.raises(blocking.OnLoop, match="gpulab's database"):
        asyncio.run(on_loop())
    assert asyncio.run(off_loop()) == migrate.head()
    blocking.shutdown()


def test_reading_the_configuration_outside_the_hub_upgrades_nothing(tmp_path):
    url = url_of(tmp_path / "jupyterhub.sqlite")
    assert migrate.at_start(url) is None  # no JupyterHub in this process
    assert not (tmp_path / "jupyterhub.sqlite").exists()

"""gpulab backup and restore of a hub whose database is PostgreSQL (GPULAB_DB_URL, as
under docker compose): pg_dump's snapshot in the archive, pg_restore into the new hub's
empty database, whole or not at all; a database with a hub in it is replaced only with
--force, after its content was dumped aside; an archive of the other kind of database
is refused before anything is written. On a PostgreSQL server of the tests' own
(tests/pg_kit.py), with a password in the URL that no argument list may show.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pg_kit
import pytest
import sqlalchemy as sa
from test_backup import backup, layout, make_home, members
from traitlets.config import Config

from gpulab_hub.backup import BackupError, make, restore
from gpulab_hub.db import engine as db_engine

SECRET = "pg-backup-passw0rd-5150"




def database(pg_server, *users: str) -> str:
    """A new database on the server (its URL with a password in it), holding a hub's
    ``users`` and ``spawners`` with ``users`` (each with one project)."""
    url = pg_kit.fresh_database(pg_server).replace("postgres@", f"postgres:{SECRET}@", 1)
    if users:
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE users (id serial PRIMARY KEY, name text)")
            conn.exec_driver_sql(
                "CREATE TABLE spawners (id serial PRIMARY KEY, user_id int, name text)"
            )
            for i, name in enumerate(users, 1):
                conn.execute(sa.text("INSERT INTO users (name) VALUES (:n)"), {"n": name})
                conn.execute(
                    sa.text("INSERT INTO spawners (user_id, name) VALUES (:u, :p)"),
                    {"u": i, "p": f"{name}-proj"},
                )
        engine.dispose()
    return url


def names(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [r[0] for r in conn.execute(sa.text("SELECT name FROM users ORDER BY id"))]
    finally:
        engine.dispose()
        db_engine.dispose()


def pg_home(root: Path, url: str) -> tuple[Path, Config]:
    home = make_home(root)
    (home / "hub" / "jupyterhub.sqlite").unlink()  # this hub's database is PostgreSQL
    config = Config()
    config.JupyterHub.db_url = url
    return home, config


def pg_backup(home: Path, config: Config, out: Path) -> make.Made:
    return make.make(
        out, home=home, hub_dir=home / "hub", config=config, where=layout(home),
        projects=True, environ={}, say=lambda line: None,
    )  # fmt: skip


def pg_restore(archive: Path, home: Path, url: str, force: bool = False) -> list[str]:
    said: list[str] = []
    restore.restore(
        archive, home=home, hub_dir=home / "hub", projects_root=home / "projects",
        force=force, running="", environ={"GPULAB_DB_URL": url} if url else {},
        say=said.append,
    )  # fmt: skip
    return said


def test_the_archive_holds_pg_dumps_snapshot_and_no_password(pg_server, tmp_path, monkeypatch):
    url = database(pg_server, "alice", "bob")
    home, config = pg_home(tmp_path, url)
    argvs: list[list[str]] = []
    real = subprocess.run

    def seen(argv, *a, **kw):
        argvs.append(list(map(str, argv)))
        return real(argv, *a, **kw)

    monkeypatch.setattr(subprocess, "run", seen)
    pg_backup(home, config, tmp_path / "a.tar.gz")
    monkeypatch.undo()
    got = members(tmp_path / "a.tar.gz")
    assert "hub/database.pgdump" in got and "hub/jupyterhub.sqlite" not in got
    assert got["hub/database.pgdump"].startswith(b"PGDMP")  # pg_dump's custom format
    dumps = [a for a in argvs if Path(a[0]).name == "pg_dump"]
    assert len(dumps) == 1
    assert not [a for a in argvs if SECRET in " ".join(a)]  # never on a command line
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        member = tar.getmember("hub/database.pgdump")
        assert member.mode & 0o077 == 0  # password hashes and tokens: the owner's only


def test_restore_loads_it_into_the_new_hubs_empty_database(pg_server, tmp_path):
    url = database(pg_server, "alice", "bob")
    home, config = pg_home(tmp_path, url)
    pg_backup(home, config, tmp_path / "a.tar.gz")
    new_url = database(pg_server)  # empty, as a new compose deployment's
    new = tmp_path / "new"
    said = pg_restore(tmp_path / "a.tar.gz", new, new_url)
    assert names(new_url) == ["alice", "bob"]
    assert "The restored hub has 2 accounts and 2 projects." in said
    assert not (new / "hub" / "database.pgdump").exists()  # loaded, not kept beside
    assert (new / "projects" / "alice" / "proj" / "notes.txt").read_text() == "my notes\n"


def test_a_database_with_a_hub_is_replaced_only_when_forced_after_a_dump_aside(
    pg_server, tmp_path
):
    url = database(pg_server, "alice", "bob")
    home, config = pg_home(tmp_path, url)
    pg_backup(home, config, tmp_path / "a.tar.gz")
    other_url = database(pg_server, "carol")
    other = tmp_path / "other"
    with pytest.raises(BackupError) as refused:
        pg_restore(tmp_path / "a.tar.gz", other, other_url)
    assert "already has a hub's state: a hub database (postgresql" in str(refused.value)
    assert SECRET not in str(refused.value) and "add --force" in str(refused.value)
    assert names(other_url) == ["carol"]  # untouched

    said = pg_restore(tmp_path / "a.tar.gz", other, other_url, force=True)
    assert names(other_url) == ["alice", "bob"]
    (aside,) = [p for p in other.iterdir() if p.name.startswith("database.before-restore-")]
    assert aside.read_bytes().startswith(b"PGDMP") and aside.stat().st_mode & 0o077 == 0
    assert any(line.startswith("Dumped what the database") for line in said)
    assert not [line for line in said if SECRET in line]
    # what was there comes back from the dump aside, with PostgreSQL's own tool
    back = database(pg_server)
    libpq = back.replace("postgresql+psycopg", "postgresql").replace(f":{SECRET}", "")
    subprocess.run(
        [restore.database._tool("pg_restore"), "--no-owner", "-d", libpq, str(aside)],
        check=True, capture_output=True,
    )  # fmt: skip
    assert names(back) == ["carol"]


def test_an_archive_of_the_other_kind_of_database_is_refused_before_any_write(
    pg_server, tmp_path
):
    url = database(pg_server, "alice")
    home, config = pg_home(tmp_path, url)
    pg_backup(home, config, tmp_path / "pg.tar.gz")
    new = tmp_path / "new"
    with pytest.raises(BackupError) as refused:
        pg_restore(tmp_path / "pg.tar.gz", new, "")
    assert "set GPULAB_DB_URL" in str(refused.value)
    assert not (new / "hub").exists() and not (new / "projects").exists()

    sqlite_home = make_home(tmp_path / "sqlite")
    backup(sqlite_home, tmp_path / "sqlite.tar.gz")
    empty = database(pg_server)
    with pytest.raises(BackupError) as refused:
        pg_restore(tmp_path / "sqlite.tar.gz", tmp_path / "new2", empty)
    assert "holds a SQLite hub database" in str(refused.value)
    assert not (tmp_path / "new2" / "hub").exists()

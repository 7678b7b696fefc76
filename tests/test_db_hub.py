"""The hub upgrades gpulab's tables as it starts (jupyterhub_config.py -> db/migrate.py),
a backup of its SQLite database made first, and a second start changes nothing; `gpulab
upgrade-db` does the same by hand. A real JupyterHub on this release's state fixture, no
Docker engine (the hub is given its address, so it asks none)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pg_kit
import sqlalchemy as sa
from conftest import free_port
from jupyterhub import orm

from gpulab_hub.accounts import identities
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables

REPO = Path(__file__).resolve().parents[1]
FIXTURE = sorted((REPO / "tests" / "fixtures").glob("state-*"))[-1]
GPULAB = str(Path(sys.executable).parent / "gpulab")


def _env(home: Path, tmp_path: Path) -> dict:
    return {
        **os.environ,
        "GPULAB_HOME": str(home),
        "GPULAB_HUB_IP": "127.0.0.1",  # the hub's address given: no engine is asked
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
        "GPULAB_BIND_URL": f"http://127.0.0.1:{free_port()}",
        "GPULAB_HUB_PORT": str(free_port()),
        "GPULAB_PROXY_API_PORT": str(free_port()),
        "GPULAB_SSH_PORT": str(free_port()),
        # the venv's configurable-http-proxy, as `gpulab up` finds it
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def _start_and_stop(hub: Path, env: dict, log: Path) -> str:
    """Start JupyterHub with gpulab's configuration, wait until it answers, stop it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(REPO / "jupyterhub_config.py")],
            cwd=hub, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 180  # a loaded 2-core machine
            url = env["GPULAB_BIND_URL"] + "/hub/api"
            while True:
                assert proc.poll() is None, log.read_text()[-4000:]
                try:
                    with urllib.request.urlopen(url, timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                assert time.monotonic() < deadline, log.read_text()[-4000:]
                time.sleep(0.5)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return log.read_text()


def _revision(db: Path) -> str | None:
    with sqlite3.connect(db) as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables.VERSION_TABLE not in names:
            return None
        return con.execute(f"SELECT version_num FROM {tables.VERSION_TABLE}").fetchone()[0]


def _older_hub(tmp_path: Path, url: str | None = None) -> Path:
    """This release's state fixture with the database a hub of gpulab before its tables
    left (the SQLite file beside, or ``url``): JupyterHub's tables, the user alice and
    her project thesis, none of gpulab's tables."""
    home = tmp_path / "home"
    shutil.copytree(FIXTURE / "hub", home / "hub")
    db = home / "hub" / "jupyterhub.sqlite"
    factory = orm.new_session_factory(url or f"sqlite:///{db}")
    session = factory()
    alice = orm.User(name="alice")
    session.add_all([alice, orm.Spawner(user=alice, name="thesis")])
    session.commit()
    session.close()
    factory.kw["bind"].dispose()
    return home / "hub"


SECRETS_SQL = (
    "SELECT users.name, s.name, s.value, s.set_at FROM gpulab_secrets s "
    "JOIN users ON users.id = s.user_id ORDER BY s.name"
)
CHOICES_SQL = (
    "SELECT sp.name, c.collaborators, s.name FROM gpulab_secret_choices c "
    "JOIN spawners sp ON sp.id = c.server_id "
    "JOIN gpulab_secret_chosen n ON n.server_id = c.server_id "
    "JOIN gpulab_secrets s ON s.id = n.secret_id"
)
FIXTURE_SECRETS = [
    ("alice", "HF_TOKEN", "gAAAAABm-encrypted-by-the-hub-never-plaintext", "2026-11-27T03:35:12Z"),
    ("alice", "WANDB_API_KEY", "gAAAAABm-another-encrypted-value", "2026-11-27T03:35:12Z"),
]


def _secrets_imported(hub: Path, log: str, rows, choices) -> None:
    """The fixture's secrets file was imported, each secret and the choice, and its
    folder kept as the pre-upgrade backup."""
    assert f"Imported 2 secret(s) from {hub / 'secrets'}" in log, log
    assert not (hub / "secrets").exists()
    assert (hub / "secrets.pre-database" / "alice.json").is_file()
    assert [tuple(r) for r in rows] == FIXTURE_SECRETS
    assert [(p, bool(c), n) for p, c, n in choices] == [("thesis", False, "HF_TOKEN")]
    # the sharing settings of alice's project, which the hub has (bob's vision it has not)
    assert "Imported the sharing settings of 1 project(s)" in log, log
    assert "bob/vision (no such project)" in log
    assert (hub / "sharing.json.imported").is_file() and not (hub / "sharing.json").exists()


def test_a_hub_start_upgrades_gpulabs_tables_after_a_backup_and_a_restart_changes_nothing(
    tmp_path,
):
    hub = _older_hub(tmp_path)
    db = hub / "jupyterhub.sqlite"
    env = _env(hub.parent, tmp_path)

    log = _start_and_stop(hub, env, tmp_path / "first.log")
    assert _revision(db) == migrate.head()
    backups = sorted(hub.glob("jupyterhub.sqlite.gpulab-upgrade-*"))
    assert len(backups) == 1, log
    assert _revision(backups[0]) is None  # the database as it was before the upgrade
    with sqlite3.connect(backups[0]) as con:
        assert con.execute("SELECT name FROM users").fetchall() == [("alice",)]
    assert f"The database was backed up first to {backups[0]}." in log
    assert "DatabaseError" not in log, log  # (services stopped mid-import print tracebacks)
    # the fixture's usage ledger file was imported, every record, and kept as the backup
    ledger = hub / "gpu-usage.jsonl"
    assert not ledger.exists() and (hub / "gpu-usage.jsonl.imported").is_file()
    assert f"Imported 2 GPU usage record(s) from {ledger}" in log
    with sqlite3.connect(db) as con:
        got = con.execute("SELECT owner, project, uuid FROM gpulab_usage ORDER BY started")
        assert got.fetchall() == [
            ("bob", "vision", "GPU-00000001"),
            ("alice", "thesis", "GPU-00000000"),
        ]
        _secrets_imported(
            hub, log, con.execute(SECRETS_SQL).fetchall(), con.execute(CHOICES_SQL).fetchall()
        )

    log = _start_and_stop(hub, env, tmp_path / "second.log")
    assert sorted(hub.glob("jupyterhub.sqlite.gpulab-upgrade-*")) == backups
    assert "backed up first" not in log and "Imported" not in log
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM gpulab_usage").fetchone() == (2,)
        assert [tuple(r) for r in con.execute(SECRETS_SQL)] == FIXTURE_SECRETS
    with sqlite3.connect(db) as con:
        assert ("alice",) in con.execute("SELECT name FROM users").fetchall()


def test_gpulab_upgrade_db_upgrades_by_hand_and_then_finds_nothing_to_do(tmp_path):
    hub = _older_hub(tmp_path)
    env = _env(hub.parent, tmp_path)
    first = subprocess.run([GPULAB, "upgrade-db"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert f"revision none -> {migrate.head()}" in first.stdout
    assert "backed up first to" in first.stdout
    assert _revision(hub / "jupyterhub.sqlite") == migrate.head()
    again = subprocess.run([GPULAB, "upgrade-db"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
    assert len(list(hub.glob("jupyterhub.sqlite.gpulab-upgrade-*"))) == 1
    # the fixture's login identities were imported; an admin forgets some (a move to
    # another provider): those accounts are bound again at their next login
    assert "Imported the login identities of 2 account(s)" in first.stdout
    store = identities.IdentityStore(f"sqlite:///{hub / 'jupyterhub.sqlite'}")
    assert store.bound("bob") == ("ldap", "entryUUID=5e2f3b14-8a1c-4d6e-9f00-bob")
    forgot = subprocess.run(
        [GPULAB, "forget-logins", "bob", "nobody"], env=env, capture_output=True, text=True
    )
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.splitlines() == [
        "Forgot the login identity of bob: its next login binds it again.",
        "No login identity of nobody was kept.",
    ]
    assert store.bound("bob") is None and store.bound("alice") is not None
    refused = subprocess.run([GPULAB, "forget-logins"], env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "name the accounts, or say --all" in refused.stderr
    done = subprocess.run(
        [GPULAB, "forget-logins", "--all"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and store.bound("alice") is None
    db_engine.dispose()


SECRET = "db-passw0rd-5150"


def test_a_hub_on_postgresql_keeps_every_table_there_and_a_restart_changes_nothing(
    tmp_path, pg_server
):
    """GPULAB_DB_URL: JupyterHub's tables and gpulab's in one PostgreSQL database, none
    in a SQLite file; the usage ledger file and the secrets imported there once; a second start (and
    `gpulab upgrade-db`) finds it up to date."""
    # a password in the URL, as production has one (the tests' server trusts 127.0.0.1)
    url = pg_kit.fresh_database(pg_server).replace("postgres@", f"postgres:{SECRET}@", 1)
    assert SECRET in url
    hub = _older_hub(tmp_path, url)
    env = {**_env(hub.parent, tmp_path), "GPULAB_DB_URL": url}

    log = _start_and_stop(hub, env, tmp_path / "first.log")
    assert not (hub / "jupyterhub.sqlite").exists(), "a SQLite database was made beside"
    assert not list(hub.glob("jupyterhub.sqlite.gpulab-upgrade-*"))
    assert "DatabaseError" not in log, log
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            version = conn.execute(sa.text(f"SELECT version_num FROM {tables.VERSION_TABLE}"))
            assert version.scalar_one() == migrate.head()
            users = {r[0] for r in conn.execute(sa.text("SELECT name FROM users"))}
            assert "admin" in users, users  # the first admin, JupyterHub's row
            got = conn.execute(sa.text("SELECT owner, project FROM gpulab_usage ORDER BY started"))
            assert got.fetchall() == [("bob", "vision"), ("alice", "thesis")]
            secrets = conn.execute(sa.text(SECRETS_SQL)).fetchall()
            _secrets_imported(hub, log, secrets, conn.execute(sa.text(CHOICES_SQL)).fetchall())
        assert (hub / "gpu-usage.jsonl.imported").is_file()

        log = _start_and_stop(hub, env, tmp_path / "second.log")
        assert "Imported" not in log and "DatabaseError" not in log, log
        again = subprocess.run([GPULAB, "upgrade-db"], env=env, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        assert "up to date" in again.stdout
        for words in (again.stdout, again.stderr, log):
            assert SECRET not in words  # the hub and the command show the URL without it
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM gpulab_usage")).scalar_one() == 2
    finally:
        engine.dispose()

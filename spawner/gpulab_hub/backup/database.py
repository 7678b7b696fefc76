"""The hub's database in a backup where it is PostgreSQL (``GPULAB_DB_URL``, as under
``docker compose``): ``pg_dump`` writes one consistent snapshot while the hub runs (its
custom format, ``hub/database.pgdump`` in the archive); ``pg_restore`` loads it into the
restoring hub's own database in one transaction. A SQLite database is a file, copied
with SQLite's online backup API (make.py).

The password of a URL goes to the tools in their environment (``PGPASSWORD``), never on
a command line, where every account of the machine could read it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import sqlalchemy as sa

from gpulab_hub.backup import BackupError

DUMP = "database.pgdump"  # the member in the archive's hub folder
TIMEOUT = 6 * 3600  # seconds one pg_dump or pg_restore may take


def postgresql(url: object) -> bool:
    if not isinstance(url, str) or not url:
        return False
    try:
        return sa.make_url(url).get_backend_name() == "postgresql"
    except sa.exc.ArgumentError:
        return False


def shown(url: str) -> str:
    """``url`` as the admin may read it (no password)."""
    return sa.make_url(url).render_as_string(hide_password=True)


def _tool(name: str) -> str:
    """pg_dump or pg_restore: on the PATH, else Debian's newest (postgresql-client)."""
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if not found:
        raise BackupError(
            f"The hub's database is PostgreSQL and {name} is not installed here: "
            "apt-get install postgresql-client (the compose hub image has it)."
        )
    return found


def _conninfo(url: str) -> tuple[str, dict[str, str]]:
    """libpq's URI of ``url`` without its password, and the environment that gives it."""
    u = sa.make_url(url)
    env = {**os.environ}
    if u.password:
        env["PGPASSWORD"] = str(u.password)
    plain = sa.engine.URL.create(  # (URL.set takes None as "keep it")
        "postgresql", username=u.username, host=u.host, port=u.port, database=u.database,
        query=u.query,
    )  # fmt: skip
    return plain.render_as_string(hide_password=False), env


def _run(argv: list[str], env: dict[str, str], what: str) -> None:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise BackupError(f"{what} took longer than {TIMEOUT // 3600} hours; stopped.") from None
    if done.returncode != 0:
        raise BackupError(f"{what} failed: {done.stderr.strip()[-1500:]}")


def dump(url: str, dest: Path) -> None:
    """``pg_dump`` of the database ``url`` into the new file ``dest`` (0600)."""
    conninfo, env = _conninfo(url)
    argv = [_tool("pg_dump"), "--format=custom", "--no-owner", "--file", str(dest), conninfo]
    _run(argv, env, f"pg_dump of the hub's database {shown(url)}")
    os.chmod(dest, 0o600)  # password hashes and tokens


def has_hub(url: str) -> bool:
    """Whether the database ``url`` holds a hub's tables (JupyterHub's ``users``)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sa.inspect(conn).has_table("users")
    except sa.exc.SQLAlchemyError as e:
        raise BackupError(f"Could not reach the hub's database {shown(url)}: {e}") from e
    finally:
        engine.dispose()


def restore(url: str, dump_file: Path, *, aside: Path | None) -> list[str]:
    """The archive's dump into the database ``url``, whole or not at all. ``aside``:
    where the database's present content is dumped first (``--force``); its tables are
    then replaced. -> what was done, in sentences."""
    said = []
    if aside is not None:
        dump(url, aside)
        said.append(f"Dumped what the database {shown(url)} held to {aside}.")
    conninfo, env = _conninfo(url)
    argv = [
        _tool("pg_restore"), "--no-owner", "--single-transaction", "--exit-on-error",
        *(["--clean", "--if-exists"] if aside is not None else []),
        "--dbname", conninfo, str(dump_file),
    ]  # fmt: skip
    _run(argv, env, f"pg_restore into the hub's database {shown(url)}")
    said.append(f"Restored the hub's database into {shown(url)}.")
    return said


def counts(url: str) -> tuple[int, int]:
    """Accounts and projects (named servers) in the hub's database ``url``."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            users = conn.execute(sa.text("SELECT count(*) FROM users")).scalar_one()
            servers = conn.execute(
                sa.text("SELECT count(*) FROM spawners WHERE name != ''")
            ).scalar_one()
            return users, servers
    finally:
        engine.dispose()

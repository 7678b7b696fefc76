"""A PostgreSQL server of the tests' own (Debian's postgresql package: scripts/setup.sh
test installs it), for running gpulab's records layer on PostgreSQL as well as SQLite.

:func:`server` starts one cluster in a temporary folder (initdb, trust on 127.0.0.1,
a free port, its socket in that folder), run as the ``postgres`` account when the
tests run as root (PostgreSQL refuses root); :func:`fresh_database` makes an empty
database on it for one test. The cluster is stopped at the end of the session.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from conftest import free_port

DRIVER = "postgresql+psycopg"


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    assert found, f"no PostgreSQL {name}: run `bash scripts/setup.sh test` (Debian's postgresql)"
    return found[-1]


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def server(folder: Path) -> Iterator[str]:
    """A PostgreSQL server for the session; the URL of its ``postgres`` database."""
    data = folder / "data"
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    subprocess.run(
        _as_postgres([_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    port = free_port()
    log = folder / "server.log"
    opts = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder}"
    subprocess.run(
        _as_postgres([_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "start"]),
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    url = f"{DRIVER}://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                engine = sa.create_engine(url)
                with engine.connect():
                    pass
                engine.dispose()
                break
            except sa.exc.OperationalError:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        yield url
    finally:
        subprocess.run(
            _as_postgres([_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            capture_output=True, text=True,
        )  # fmt: skip


def fresh_database(url: str, copy_of: str | None = None) -> str:
    """A new database on the server of ``url``: empty, or a copy of the database
    ``copy_of`` (its URL; no one may be connected to it); its URL."""
    name = "gpulab_" + uuid.uuid4().hex[:12]
    template = f' TEMPLATE "{sa.make_url(copy_of).database}"' if copy_of else ""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"{template}')
    engine.dispose()
    return url.rsplit("/", 1)[0] + "/" + name

"""One SQLAlchemy engine a database a process: gpulab's client of JupyterHub's database.

:func:`of` gives the engine of a ``db_url`` (made on first use, kept for the process);
``with begin(url) as conn:`` is one transaction (committed whole when the block ends,
rolled back if it raises); ``with begin_write(url) as conn:`` one that changes rows
after reading them (SQLite: it takes the write lock as it begins, so two such
transactions wait for each other instead of one failing when both read first). All
are blocking work: the guard (``blocking.off_loop``) refuses them on the event loop's
thread under ``GPULAB_LOOP_GUARD=strict``.

SQLite: a connection never makes a missing database file (the upgrade does); each
connection turns foreign keys on (so ON DELETE CASCADE holds), waits up to
``blocking.LOCK_TIMEOUT`` for another writer, and opens its transactions itself
(``BEGIN``), so a migration's DDL and the rows written with it commit together — the
pysqlite driver would otherwise commit DDL as it goes.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from gpulab_hub import blocking

_engines: dict[tuple[str, bool], sa.Engine] = {}
_lock = threading.Lock()


class DatabaseError(Exception):
    """gpulab's tables cannot be used as they are; ``str()`` says why and what to do."""


def is_sqlite(url: str) -> bool:
    return sa.make_url(url).get_backend_name() == "sqlite"


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite ``url`` (None: another database, or one in memory)."""
    u = sa.make_url(url)
    if u.get_backend_name() != "sqlite" or u.database in (None, "", ":memory:"):
        return None
    return u.database


def shown(url: str) -> str:
    """``url`` as logs and pages may show it (no password)."""
    return sa.make_url(url).render_as_string(hide_password=True)


def make(url: str, immediate: bool = False, create: bool | None = None) -> sa.Engine:
    """A new engine for ``url``; ``immediate``: SQLite transactions take the write lock
    as they begin (``BEGIN IMMEDIATE``: a migration, so two never interleave);
    ``create`` (by default as ``immediate``): a missing SQLite file is made. Otherwise a
    missing SQLite file is an error, never made empty: only the upgrade makes the
    database (with its tables)."""
    create = immediate if create is None else create
    kwargs: dict = {"pool_pre_ping": True}
    if is_sqlite(url):
        kwargs["connect_args"] = {"timeout": blocking.LOCK_TIMEOUT, "check_same_thread": False}
        path = sqlite_file(url)
        if path is not None and not create:
            where = Path(path).absolute().as_uri() + "?mode=rw"
            kwargs["creator"] = lambda: sqlite3.connect(
                where, uri=True, timeout=blocking.LOCK_TIMEOUT, check_same_thread=False
            )
    engine = sa.create_engine(url, **kwargs)
    if is_sqlite(url):
        begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_con, _record) -> None:
            dbapi_con.isolation_level = None  # the driver opens no transaction itself
            cursor = dbapi_con.cursor()
            try:
                cursor.execute("PRAGMA foreign_keys=ON")
            finally:
                cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn) -> None:
            conn.exec_driver_sql(begin)

    return engine


def of(url: str, writing: bool = False) -> sa.Engine:
    """This process's engine for ``url`` (made on first use); ``writing``: the one whose
    SQLite transactions take the write lock as they begin (:func:`begin_write`)."""
    blocking.off_loop("Opening gpulab's database")
    key = (url, writing)
    with _lock:
        made = _engines.get(key)
        if made is None:
            made = _engines[key] = make(url, immediate=writing, create=False)
        return made


@contextlib.contextmanager
def begin(url: str) -> Iterator[sa.Connection]:
    """One transaction on gpulab's engine for ``url``: committed when the block ends,
    rolled back if it raises."""
    blocking.off_loop("A transaction on gpulab's database")
    with of(url).begin() as conn:
        yield conn


@contextlib.contextmanager
def begin_write(url: str) -> Iterator[sa.Connection]:
    """:func:`begin` for a transaction that reads rows and then changes them."""
    blocking.off_loop("A transaction on gpulab's database")
    with of(url, writing=True).begin() as conn:
        yield conn


def unusable(url: str, what: str, e: Exception) -> str:
    """The log's words for ``what`` ("The secrets of alice") that the database at
    ``url`` could not give or keep (``e``: the driver's error)."""
    return f"{what} in {shown(url)} cannot be used now: {type(e).__name__}: " + (
        str(e).splitlines() or [""]
    )[0][:300]


@contextlib.contextmanager
def guarded(url: str, what: str, error: type[Exception], writing: bool = False):
    """:func:`begin` (``writing``: :func:`begin_write`) whose failure to use the database
    raises ``error`` with :func:`unusable`'s words, the driver's error as its cause;
    what the block itself raises otherwise goes through as it is."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with (begin_write if writing else begin)(url) as conn:
            yield conn
    except (SQLAlchemyError, DatabaseError) as e:
        raise error(unusable(url, what, e)) from e


def dispose() -> None:
    """Close every engine this process made (tests, and a hub's stop)."""
    with _lock:
        made = list(_engines.values())
        _engines.clear()
    for engine in made:
        engine.dispose()

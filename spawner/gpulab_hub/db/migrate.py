"""Upgrading gpulab's tables, as JupyterHub upgrades its own.

:func:`upgrade` brings gpulab's tables to this gpulab's revision (the head of
``migrations/versions``), recorded in ``gpulab_alembic_version``. Before it changes
anything in a SQLite database file that was there already, it copies the file with
SQLite's online backup API to ``<db file>.gpulab-upgrade-<UTC time>`` beside it (0600);
another database is the admin's to back up first (``pg_dump``), as with JupyterHub's own
``jupyterhub upgrade-db``. The migration and the imports of files of gpulab before its
database (:class:`Import`) run in one transaction that holds the database's write lock
(SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock), so two upgrades at once
never interleave and a crash leaves the database as it was.

A fresh database gets JupyterHub's tables first (``jupyterhub.orm``, as at JupyterHub's
first start): gpulab's rows name JupyterHub's users by foreign key. A database of a
newer gpulab (a revision this one does not know) is refused, never changed.

``gpulab upgrade-db`` calls :func:`upgrade`; the hub calls :func:`at_start` as it reads
its configuration (jupyterhub_config.py), before it serves anyone.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import sqlalchemy as sa

from gpulab_hub import blocking, jsonfile, stateversion
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import tables

LOG = logging.getLogger("gpulab_hub")
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
ADVISORY_KEY = 0x6770756C6162  # "gpulab": PostgreSQL's lock of gpulab's upgrades


class Import(Protocol):
    """A file of gpulab before its database, imported into its tables at the upgrade."""

    def pending(self) -> bool:
        """Whether there is something to import (cheap: no database)."""

    def run(self, conn: sa.Connection) -> str:
        """Import within the upgrade's transaction; a sentence saying what was done."""

    def finish(self) -> None:
        """After the upgrade committed (the file kept as the pre-upgrade backup)."""


class FileImport:
    """An :class:`Import` of one file (or folder) ``path`` of gpulab before its database:
    done once (its row in ``gpulab_imports`` named :attr:`name`, written in the same
    transaction), then the file kept as ``<path><suffix>``, the pre-upgrade backup.
    Subclasses say what it is (:attr:`what`) and import it (:meth:`rows`)."""

    name = ""  # its row in gpulab_imports
    suffix = ".imported"
    what = "the file"  # "the sharing settings": how the log names it
    counted = "{n} record(s)"  # "{n} secret(s)": how the upgrade's words count them

    def __init__(self, path: str | Path, clock=time.time, log=None):
        self.path = Path(path)
        self._clock = clock
        self.log = log or LOG
        self._keep = False

    def pending(self) -> bool:
        return os.path.lexists(self.path)

    def read(self, path: Path, kind, section: str, max_bytes: int):
        """The ``section`` of the record file ``path`` (read bounded, never through a
        link), in ``kind``'s current format. A file of a newer gpulab, or one the hub may
        not read, stops the upgrade (db_engine.DatabaseError); a damaged one raises
        jsonfile.NotARecord, ValueError, TypeError or KeyError for the caller to judge."""
        try:
            return jsonfile.section_of(jsonfile.read_regular(path, max_bytes), path, kind, section)
        except stateversion.NewerState as e:
            raise db_engine.DatabaseError(str(e)) from None
        except OSError as e:
            raise db_engine.DatabaseError(
                f"{path} cannot be read ({e.strerror or e}): give the hub's account access "
                "to it, then start again."
            ) from None

    def rows(self, conn: sa.Connection) -> tuple[int, list[str]]:
        """Import the file within the upgrade's transaction: how many records, and what
        was left out (each in words). Raise db_engine.DatabaseError to stop the upgrade."""
        raise NotImplementedError

    def run(self, conn: sa.Connection) -> str:
        kept = kept_name(self.path, self.suffix)
        done = conn.execute(
            sa.select(tables.imports.c.rows).where(tables.imports.c.name == self.name)
        ).scalar()
        if done is not None:
            self._keep = True
            return (
                f"{self.what[:1].upper()}{self.what[1:]} in {self.path} were imported before "
                f"({self.counted.format(n=done)}); kept as {kept}."
            )
        n, left_out = self.rows(conn)
        conn.execute(
            tables.imports.insert(),
            {"name": self.name, "source": str(self.path), "rows": n, "skipped": len(left_out),
             "at": self._clock()},
        )  # fmt: skip
        self._keep = True
        said = f"Imported {self.counted.format(n=n)} from {self.path}"
        if left_out:
            said += f", leaving out {len(left_out)}: " + "; ".join(left_out)
        return f"{said}. It is kept as {kept}, the pre-upgrade backup."

    def finish(self) -> None:
        if not self._keep or not self.pending():
            return
        dest = keep(self.path, self.suffix)
        self.log.info("gpulab: %s %s is kept as %s", self.what, self.path, dest)


@dataclass(frozen=True)
class Upgraded:
    before: str | None  # gpulab's revision found (None: no gpulab tables yet)
    after: str
    backup: Path | None = None  # the copy made first (SQLite)
    imported: tuple[str, ...] = ()  # each import's sentence

    @property
    def changed(self) -> bool:
        return self.before != self.after or bool(self.imported)

    def words(self, url: str) -> str:
        where = db_engine.shown(url)
        if not self.changed:
            return f"gpulab's tables in {where} are up to date (revision {self.after})."
        said = [f"gpulab's tables in {where}: revision {self.before or 'none'} -> {self.after}."]
        if self.backup is not None:
            said.append(f"The database was backed up first to {self.backup}.")
        return " ".join([*said, *self.imported])


def kept_name(path: str | Path, suffix: str) -> Path:
    """Where an imported file ``path`` is kept (the pre-upgrade backup): ``<path><suffix>``,
    or ``<path><suffix>.N`` where that is taken."""
    first = Path(str(path) + suffix)
    dest, n = first, 1
    while os.path.lexists(dest):
        dest, n = first.with_name(f"{first.name}.{n}"), n + 1
    return dest


def keep(path: str | Path, suffix: str) -> Path:
    """Rename the imported file (or folder) ``path`` to :func:`kept_name`; where it is now."""
    dest = kept_name(path, suffix)
    os.rename(path, dest)
    jsonfile.fsync_dir(Path(path).parent)
    return dest


def _config(conn: sa.Connection | None = None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def head() -> str:
    """This gpulab's revision of its tables."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()


def revision(conn: sa.Connection) -> str | None:
    """gpulab's revision recorded in the database (None: no gpulab tables)."""
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts={"version_table": tables.VERSION_TABLE})
    return ctx.get_current_revision()


def current(url: str) -> str | None:
    """gpulab's revision in the database at ``url``."""
    with db_engine.begin(url) as conn:
        return revision(conn)


def _known(rev: str | None, url: str) -> None:
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    if rev is None:
        return
    try:
        ScriptDirectory.from_config(_config()).get_revision(rev)
    except CommandError:
        raise db_engine.DatabaseError(
            f"gpulab's tables in {db_engine.shown(url)} are at revision {rev}, which this "
            "gpulab does not know: a newer gpulab made them. Run that gpulab (or restore a "
            "backup of the database made before it)."
        ) from None


def _jupyterhub_tables(url: str) -> None:
    """JupyterHub's tables in a database that has none yet (as its first start makes
    them, stamped with its revision)."""
    from jupyterhub import orm

    # Outside a JupyterHub process, JupyterHub's Alembic environment sets logging up from
    # its own alembic.ini (the root logger's handlers and level): keep this process's.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        factory = orm.new_session_factory(url)
        factory.kw["bind"].dispose()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def backup_sqlite(path: str | Path, clock=time.time) -> Path:
    """A consistent copy of the SQLite database ``path`` beside it (its online backup
    API), readable by the hub's account only; the copy's path."""
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock()))
    for n in range(100):
        dest = path.with_name(f"{path.name}.gpulab-upgrade-{stamp}" + (f".{n}" if n else ""))
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        break
    else:
        raise db_engine.DatabaseError(f"No free name for a backup of {path} beside it.")
    src = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()
    return dest


def upgrade(
    url: str, *, backup: bool = True, imports: Sequence[Import] = (), log=LOG, clock=time.time
) -> Upgraded:
    """Bring gpulab's tables at ``url`` to :func:`head`, then run ``imports`` (those
    with something to import), all in one transaction; a backup of a SQLite file first.
    Blocking."""
    blocking.off_loop("Upgrading gpulab's tables")
    target = head()
    path = db_engine.sqlite_file(url)
    existed = path is not None and os.path.isfile(path)
    engine = db_engine.make(url, immediate=True)
    try:
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            found = revision(conn) if tables.VERSION_TABLE in names else None
        _known(found, url)
        todo = [i for i in imports if i.pending()]
        if found == target and not todo:
            return Upgraded(found, target)
        if "users" not in names:
            _jupyterhub_tables(url)
        saved = backup_sqlite(path, clock) if backup and existed else None
        if saved is not None:
            log.info("gpulab: backed up %s to %s before upgrading its tables", path, saved)
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_KEY})
            found = revision(conn)  # another upgrade may have run meanwhile
            _known(found, url)
            if found != target:
                from alembic import command

                command.upgrade(_config(conn), "head")
            said = tuple(i.run(conn) for i in todo)
        for i in todo:
            i.finish()
    finally:
        engine.dispose()
    done = Upgraded(found, target, saved, said)
    log.info("%s", done.words(url))
    return done


def at_start(url: str, imports: Sequence[Import] = ()) -> Upgraded | None:
    """The hub's automatic upgrade, as it reads its configuration (on its event loop,
    before it serves anyone). A command reading the same configuration (``gpulab
    gpus``, ``gpulab backup``) upgrades nothing: only a JupyterHub process does."""
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        return None
    with blocking.allowed("upgrading gpulab's tables as the hub starts, before it serves anyone"):
        return upgrade(url, imports=imports)

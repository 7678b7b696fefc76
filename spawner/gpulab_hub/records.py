"""Per-project records: what every store the hub keeps about a project implements.

Several stores of the hub's records folder name a project by ``(owner, project)``: its
sharing settings, public links, links' access times, the owner's choice of secrets,
the roles mirroring group shares, the multi-node jobs, the GPU holdings, and (per
owner) the SSH keys. A rename must move each of them and a deletion forget each of
them, or a renamed project loses what it had and a new project of the old name
inherits it. So each store says how, beside its own code, in a small class of this
protocol, and one registry lists those classes (``gpulab_hub.workflows.records``);
rename and delete walk the registry and name no store themselves.

A record class is made from :class:`Where` (what every store needs to find its
file) and is blocking work: it runs on a thread of the records pool
(``blocking.RECORDS``), never on the event loop. A record that mirrors JupyterHub's
database (``server = True``: the group shares' roles) does its database part through
``Where.on_loop``, on the loop's thread, as JupyterHub's session requires.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

LOG = logging.getLogger("gpulab.records")

Undo = Callable[[], None]  # puts a move back


def run_here(fn: Callable[..., Any], *args: Any) -> Any:
    """``Where.on_loop`` where the caller is on the database's thread already (tests,
    the command line)."""
    return fn(*args)


@dataclass(frozen=True)
class Where:
    """Where the hub keeps a project's records (from a ProjectSpawner's settings)."""

    records_dir: Path  # ProjectSpawner.records_dir: the hub's private records folder
    allocations_file: Path | None = None  # ProjectSpawner.allocations_file
    log: logging.Logger | logging.LoggerAdapter = LOG
    db: Any = None  # JupyterHub's database session: used on the loop's thread only
    # Runs ``fn(*args)`` on the thread that owns ``db`` and returns what it returned.
    on_loop: Callable[..., Any] = run_here

    @property
    def db_url(self) -> str | None:
        """The URL of the database of ``db`` (JupyterHub's), for gpulab's own engine on
        this thread (db/engine.py); None without ``db``. No database work: the URL only."""
        if self.db is None:
            return None
        return self.db.get_bind().url.render_as_string(hide_password=False)


@runtime_checkable
class ProjectRecords(Protocol):
    """One store's records of projects: moved on a rename, forgotten on a deletion."""

    # How a rename's answer names what moved ("sharing settings").
    what: ClassVar[str]
    # The store's class (the test that every store is registered checks it).
    store: ClassVar[type]
    # Keyed by project: False for a record of the owner only (SSH keys), which only
    # forget_owner changes.
    per_project: ClassVar[bool]
    # Kept only while the project's server runs (GPU holdings): a stopped project has
    # none to move, so a rename (of a stopped project) leaves it; deletion forgets it.
    moves: ClassVar[bool]
    # Mirrors JupyterHub's database (the server row): a rename moves it after the row,
    # and puts it back after the row is back.
    server: ClassVar[bool]

    def __init__(self, where: Where) -> None: ...

    def move(self, owner: str, old: str, new: str) -> Undo | None:
        """``owner``'s records of ``old`` as those of ``new`` (anything recorded under
        ``new`` is dropped first); how to put it back, or None when neither had any."""

    def holds(self, owner: str, project: str) -> bool:
        """Whether anything is recorded for ``owner``'s ``project``. A rename finished
        after a crash (workflows/recovery.py) moves a store only while the old name
        holds something: a move again would drop what moved under the new name."""

    def forget(self, owner: str, project: str) -> None:
        """Drop the records of a deleted project: a new one of the name gets nothing."""

    def forget_owner(self, owner: str) -> None:
        """Drop every record of a deleted account's projects (and of the account)."""


class Records:
    """Defaults of :class:`ProjectRecords` for a store's record class to build on."""

    per_project: ClassVar[bool] = True
    moves: ClassVar[bool] = True
    server: ClassVar[bool] = False

    def __init__(self, where: Where) -> None:
        self.where = where

    def move(self, owner: str, old: str, new: str) -> Undo | None:
        return None

    def holds(self, owner: str, project: str) -> bool:
        if self.per_project and self.moves and type(self).move is not Records.move:
            raise NotImplementedError(f"{type(self).__name__} moves records but has no holds()")
        return False

    def forget(self, owner: str, project: str) -> None:
        return None

    def forget_owner(self, owner: str) -> None:
        return None


def move_keys(records: dict, old: Any, new: Any) -> tuple[dict, dict] | None:
    """``records`` with the entry ``old`` as ``new`` (``new``'s own dropped), and what
    both keys held before (for the undo); None when neither was there."""
    before = {k: records[k] for k in (old, new) if k in records}
    if not before:
        return None
    after = dict(records)
    after.pop(new, None)
    if old in before:
        after[new] = after.pop(old)
    return after, before


def put_back(records: dict, before: dict, old: Any, new: Any) -> dict:
    """``records`` with the keys ``old`` and ``new`` as they were (``before``)."""
    after = dict(records)
    for key in (old, new):
        after.pop(key, None)
        if key in before:
            after[key] = before[key]
    return after


def on_loop_of(loop) -> Callable[..., Any]:
    """``Where.on_loop`` for work on a records thread: ``fn(*args)`` runs on ``loop``'s
    thread (JupyterHub's database lives there) and the thread waits for its result."""
    import asyncio

    def call(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # already on the loop's thread
            return fn(*args)

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), loop).result()

    return call


class ByServerRow(Records):
    """A store kept in the hub's database whose rows name JupyterHub's server row by
    foreign key (``table.c.server_id``, ON DELETE CASCADE): a rename renames the row in
    place, so the records have moved once it has (``server``: after the row); a
    deletion of the project or its owner takes them with the row. Nothing to move or
    forget here: a rename only names them among what moved."""

    server: ClassVar[bool] = True
    table: ClassVar[Any] = None  # the store's table (db/tables.py)

    def _has(self, owner: str, project: str) -> bool:
        if self.where.db is None:
            return False
        return self.where.on_loop(_has_row, self.where.db, self.table, owner, project)

    def move(self, owner: str, old: str, new: str) -> Undo | None:
        if not self._has(owner, new):
            return None
        return lambda: None  # the row carries them back as it is renamed back

    def holds(self, owner: str, project: str) -> bool:
        return self._has(owner, project)


def _has_row(db, table, owner: str, project: str) -> bool:
    """Whether ``table`` has a row of ``owner``'s ``project`` (JupyterHub's session)."""
    import sqlalchemy as sa

    from gpulab_hub.db import tables

    servers, users = tables.SPAWNERS, tables.USERS
    q = (
        sa.select(table.c.server_id)
        .join(servers, servers.c.id == table.c.server_id)
        .join(users, users.c.id == servers.c.user_id)
        .where(users.c.name == owner, servers.c.name == project)
    )
    return db.execute(q).first() is not None

"""A project's rename or deletion, written down before it begins and crossed out after.

A rename moves a project in several places (its folders, the hub's record files,
JupyterHub's server row, the roles of its group shares) and a deletion takes it out of
them: neither can be one transaction, since most of the places are files. So each
writes a row in ``gpulab_workflows`` (db/tables.py), in JupyterHub's database, before
its first step, and removes it after its last. A hub killed in between (SIGKILL, a
power cut) finds the row as it starts and finishes the work (workflows/recovery.py).

The row names JupyterHub's server row by foreign key, ON DELETE CASCADE: JupyterHub's
own removal of the server, a deletion's last step, removes the row in the same
transaction, and so does deleting the user.

These functions take JupyterHub's session (``db``) and commit, so they run where that
session lives: the hub's event loop (a rename's thread asks it, as for the server row).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gpulab_hub.db import tables

RENAME, DELETE = "rename", "delete"


@dataclass(frozen=True)
class Entry:
    """A workflow under way, as its row says."""

    id: int
    server_id: int
    kind: str
    owner: str
    project: str  # the name it had
    new_name: str | None  # rename: the name it gets
    display_name: str | None  # rename: the display name it gets
    place: dict[str, Any]  # the hub's folders it touches (JSON)
    started: float


def begin(
    db,
    server_id: int,
    kind: str,
    owner: str,
    project: str,
    place: dict[str, Any],
    new_name: str | None = None,
    display_name: str | None = None,
) -> int:
    """Write the workflow's row (committed); its id. IntegrityError if the project has
    one already (one workflow a project at a time)."""
    row = db.execute(
        tables.workflows.insert().values(
            server_id=server_id,
            kind=kind,
            owner=owner,
            project=project,
            new_name=new_name,
            display_name=display_name,
            place=json.dumps(place, sort_keys=True),
            started=time.time(),
        )
    )
    db.commit()
    return int(row.inserted_primary_key[0])


def end(db, entry_id: int) -> None:
    """Remove the workflow's row (committed): it is done, or was put back whole."""
    db.execute(tables.workflows.delete().where(tables.workflows.c.id == entry_id))
    db.commit()


def pending(db) -> list[Entry]:
    """Every workflow under way, oldest first."""
    w = tables.workflows.c
    rows = db.execute(sa.select(tables.workflows).order_by(w.started, w.id)).mappings()
    fields = [f for f in Entry.__dataclass_fields__ if f != "place"]
    return [Entry(**{f: r[f] for f in fields}, place=json.loads(r["place"])) for r in rows]


def count(conn) -> int:
    """How many rows wait (a connection of gpulab's engine: cheap, no ORM)."""
    return int(conn.execute(sa.select(sa.func.count()).select_from(tables.workflows)).scalar())

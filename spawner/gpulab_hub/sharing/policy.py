"""What an owner allows the people a project is shared with, kept by the hub.

Kept in the hub's database (the table ``gpulab_sharing_settings``, db/tables.py), never
in the project's folder: collaborators can write the project's files, and must not be
able to grant themselves more. One row a project whose owner changed its settings,
naming JupyterHub's server row by foreign key: it follows a rename (the row is renamed
in place) and goes with the project's or the owner's deletion, in the database itself.
A database the hub cannot read gives the defaults (least allowed), never more; a
change it cannot write says so. Every call blocks (the records pool).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import tables


@dataclass(frozen=True)
class ProjectSharing:
    collaborators_may_start: bool = False  # start the owner's stopped server
    collaborators_may_reshare: bool = False  # share the project on with others


class SettingsUnavailable(Exception):
    """The sharing settings cannot be read or saved now; ``str()`` says why (the log's)."""


LOG = logging.getLogger("gpulab.sharing")
_T, _SERVERS, _USERS = tables.sharing_settings, tables.SPAWNERS, tables.USERS
_NAMES = tuple(f.name for f in fields(ProjectSharing))


def _of(row) -> ProjectSharing:
    return ProjectSharing(**{name: bool(row[name]) for name in _NAMES})


class SharingPolicyStore:
    """Every project's sharing settings, by ``owner/project``."""

    Error = SettingsUnavailable
    what = "The sharing settings"

    def __init__(self, db_url: str, log=None):
        self.url = db_url
        self.log = log or LOG

    def _failed(self, e: Exception) -> SettingsUnavailable:
        return SettingsUnavailable(db_engine.unusable(self.url, "The sharing settings", e))

    def _rows(self, where=None) -> list:
        q = (
            sa.select(_USERS.c.name.label("owner"), _SERVERS.c.name.label("project"), _T)
            .select_from(_T)
            .join(_SERVERS, _SERVERS.c.id == _T.c.server_id)
            .join(_USERS, _USERS.c.id == _SERVERS.c.user_id)
        )
        if where is not None:
            q = q.where(*where)
        with db_engine.begin(self.url) as conn:
            return conn.execute(q).mappings().all()

    def get(self, owner: str, project: str) -> ProjectSharing:
        """The project's settings; the defaults (least allowed) if the database cannot
        be read (the reason logged)."""
        try:
            rows = self._rows((_USERS.c.name == owner, _SERVERS.c.name == project))
        except (SQLAlchemyError, db_engine.DatabaseError) as e:
            self.log.error("gpulab: %s", self._failed(e))
            return ProjectSharing()
        return _of(rows[0]) if rows else ProjectSharing()

    def snapshot(self) -> dict[str, ProjectSharing]:
        """Every project's settings by "owner/project", read once (blocking: call it off
        the event loop); {} if the database cannot be read (the defaults everywhere)."""
        try:
            rows = self._rows()
        except (SQLAlchemyError, db_engine.DatabaseError) as e:
            self.log.error("gpulab: %s", self._failed(e))
            return {}
        return {f"{r['owner']}/{r['project']}": _of(r) for r in rows}

    def set(self, owner: str, project: str, **changes: bool) -> ProjectSharing:
        """Change the project's settings (one transaction); the settings now. ValueError
        for a project the hub does not have, :attr:`Error` where it cannot save them."""
        unknown = set(changes) - set(_NAMES)
        if unknown:
            raise TypeError(f"not a sharing setting: {', '.join(sorted(unknown))}")
        try:
            with db_engine.begin_write(self.url) as conn:
                server_id = conn.execute(
                    sa.select(_SERVERS.c.id)
                    .join(_USERS, _USERS.c.id == _SERVERS.c.user_id)
                    .where(_USERS.c.name == owner, _SERVERS.c.name == project)
                ).scalar()
                if server_id is None:
                    raise ValueError(f"No project {owner}/{project}.")
                row = conn.execute(sa.select(_T).where(_T.c.server_id == server_id)).mappings()
                found = row.first()
                current = _of(found) if found else ProjectSharing()
                given = {k: bool(v) for k, v in changes.items()}
                new = ProjectSharing(**{**asdict(current), **given})
                conn.execute(sa.delete(_T).where(_T.c.server_id == server_id))
                conn.execute(sa.insert(_T).values(server_id=server_id, **asdict(new)))
                return new
        except (SQLAlchemyError, db_engine.DatabaseError) as e:
            raise self._failed(e) from e

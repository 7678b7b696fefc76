"""Each user's secrets and their projects' choices, in the hub's database.

Three tables (db/tables.py): ``gpulab_secrets`` (one row a secret: its user by foreign
key, its name, the value only as JupyterHub's CryptKeeper encrypted it (crypt.py), when
it was set), ``gpulab_secret_choices`` (one row a project that gets some: JupyterHub's
server row by foreign key, and whether collaborators' processes get them too) and
``gpulab_secret_chosen`` (which secrets a choice names). So the database itself keeps
them whole: deleting a secret takes it out of every choice, a project's choice follows
its rename (the server row is renamed in place) and goes with the project, and deleting
the account deletes its secrets. Each change is one transaction. This store never sees
a plaintext value. The files of gpulab before its database (``secrets/<user>.json``) are
imported once at the upgrade (importfile.py).

Every call blocks (the database): handlers call it on the records pool. A database the
hub cannot use raises :attr:`SecretStore.Error`, whose words are for the log.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa
from jupyterhub.slugs import is_valid_safe_slug

from gpulab_hub.accounts import USERNAME_PATTERN
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import tables
from gpulab_hub.secrets.names import MAX_SECRETS, SecretRefused


@dataclass(frozen=True)
class Secret:
    name: str
    set: str  # ISO 8601, UTC


@dataclass(frozen=True)
class Selection:
    """What one of the user's projects gets."""

    names: tuple[str, ...] = ()
    collaborators: bool = False  # collaborators' kernels, terminals and jobs get them too


class SecretsUnreadable(Exception):
    """The hub's database cannot be used for secrets now; ``str()`` says why (the log's)."""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_user(user) -> str:
    if not isinstance(user, str) or re.fullmatch(USERNAME_PATTERN, user) is None:
        raise ValueError(f"{user!r} is not a gpulab user name")
    return user


_S, _C, _N = tables.secrets, tables.secret_choices, tables.secret_chosen
_SERVERS, _USERS = tables.SPAWNERS, tables.USERS


class SecretStore:
    """One user's secrets (encrypted values) and their projects' choices."""

    Error = SecretsUnreadable

    def __init__(self, db_url: str, user: str, log=None):
        self.url = db_url
        self.user = check_user(user)
        self.log = log

    def _tx(self, writing: bool = False):
        what = f"The secrets of {self.user}"
        return db_engine.guarded(self.url, what, SecretsUnreadable, writing)

    def _user_id(self, conn: sa.Connection, lock: bool = False) -> int | None:
        """The user's row id; ``lock``: held until the transaction ends (PostgreSQL; a
        SQLite write transaction holds the whole database already), so two changes of
        one user's secrets never count past the limit together."""
        q = sa.select(_USERS.c.id).where(_USERS.c.name == self.user)
        return conn.execute(q.with_for_update() if lock else q).scalar()

    def _owner_id(self, conn: sa.Connection) -> int:
        uid = self._user_id(conn, lock=True)
        if uid is None:
            raise SecretRefused("The hub has no account of that name: log in again.")
        return uid

    # --- reading --------------------------------------------------------------------
    def listing(self) -> list[Secret]:
        """The user's secrets (names and dates, never values), by name."""
        q = (
            sa.select(_S.c.name, _S.c.set_at)
            .join(_USERS, _USERS.c.id == _S.c.user_id)
            .where(_USERS.c.name == self.user)
            .order_by(_S.c.name)
        )
        with self._tx() as conn:
            return [Secret(name, at) for name, at in conn.execute(q)]

    def selections(self) -> dict[str, Selection]:
        """What each of the user's projects gets (only projects with a choice)."""
        q = (
            sa.select(_SERVERS.c.name, _C.c.collaborators, _S.c.name)
            .select_from(_C)
            .join(_SERVERS, _SERVERS.c.id == _C.c.server_id)
            .join(_USERS, _USERS.c.id == _SERVERS.c.user_id)
            .outerjoin(_N, _N.c.server_id == _C.c.server_id)
            .outerjoin(_S, _S.c.id == _N.c.secret_id)
            .where(_USERS.c.name == self.user)
        )
        found: dict[str, tuple[bool, list[str]]] = {}
        with self._tx() as conn:
            for project, collaborators, name in conn.execute(q):
                names = found.setdefault(project, (bool(collaborators), []))[1]
                if name is not None:
                    names.append(name)
        return {p: Selection(tuple(sorted(n)), c) for p, (c, n) in sorted(found.items())}

    def encrypted_for(self, project: str, collaborator: bool) -> dict[str, str]:
        """The encrypted values ``project`` gets, by name: for its owner, the project's
        choice; for a collaborator, the same only where the owner allowed it."""
        q = (
            sa.select(_S.c.name, _S.c.value)
            .select_from(_C)
            .join(_SERVERS, _SERVERS.c.id == _C.c.server_id)
            .join(_USERS, _USERS.c.id == _SERVERS.c.user_id)
            .join(_N, _N.c.server_id == _C.c.server_id)
            .join(_S, _S.c.id == _N.c.secret_id)
            .where(_USERS.c.name == self.user, _SERVERS.c.name == project)
            .order_by(_S.c.name)
        )
        if collaborator:
            q = q.where(_C.c.collaborators.is_(True))
        with self._tx() as conn:
            return {name: value for name, value in conn.execute(q)}

    # --- changing -------------------------------------------------------------------
    def put(self, name: str, encrypted: str) -> bool:
        """Store the (already encrypted) value of ``name``; whether it is new. The name
        is checked by the caller (names.check_name)."""
        with self._tx(writing=True) as conn:
            uid = self._owner_id(conn)
            mine = (_S.c.user_id == uid) & (_S.c.name == name)
            done = conn.execute(sa.update(_S).where(mine).values(value=encrypted, set_at=now_iso()))
            if done.rowcount:
                return False
            held = conn.execute(
                sa.select(sa.func.count()).select_from(_S).where(_S.c.user_id == uid)
            ).scalar()
            if held >= MAX_SECRETS:
                raise SecretRefused(
                    f"You have {MAX_SECRETS} secrets, the most gpulab keeps: delete one first."
                )
            conn.execute(
                sa.insert(_S).values(user_id=uid, name=name, value=encrypted, set_at=now_iso())
            )
        return True

    def delete(self, name: str) -> bool:
        """Forget ``name`` (and every project's choice of it); whether it was there."""
        with self._tx(writing=True) as conn:
            uid = self._user_id(conn, lock=True)
            if uid is None:
                return False
            gone = sa.select(_S.c.id).where(_S.c.user_id == uid, _S.c.name == name)
            conn.execute(sa.delete(_N).where(_N.c.secret_id.in_(gone)))
            done = conn.execute(sa.delete(_S).where(_S.c.user_id == uid, _S.c.name == name))
            return bool(done.rowcount)

    def choose(self, project: str, names: Iterable[str], collaborators: bool) -> Selection:
        """What ``project`` gets from now on; SecretRefused for a project that is not the
        user's or a name not stored."""
        if not is_valid_safe_slug(project or ""):  # a project's name (projects.project_name)
            raise SecretRefused("Choose one of your projects.")
        names = sorted(set(names))
        with self._tx(writing=True) as conn:
            uid = self._owner_id(conn)
            server_id = conn.execute(
                sa.select(_SERVERS.c.id).where(
                    _SERVERS.c.user_id == uid, _SERVERS.c.name == project
                )
            ).scalar()
            if server_id is None:
                raise SecretRefused("Choose one of your projects.")
            ids = dict(
                conn.execute(
                    sa.select(_S.c.name, _S.c.id).where(_S.c.user_id == uid, _S.c.name.in_(names))
                ).all()
            )
            unknown = [n for n in names if n not in ids]
            if unknown:
                raise SecretRefused(
                    f"You have no secret named {unknown[0][:70]}: reload the page and choose again."
                )
            conn.execute(sa.delete(_N).where(_N.c.server_id == server_id))
            conn.execute(sa.delete(_C).where(_C.c.server_id == server_id))
            if names or collaborators:
                conn.execute(sa.insert(_C).values(server_id=server_id, collaborators=collaborators))
                if names:
                    rows = [{"server_id": server_id, "secret_id": ids[n]} for n in names]
                    conn.execute(sa.insert(_N), rows)
        return Selection(tuple(names), collaborators)

"""Shares with a group that let the group's members into the project.

JupyterHub 6.1 counts a share to a group on its own pages, but not in its
members' tokens: ``scopes.get_scopes_for(token)`` adds the user's own shares
only, so a project server refuses every member of a group it was shared with.
Roles held by a group do reach the members' tokens. So gpulab mirrors each
group share as a JupyterHub role, held by that group, with the share's scopes.

The roles are recorded in a JSON file in the hub's folder, because JupyterHub
deletes at start every role that ``c.JupyterHub.load_roles`` does not name:
settings.py loads them from there (:func:`load_roles`).

Roles follow the shares whoever changes them. The share page syncs the project
it shows (:meth:`GroupShareRoles.sync_project`); and :func:`keep_in_step` (set up
by settings.py with the hub's configuration) watches the hub's database session:
after any commit that made, changed or deleted a share or a group (JupyterHub's
REST API: ``PATCH`` or ``DELETE /hub/api/shares/<owner>/<project>``, ``DELETE
/hub/api/groups/<group>/shared/…``, a share link accepted, a group deleted), every
group share's role is put in step in JupyterHub's database on the hub's event loop
at once (:func:`roles_in_step`: the database only, no file lock on the loop), and
the record follows on the records pool. A revoke through the API thus removes the
role in the same moment it removes the share, and the project server ends the
members' access within ``GPULAB_REVOKE_WITHIN_S`` as for a revoke on the page, with
no page opened.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from itertools import chain
from pathlib import Path

from jupyterhub import orm
from jupyterhub import roles as hub_roles
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gpulab_hub import blocking, hubsettings, jsonfile, stateversion

ROLE_PREFIX = "gpulab-group-share-"
FILE_NAME = hubsettings.GROUP_SHARE_ROLES  # in the hub's records folder
ROLE_FIELDS = ("description", "group", "project")
LOG = logging.getLogger("gpulab.groupshares")
_CHANGED = "gpulab_shares_changed"  # a Session.info key: this transaction touched shares


def role_name(owner: str, project: str, group: str) -> str:
    """A valid JupyterHub role name, one per project and group."""
    digest = hashlib.sha256(f"{owner}/{project}\0{group}".encode()).hexdigest()[:24]
    return ROLE_PREFIX + digest


class GroupShareRoles(jsonfile.LockedRecord):
    """The mirror roles, in ``path``; every change under a file lock."""

    kind = stateversion.KINDS["group-share-roles"]
    section = "roles"
    what = "The group-share roles file"
    on_damage = (
        "members of groups a project was shared with lose access until its owner opens the "
        "project's Share page, which makes the roles again from JupyterHub's shares"
    )

    def _parse(self, section) -> dict:
        section = super()._parse(section)
        for name, spec in section.items():
            if not re.fullmatch(re.escape(ROLE_PREFIX) + "[0-9a-f]+", name):
                raise ValueError(f"{name!r} is not a role gpulab makes")
            scopes, texts = spec.get("scopes"), [spec.get(k) for k in ROLE_FIELDS]
            if not all(isinstance(t, str) for t in texts) or not isinstance(scopes, list):
                raise TypeError(f"role {name} lacks its group, project, description or scopes")
            if not all(isinstance(x, str) for x in scopes):
                raise TypeError(f"the scopes of role {name} are not names")
        return section

    def role_specs(self) -> list[dict]:
        """The roles as ``c.JupyterHub.load_roles`` entries."""
        with self.locked():
            recorded = self._read()
        return [
            {
                "name": name,
                "description": spec["description"],
                "scopes": list(spec["scopes"]),
                "groups": [spec["group"]],
            }
            for name, spec in sorted(recorded.items())
        ]

    def snapshot(self) -> dict:
        """Every recorded role as it is now (blocking: blocking.run(RECORDS, ...))."""
        with self.locked():
            return self._read()

    def apply(self, before: dict, changes: dict[str, dict | None]) -> None:
        """Write ``changes`` (role name -> record, None: gone) made from the snapshot
        ``before``; a role changed by someone else since is left as they made it."""
        with self.locked():
            recorded = self._read()
            after = dict(recorded)
            for name, spec in changes.items():
                if recorded.get(name) != before.get(name):
                    continue
                if spec is None:
                    after.pop(name, None)
                else:
                    after[name] = spec
            if after != recorded:
                self._write(after)

    def replace(self, recorded: dict) -> None:
        """The whole record, as :func:`roles_in_step` found it (blocking: on the records
        pool)."""
        with self.locked():
            if self._read() != recorded:
                self._write(recorded)

    def _step(self, db, spawner, group_name: str, recorded: dict) -> dict:
        """Put the hub's role of ``group_name`` on ``spawner``'s project in step with the
        group's share (the database, on the event loop); the record's change ({} none)."""
        owner, project = spawner.user.name, spawner.name
        orm_group = orm.Group.find(db, group_name)
        share = orm.Share.find(db, spawner, orm_group) if orm_group is not None else None
        name = role_name(owner, project, group_name)
        if _in_step(db, name, recorded.get(name), share, orm_group):
            return {}
        if share is None or not share.scopes:
            if orm.Role.find(db, name) is not None:
                hub_roles.delete_role(db, name)
            return {name: None} if name in recorded else {}
        spec = {
            "description": f"gpulab: {owner}/{project} shared with group {group_name}",
            "scopes": sorted(share.scopes),
        }
        role = hub_roles.create_role(db, {"name": name, **spec})
        hub_roles.grant_role(db, orm_group, role)
        return {name: {**spec, "group": group_name, "project": f"{owner}/{project}"}}

    def sync(self, db, spawner, group: orm.Group | str) -> None:
        """Make the role of ``group`` on ``spawner``'s project match the group's share."""
        group_name = group if isinstance(group, str) else group.name
        with self.locked():
            recorded = self._read()
            changes = self._step(db, spawner, group_name, recorded)
            if changes:
                self.apply(recorded, changes)

    def _project_steps(self, db, spawner, recorded: dict) -> dict:
        where = f"{spawner.user.name}/{spawner.name}"
        mine = [s["group"] for s in recorded.values() if s.get("project") == where]
        shared = [s.group.name for s in spawner.shares if s.group is not None]
        changes: dict = {}
        for group in sorted(set(mine) | set(shared)):
            changes.update(self._step(db, spawner, group, recorded))
        return changes

    def sync_project(self, db, spawner) -> None:
        """Every group share of the project, and every recorded role of it, in step."""
        with self.locked():
            recorded = self._read()
            changes = self._project_steps(db, spawner, recorded)
            if changes:
                self.apply(recorded, changes)

    async def sync_project_async(self, db, spawner) -> None:
        """:meth:`sync_project` on the hub's event loop: the record read and written on
        the records pool, the database here."""
        recorded = await blocking.run(blocking.RECORDS, self.snapshot)
        changes = self._project_steps(db, spawner, recorded)
        if changes:
            await blocking.run(blocking.RECORDS, self.apply, recorded, changes)

    def forget(self, owner: str, project: str | None) -> list[str]:
        """Drop the records of a deleted project (None: of all of a deleted user's
        projects); the names of the roles, for the caller to delete from the hub."""
        with self.locked():
            recorded = self._read()
            gone = [
                name
                for name, spec in recorded.items()
                if (spec.get("project") == f"{owner}/{project}")
                or (project is None and str(spec.get("project", "")).split("/")[0] == owner)
            ]
            if gone:
                self._write({k: v for k, v in recorded.items() if k not in gone})
        return gone


def _in_step(db, name: str, record, share, group) -> bool:
    """Whether the role ``name``, its record and ``group``'s share already agree."""
    if share is None or not share.scopes:
        return record is None and orm.Role.find(db, name) is None
    role = orm.Role.find(db, name)
    return (
        record is not None
        and record.get("scopes") == sorted(share.scopes)
        and record.get("group") == group.name
        and role is not None
        and sorted(role.scopes) == sorted(share.scopes)
        and role in group.roles
    )


def roles_in_step(db) -> dict[str, dict]:
    """JupyterHub's database alone, on the loop's thread (no record, no lock): a role for
    each group share, with its scopes; every gpulab role without its share deleted. The
    record as it must now be (role name -> its record)."""
    wanted: dict[str, orm.Share] = {}
    for share in db.query(orm.Share).filter(orm.Share.group_id.isnot(None)):
        if share.scopes:
            wanted[role_name(share.owner.name, share.spawner.name, share.group.name)] = share
    for role in db.query(orm.Role).filter(orm.Role.name.startswith(ROLE_PREFIX)).all():
        if role.name not in wanted:
            hub_roles.delete_role(db, role.name)
    specs = {}
    for name, share in sorted(wanted.items()):
        owner, project, group = share.owner.name, share.spawner.name, share.group
        spec = {
            "description": f"gpulab: {owner}/{project} shared with group {group.name}",
            "scopes": sorted(share.scopes),
        }
        role = orm.Role.find(db, name)
        if role is None or sorted(role.scopes) != spec["scopes"] or role not in group.roles:
            role = hub_roles.create_role(db, {"name": name, **spec})
            hub_roles.grant_role(db, group, role)
        specs[name] = {**spec, "group": group.name, "project": f"{owner}/{project}"}
    return specs


class _Watch:
    """The hub's record of group-share roles, put in step after commits that touched
    shares (see :func:`keep_in_step`)."""

    roles: GroupShareRoles | None = None
    pending = False
    to_record: dict | None = None  # the record the last run found, not yet written
    recording: asyncio.Future | None = None

    @classmethod
    def noticed_flush(cls, session, _context) -> None:
        for obj in chain(session.new, session.dirty, session.deleted):
            if isinstance(obj, orm.Share | orm.Group):
                session.info[_CHANGED] = True
                return

    @classmethod
    def noticed_statement(cls, state) -> None:
        """Bulk deletes and updates (``DELETE /hub/api/shares/<owner>/<project>``)."""
        if (state.is_delete or state.is_update) and any(
            m.class_ in (orm.Share, orm.Group) for m in state.all_mappers
        ):
            state.session.info[_CHANGED] = True

    @classmethod
    def rolled_back(cls, session) -> None:
        session.info.pop(_CHANGED, None)

    @classmethod
    def committed(cls, session) -> None:
        if not session.info.pop(_CHANGED, False) or cls.roles is None or cls.pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not in the hub's loop: the share page or the next start
            return
        cls.pending = True
        loop.call_soon(cls.run, session)  # a committed session emits no SQL until then

    @classmethod
    def run(cls, session) -> None:
        """Right after the commit, before the hub serves anything else, JupyterHub's
        roles follow its shares (the database only, no lock): a share revoked through
        JupyterHub's API ends when its answer comes back, not a moment later. The
        record (read at the next start) follows on the records pool."""
        cls.pending = False
        try:
            recorded = roles_in_step(session)
        except SQLAlchemyError as e:
            session.rollback()
            LOG.error("Group-share roles not put in step (%s); the share page retries", e)
            return
        cls.to_record = recorded
        if cls.recording is None or cls.recording.done():
            cls.recording = asyncio.ensure_future(cls.record())

    @classmethod
    async def record(cls) -> None:
        """Write the newest :meth:`run`'s record, one write at a time (an older one never
        lands after a newer one)."""
        while cls.to_record is not None and cls.roles is not None:
            recorded, cls.to_record = cls.to_record, None
            try:
                await blocking.run(blocking.RECORDS, cls.roles.replace, recorded)
            except (jsonfile.RecordError, blocking.Busy, OSError) as e:
                LOG.error(
                    "Group-share roles not recorded (%s); JupyterHub's roles follow the "
                    "shares, and the record is written again at the next change", e,
                )  # fmt: skip


def keep_in_step(hub_dir: str | Path) -> None:
    """In the hub's process: after every commit that made, changed or deleted a share
    or a group, put the group-share roles in ``hub_dir``'s record in step with the
    shares, whoever made the change (the REST API as much as the share page)."""
    first = _Watch.roles is None
    _Watch.roles = GroupShareRoles(Path(hub_dir) / FILE_NAME)
    if first:
        event.listen(Session, "after_flush", _Watch.noticed_flush)
        event.listen(Session, "do_orm_execute", _Watch.noticed_statement)
        event.listen(Session, "after_commit", _Watch.committed)
        event.listen(Session, "after_rollback", _Watch.rolled_back)


def load_roles(hub_dir: str | Path) -> list[dict]:
    """The mirror roles recorded in ``hub_dir``, for ``c.JupyterHub.load_roles``; none
    (the hub still starts; the error says what to do) if the file cannot be read."""
    roles = GroupShareRoles(Path(hub_dir) / FILE_NAME)
    try:
        # JupyterHub reads its configuration on its event loop, before it serves anyone
        with blocking.allowed("reading the group-share roles as the hub starts"):
            return roles.role_specs()
    except (jsonfile.RecordError, blocking.Busy) as e:
        roles.log.error("%s Until then, group shares give no access.", e)
        return []

"""Shares with a group that let the group's members into the project.

JupyterHub 6.1 counts a share to a group on its own pages, but not in its
members' tokens: ``scopes.get_scopes_for(token)`` adds the user's own shares
only, so a project server refuses every member of a group it was shared with.
Roles held by a group do reach the members' tokens. So gpulab mirrors each
group share as a JupyterHub role, held by that group, with the share's scopes.

The roles are recorded in a JSON file in the hub's folder, because JupyterHub
deletes at start every role that ``c.JupyterHub.load_roles`` does not name:
settings.py loads them from there (:func:`load_roles`). The share page keeps
roles and shares in step (:func:`sync_project`), so a group share made or
revoked through JupyterHub's REST API takes effect there at the next visit.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from jupyterhub import orm
from jupyterhub import roles as hub_roles

from gpulab_hub import hubsettings, jsonfile

ROLE_PREFIX = "gpulab-group-share-"
FILE_NAME = hubsettings.GROUP_SHARE_ROLES  # in the hub's records folder
ROLE_FIELDS = ("description", "group", "project")


def role_name(owner: str, project: str, group: str) -> str:
    """A valid JupyterHub role name, one per project and group."""
    digest = hashlib.sha256(f"{owner}/{project}\0{group}".encode()).hexdigest()[:24]
    return ROLE_PREFIX + digest


class GroupShareRoles(jsonfile.LockedRecord):
    """The mirror roles, in ``path``; every change under a file lock."""

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
        with self._thread_lock, self._file_lock:
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

    def sync(self, db, spawner, group: orm.Group | str) -> None:
        """Make the role of ``group`` on ``spawner``'s project match the group's share."""
        owner, project = spawner.user.name, spawner.name
        group_name = group if isinstance(group, str) else group.name
        orm_group = orm.Group.find(db, group_name)
        share = orm.Share.find(db, spawner, orm_group) if orm_group is not None else None
        name = role_name(owner, project, group_name)
        with self._thread_lock, self._file_lock:
            recorded = self._read()
            if share is None or not share.scopes:
                if orm.Role.find(db, name) is not None:
                    hub_roles.delete_role(db, name)
                if recorded.pop(name, None) is None:
                    return
            else:
                spec = {
                    "description": f"gpulab: {owner}/{project} shared with group {group_name}",
                    "scopes": sorted(share.scopes),
                }
                role = hub_roles.create_role(db, {"name": name, **spec})
                hub_roles.grant_role(db, orm_group, role)
                recorded[name] = {**spec, "group": group_name, "project": f"{owner}/{project}"}
            self._write(recorded)

    def sync_project(self, db, spawner) -> None:
        """Every group share of the project, and every recorded role of it, in step."""
        where = f"{spawner.user.name}/{spawner.name}"
        with self._thread_lock, self._file_lock:
            recorded = [s["group"] for s in self._read().values() if s.get("project") == where]
        shared = [s.group.name for s in spawner.shares if s.group is not None]
        for group in sorted(set(recorded) | set(shared)):
            self.sync(db, spawner, group)

    def forget(self, owner: str, project: str | None) -> list[str]:
        """Drop the records of a deleted project (None: of all of a deleted user's
        projects); the names of the roles, for the caller to delete from the hub."""
        with self._thread_lock, self._file_lock:
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


def load_roles(hub_dir: str | Path) -> list[dict]:
    """The mirror roles recorded in ``hub_dir``, for ``c.JupyterHub.load_roles``; none
    (the hub still starts; the error says what to do) if the file cannot be read."""
    roles = GroupShareRoles(Path(hub_dir) / FILE_NAME)
    try:
        return roles.role_specs()
    except jsonfile.RecordError as e:
        roles.log.error("%s Until then, group shares give no access.", e)
        return []

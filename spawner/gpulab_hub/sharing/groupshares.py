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
from pathlib import Path

from jupyterhub import orm
from jupyterhub import roles as hub_roles

from gpulab_hub import jsonfile

ROLE_PREFIX = "gpulab-group-share-"
FILE_NAME = "group-share-roles.json"


def role_name(owner: str, project: str, group: str) -> str:
    """A valid JupyterHub role name, one per project and group."""
    digest = hashlib.sha256(f"{owner}/{project}\0{group}".encode()).hexdigest()[:24]
    return ROLE_PREFIX + digest


class GroupShareRoles(jsonfile.LockedRecord):
    """The mirror roles, in ``path``; every change under a file lock."""

    section = "roles"

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


def load_roles(hub_dir: str | Path) -> list[dict]:
    """The mirror roles recorded in ``hub_dir``, for ``c.JupyterHub.load_roles``."""
    return GroupShareRoles(Path(hub_dir) / FILE_NAME).role_specs()

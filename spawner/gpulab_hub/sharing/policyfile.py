"""The sharing settings file of gpulab before its database, imported once at the upgrade.

Before 0005_sharing_settings, the hub kept them in ``sharing.json``::

    {"version": 1, "projects": {"alice/thesis": {"collaborators_may_start": true,
                                                 "collaborators_may_reshare": false}}}

:class:`PolicyImport` copies each project's settings into ``gpulab_sharing_settings``
(policy.py) within the upgrade's transaction and keeps the file as
``sharing.json.imported``. A project the hub no longer has is left out; so is a damaged
file (named in the upgrade's words): the defaults it leaves are the least allowed
(collaborators may neither start nor share on), which the owners change again on the
Share page. A file of a newer gpulab stops the upgrade.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import sqlalchemy as sa

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.db import migrate, tables
from gpulab_hub.sharing.policy import ProjectSharing

IMPORT = "sharing-policy"  # its row in gpulab_imports
KIND = stateversion.KINDS["sharing-policy"]
SECTION = "projects"
MAX_BYTES = 64 * 1024 * 1024
NAMES = tuple(f.name for f in fields(ProjectSharing))


def load(path: Path) -> dict[str, ProjectSharing]:
    """The settings of the file ``path`` (:func:`parse`), read bounded."""
    return parse(jsonfile.section_of(jsonfile.read_regular(path, MAX_BYTES), path, KIND, SECTION))


def parse(projects) -> dict[str, ProjectSharing]:
    """The file's settings (its section) by "owner/project"; ValueError/TypeError where
    it is damaged."""
    if not isinstance(projects, dict):
        raise TypeError('"projects" is not a mapping')
    found = {}
    for key, raw_settings in projects.items():
        if not isinstance(raw_settings, dict) or not set(raw_settings) <= set(NAMES):
            raise TypeError(f"the settings of {str(key)[:70]} are not {', '.join(NAMES)}")
        if not all(isinstance(v, bool) for v in raw_settings.values()):
            raise TypeError(f"the settings of {str(key)[:70]} are not true or false")
        found[key] = ProjectSharing(**raw_settings)
    return found


class PolicyImport(migrate.FileImport):
    """The import of ``path`` (the hub's ``sharing.json``) into the table."""

    name = IMPORT
    what = "the sharing settings"
    counted = "the sharing settings of {n} project(s)"

    def rows(self, conn: sa.Connection) -> tuple[int, list[str]]:
        try:
            projects = parse(self.read(self.path, KIND, SECTION, MAX_BYTES))
        except (jsonfile.NotARecord, ValueError, TypeError, KeyError) as e:
            return 0, [
                f"{self.path.name} (damaged: {e}; every project has the defaults, the least "
                "allowed, until its owner sets them on its Share page)"
            ]
        servers, users = tables.SPAWNERS, tables.USERS
        n, left_out = 0, []
        for key, settings in sorted(projects.items()):
            owner, _, project = key.partition("/")
            server_id = conn.execute(
                sa.select(servers.c.id)
                .join(users, users.c.id == servers.c.user_id)
                .where(users.c.name == owner, servers.c.name == project)
            ).scalar()
            if server_id is None or not project:
                left_out.append(f"{key[:140]} (no such project)")
                continue
            values = {name: getattr(settings, name) for name in NAMES}
            conn.execute(sa.insert(tables.sharing_settings).values(server_id=server_id, **values))
            n += 1
        return n, left_out

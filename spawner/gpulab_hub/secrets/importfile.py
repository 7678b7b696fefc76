"""The secrets files of gpulab before its database, imported once at the upgrade.

Before 0003_secrets, each user's secrets were a file of the hub's folder,
``secrets/<user>.json``::

    {"version": 1, "user": {
      "secrets": {"HF_TOKEN": {"value": "<Fernet token>", "set": "2026-11-23T14:05:00Z"}},
      "projects": {"<project>": {"names": ["HF_TOKEN"], "collaborators": false}}}}

:class:`SecretsImport` (a ``db.migrate.Import``) copies every such file into the tables
(store.py) within the upgrade's transaction, then keeps the folder as
``secrets.pre-database``, the pre-upgrade backup (private to the hub, as it was). A file
of a user the hub no longer has, a choice of a project that is gone, and a damaged
file are left out (counted in the upgrade's words; the damaged file stays in the kept
folder for the admin). Files are read as gpulab always read them: never through a
link, at most ``MAX_FILE_BYTES``. A file of a newer gpulab stops the upgrade.

:func:`forget_user` removes a deleted account's file from the kept folder (secrets
are never archived).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import sqlalchemy as sa

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.db import migrate, tables
from gpulab_hub.secrets.names import MAX_SECRETS, NAME
from gpulab_hub.secrets.store import check_user

IMPORT = "secrets"  # its row in gpulab_imports
KEPT = ".pre-database"  # the folder's name after the import: secrets.pre-database
KIND = stateversion.KINDS["secrets"]
SECTION = "user"
# 50 values of 16 KiB, encrypted (base64: a third more), with room for names and dates.
MAX_FILE_BYTES = 4 * 1024 * 1024


def load(path: Path) -> dict:
    """The section of the secrets file ``path`` (:func:`parse`), read bounded."""
    raw = jsonfile.read_regular(path, MAX_FILE_BYTES)
    return parse(jsonfile.section_of(raw, path, KIND, SECTION))


def parse(section) -> dict:
    """A secrets file's section, checked; ValueError/TypeError where it is damaged."""
    if not isinstance(section, dict) or set(section) != {"secrets", "projects"}:
        raise TypeError('not {"secrets": ..., "projects": ...}')
    secrets, projects = section["secrets"], section["projects"]
    if not isinstance(secrets, dict) or not isinstance(projects, dict):
        raise TypeError("secrets and projects are not mappings")
    for name, entry in secrets.items():
        if not NAME.fullmatch(name) or not isinstance(entry, dict):
            raise ValueError(f"{name[:70]!r} is not a secret's name")
        if not all(isinstance(entry.get(k), str) for k in ("value", "set")):
            raise TypeError(f"the secret {name} has no value or date")
    for project, choice in projects.items():
        names = choice.get("names") if isinstance(choice, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"the choice of project {project[:70]!r} is not a list of names")
        if not isinstance(choice.get("collaborators"), bool):
            raise TypeError(f"the choice of project {project[:70]!r} has no collaborators flag")
    return section


def kept_folder(folder: str | Path) -> Path:
    folder = Path(folder)
    return folder.with_name(folder.name + KEPT)


class SecretsImport(migrate.FileImport):
    """The import of the folder ``path`` (the hub's ``secrets/``) into the tables."""

    name = IMPORT
    suffix = KEPT
    what = "the secrets"
    counted = "{n} secret(s)"

    def pending(self) -> bool:
        return os.path.isdir(self.path) and not os.path.islink(self.path)

    def rows(self, conn: sa.Connection) -> tuple[int, list[str]]:
        n, left_out = 0, []
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            user = entry.name.removesuffix(".json")
            if not entry.name.endswith(".json") or not _allowed(user):
                continue
            try:
                section = parse(self.read(Path(entry.path), KIND, SECTION, MAX_FILE_BYTES))
            except (jsonfile.NotARecord, ValueError, TypeError, KeyError) as e:
                left_out.append(f"{entry.name} (damaged: {e})")
                continue
            got, missing = self._user(conn, user, section)
            n += got
            left_out.extend(missing)
        return n, left_out

    @staticmethod
    def _user(conn: sa.Connection, user: str, section: dict) -> tuple[int, list[str]]:
        """One user's file into the tables: how many secrets, and what was left out."""
        users, servers = tables.USERS, tables.SPAWNERS
        uid = conn.execute(sa.select(users.c.id).where(users.c.name == user)).scalar()
        if uid is None:
            return 0, [f"{user}.json (the hub has no user {user} any more)"]
        ids = {}
        for name in sorted(section["secrets"])[:MAX_SECRETS]:
            entry = section["secrets"][name]
            made = conn.execute(
                sa.insert(tables.secrets).values(
                    user_id=uid, name=name, value=entry["value"], set_at=entry["set"][:32]
                )
            )
            ids[name] = made.inserted_primary_key[0]
        left_out = []
        for project, choice in sorted(section["projects"].items()):
            server_id = conn.execute(
                sa.select(servers.c.id).where(servers.c.user_id == uid, servers.c.name == project)
            ).scalar()
            if server_id is None or not project:
                left_out.append(f"{user}'s choice for {project[:70]!r} (no such project)")
                continue
            names = sorted({n for n in choice["names"] if n in ids})
            if not names and not choice["collaborators"]:
                continue
            conn.execute(
                sa.insert(tables.secret_choices).values(
                    server_id=server_id, collaborators=choice["collaborators"]
                )
            )
            if names:
                rows = [{"server_id": server_id, "secret_id": ids[n]} for n in names]
                conn.execute(sa.insert(tables.secret_chosen), rows)
        return len(ids), left_out


def _allowed(user: str) -> bool:
    try:
        check_user(user)
    except ValueError:
        return False
    return True


def forget_user(hub_dir: str | Path, folder_name: str, user: str) -> list[str]:
    """Remove a deleted account's secrets file (its lock, any moved-aside copies) from
    the hub's secrets folders of gpulab before its database (``folder_name`` and the
    kept ``folder_name.pre-database…``): never archived, they are secrets. The names
    removed, by folder."""
    check_user(user)
    done = []
    base = f"{user}.json"
    try:
        folders = [e for e in os.scandir(hub_dir) if e.name.startswith(folder_name)]
    except FileNotFoundError:
        return []
    for folder in folders:
        if folder.name not in (folder_name, folder_name + KEPT) and not folder.name.startswith(
            folder_name + KEPT + "."
        ):
            continue
        if not stat.S_ISDIR(os.lstat(folder.path).st_mode):  # a link is never followed
            continue
        removed = False
        for entry in os.scandir(folder.path):
            name = entry.name
            if name in (base, f"{base}.lock") or name.startswith(f"{base}.corrupt-"):
                os.unlink(entry.path)  # a link is removed, never followed
                done.append(f"{folder.name}/{name}")
                removed = True
        if removed:
            jsonfile.fsync_dir(Path(folder.path))
    return sorted(done)

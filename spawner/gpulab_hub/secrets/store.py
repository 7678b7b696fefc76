"""Each user's secrets on disk: one file per user in the hub's ``secrets/`` folder.

``<records_dir>/secrets/<user>.json``::

    {"version": 1, "user": {
      "secrets": {"HF_TOKEN": {"value": "<Fernet token>", "set": "2026-11-23T14:05:00Z"}},
      "projects": {"<project>": {"names": ["HF_TOKEN"], "collaborators": false}}}}

Names, dates and choices are in clear; values only as JupyterHub's CryptKeeper
encrypted them (crypt.py): this store never sees a plaintext value. Files are written
atomically under a file lock, read without following a link and at most
``MAX_FILE_BYTES`` (jsonfile.py), in a folder private to the hub. Every call blocks:
handlers call it on a worker thread.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from jupyterhub.slugs import is_valid_safe_slug

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.accounts import USERNAME_PATTERN
from gpulab_hub.secrets.names import MAX_SECRETS, NAME, SecretRefused

# 50 values of 16 KiB, encrypted (base64: a third more), with room for names and dates.
MAX_FILE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Secret:
    name: str
    set: str  # ISO 8601, UTC


@dataclass(frozen=True)
class Selection:
    """What one of the user's projects gets."""

    names: tuple[str, ...] = ()
    collaborators: bool = False  # collaborators' kernels, terminals and jobs get them too


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def user_file(folder: Path, user: str) -> Path:
    if not isinstance(user, str) or re.fullmatch(USERNAME_PATTERN, user) is None:
        raise ValueError(f"{user!r} is not a gpulab user name")
    return Path(folder) / f"{user}.json"


class SecretStore(jsonfile.LockedRecord):
    """One user's secrets (encrypted values) and their projects' choices."""

    kind = stateversion.KINDS["secrets"]
    section = "user"
    what = "A user's secrets file"
    on_damage = (
        "that user's Secrets page is empty until they add their secrets again (the moved "
        "file holds the encrypted values; nothing of it reaches projects meanwhile)"
    )
    max_bytes = MAX_FILE_BYTES

    def __init__(self, folder: Path, user: str, log=None):
        super().__init__(user_file(folder, user), log)
        self.user = user

    def _parse(self, section):
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

    def _missing(self):
        return {"secrets": {}, "projects": {}}

    _recover = _missing

    # --- reading --------------------------------------------------------------------
    def listing(self) -> list[Secret]:
        """The user's secrets (names and dates, never values), by name."""
        with self.locked():
            secrets = self._read()["secrets"]
        return [Secret(name, secrets[name]["set"]) for name in sorted(secrets)]

    def selections(self) -> dict[str, Selection]:
        """What each of the user's projects gets (only projects with a choice)."""
        with self.locked():
            data = self._read()
        return {p: _selection(c, data["secrets"]) for p, c in data["projects"].items()}

    def encrypted_for(self, project: str, collaborator: bool) -> dict[str, str]:
        """The encrypted values ``project`` gets, by name: for its owner, the project's
        choice; for a collaborator, the same only where the owner allowed it."""
        with self.locked():
            data = self._read()
        choice = data["projects"].get(project)
        if choice is None:
            return {}
        selection = _selection(choice, data["secrets"])
        if collaborator and not selection.collaborators:
            return {}
        return {name: data["secrets"][name]["value"] for name in selection.names}

    # --- changing -------------------------------------------------------------------
    def put(self, name: str, encrypted: str) -> bool:
        """Store the (already encrypted) value of ``name``; whether it is new. The name
        is checked by the caller (names.check_name)."""
        with self.locked():
            data = self._read()
            new = name not in data["secrets"]
            if new and len(data["secrets"]) >= MAX_SECRETS:
                raise SecretRefused(
                    f"You have {MAX_SECRETS} secrets, the most gpulab keeps: delete one first."
                )
            data["secrets"][name] = {"value": encrypted, "set": now_iso()}
            self._write(data)
        return new

    def delete(self, name: str) -> bool:
        """Forget ``name`` (and every project's choice of it); whether it was there."""
        with self.locked():
            data = self._read()
            if data["secrets"].pop(name, None) is None:
                return False
            for choice in data["projects"].values():
                choice["names"] = [n for n in choice["names"] if n != name]
            self._write(data)
        return True

    def choose(self, project: str, names: Iterable[str], collaborators: bool) -> Selection:
        """What ``project`` gets from now on; SecretRefused for a name not stored."""
        if not is_valid_safe_slug(project or ""):  # a project's name (projects.project_name)
            raise SecretRefused("Choose one of your projects.")
        names = sorted(set(names))
        with self.locked():
            data = self._read()
            unknown = [n for n in names if n not in data["secrets"]]
            if unknown:
                raise SecretRefused(
                    f"You have no secret named {unknown[0][:70]}: reload the page and choose again."
                )
            if names or collaborators:
                data["projects"][project] = {"names": names, "collaborators": collaborators}
            else:
                data["projects"].pop(project, None)
            self._write(data)
        return Selection(tuple(names), collaborators)

    def move_project(self, old: str, new: str) -> Callable[[], None] | None:
        """The choice of project ``old`` as that of ``new`` (a rename); the undo, or None
        when neither had one."""
        with self.locked():
            data = self._read()
            before = {k: data["projects"][k] for k in (old, new) if k in data["projects"]}
            if not before:
                return None
            data["projects"].pop(new, None)
            if old in before:
                data["projects"][new] = data["projects"].pop(old)
            self._write(data)

        def undo() -> None:
            with self.locked():
                now = self._read()
                for key in (old, new):
                    now["projects"].pop(key, None)
                    if key in before:
                        now["projects"][key] = before[key]
                self._write(now)

        return undo

    def forget_project(self, project: str) -> None:
        """A deleted project's choice (a new project of that name gets nothing)."""
        if not self.path.exists() and not self.path.is_symlink():
            return
        with self.locked():
            data = self._read()
            if data["projects"].pop(project, None) is not None:
                self._write(data)


def _selection(choice: dict, secrets: dict) -> Selection:
    return Selection(
        tuple(n for n in choice["names"] if n in secrets), bool(choice["collaborators"])
    )


def forget_user(folder: Path, user: str) -> list[str]:
    """Remove a deleted account's secrets file, its lock and any moved-aside copies
    (never archived: they are secrets); the names of what was removed."""
    path = user_file(folder, user)
    if not path.parent.is_dir():
        return []
    done = []
    for entry in os.scandir(path.parent):
        name = entry.name
        if name in (path.name, f"{path.name}.lock") or name.startswith(f"{path.name}.corrupt-"):
            os.unlink(entry.path)  # a link is removed, never followed
            done.append(name)
    if done:
        jsonfile.fsync_dir(path.parent)
    return sorted(done)

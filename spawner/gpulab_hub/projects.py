"""The project store: one directory per project, holding its Dockerfile and files.

Layout: ``<projects_root>/<user>/<project>/`` with ``Dockerfile`` at its top. The
whole directory is the notebook root (``/workspace``) of the project's
container, so its user controls every entry in it: the hub opens it only
through safefs.py. ``<projects_root>/<user>/`` is the hub's (root, 0755, mounted
nowhere). What the hub keeps about a project (its last good image, build logs)
lives in ``<state_root>/<user>/<project>/``, hub-owned, 0700. Nothing here
deletes or rewrites a file that exists: a project's Dockerfile is written once,
from the template.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jupyterhub.slugs import is_valid_safe_slug

DEFAULT_PROJECT = "default"
DOCKERFILE = "Dockerfile"


class ProjectError(Exception):
    """A problem with a project that the user can read and act on."""


def project_name(server_name: str) -> str:
    """Project name for a JupyterHub server name ('' is the default server).

    Raises ProjectError for names that are not JupyterHub 6 safe slugs
    (1-30 lowercase letters, digits and single hyphens, starting with a letter).
    """
    if server_name == "":
        return DEFAULT_PROJECT
    if not is_valid_safe_slug(server_name):
        raise ProjectError(
            f"Invalid project name {server_name!r}: use 1-30 lowercase letters, digits "
            "and single hyphens, starting with a letter (e.g. 'vision-2')."
        )
    return server_name


def safe_owner(username: str) -> str:
    """A directory-safe form of a hub user name (no separators, no dot-names)."""
    if not username or username in {".", ".."} or "/" in username or "\0" in username:
        raise ProjectError(f"User name {username!r} cannot name a project directory.")
    return username


@dataclass(frozen=True)
class Project:
    root: Path
    owner: str
    name: str
    # Hub-owned folder of per-project state (ProjectSpawner.state_root).
    state_root: Path | None = None

    @property
    def path(self) -> Path:
        return self.root / safe_owner(self.owner) / self.name

    @property
    def dockerfile(self) -> Path:
        return self.path / DOCKERFILE

    @property
    def state_dir(self) -> Path:
        """``<state_root>/<user>/<project>``: the hub's own record of this project."""
        if self.state_root is None:
            raise ValueError(f"no state_root given for project {self.owner}/{self.name}")
        return Path(self.state_root) / safe_owner(self.owner) / self.name

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"


def ensure_project(project: Project, dockerfile_text: str, uid: int, gid: int) -> bool:
    """Create the project's directory and Dockerfile if missing (re-runnable).

    Returns True when the Dockerfile was written now. An existing entry named
    Dockerfile (even a link) is never touched. No link is followed; only what
    is created here is given to the notebook user (``uid``/``gid``: its ids on
    the host), through descriptors.
    """
    from . import safefs  # safefs imports this module

    owner = safe_owner(project.owner)
    try:
        project.root.mkdir(parents=True, exist_ok=True)
        root_fd = safefs.open_root(project.root)
        try:
            _mkdir(root_fd, owner, 0o755)
            user_fd = safefs.open_dir(owner, root_fd, "")
        finally:
            os.close(root_fd)
        try:
            created = _mkdir(user_fd, project.name, 0o755)
            fd = safefs.open_dir(project.name, user_fd, "")
        finally:
            os.close(user_fd)
    except (OSError, safefs.Refused) as e:
        if isinstance(e, safefs.Refused):
            why = "it is a link" if e.reason == safefs.LINK else "it is not a folder"
        else:
            why = e.strerror
        raise ProjectError(
            f"Cannot create the project directory {project.path}: {why}. "
            "Ask the administrator to check ProjectSpawner.projects_root."
        ) from e
    try:
        if created:
            safefs.chown_fd(fd, uid, gid)
        try:
            os.stat(DOCKERFILE, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return safefs.create_exclusive(fd, DOCKERFILE, dockerfile_text.encode(), uid, gid)
        return False
    finally:
        os.close(fd)


def _mkdir(dir_fd: int, name: str, mode: int) -> bool:
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        return False
    os.chmod(name, mode, dir_fd=dir_fd)  # the mode asked for, whatever the hub's umask (077)
    return True

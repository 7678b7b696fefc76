"""The project store: one directory per project, holding its Dockerfile and files.

Layout: ``<projects_root>/<user>/<project>/`` with ``Dockerfile`` at its top. The
whole directory is the notebook root (``/workspace``) of the project's
container, so its user controls every entry in it: the hub opens it only
through safefs.py, which also creates it (``safefs.ensure_project``); this
module only names and places projects and opens nothing.
``<projects_root>/<user>/`` is the hub's (root, 0755, mounted nowhere). What the
hub keeps about a project (its last good image, build logs) lives in
``<state_root>/<user>/<project>/``, hub-owned, 0700. Nothing here deletes or
rewrites a file that exists: a project's Dockerfile is written once, from the
template.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jupyterhub.slugs import is_valid_safe_slug

DEFAULT_PROJECT = "default"
TEMPLATES = Path(__file__).with_name("templates")  # the spawn pages of a project
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

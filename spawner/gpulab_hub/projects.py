"""The project store: one directory per project, holding its Dockerfile and files.

Layout: ``<projects_root>/<user>/<project>/`` with ``Dockerfile`` at its top and
``.gpulab/logs/`` for build logs. The whole directory is the notebook root
(``/workspace``) of the project's container. Nothing here deletes or rewrites a
file that exists: a project's Dockerfile is written once, from the template.
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

    @property
    def path(self) -> Path:
        return self.root / safe_owner(self.owner) / self.name

    @property
    def dockerfile(self) -> Path:
        return self.path / DOCKERFILE

    @property
    def logs_dir(self) -> Path:
        return self.path / ".gpulab" / "logs"


def ensure_project(project: Project, dockerfile_text: str, uid: int, gid: int) -> bool:
    """Create the project's directory and Dockerfile if missing (re-runnable).

    Returns True when the Dockerfile was written now. An existing Dockerfile is
    never touched. The directory is handed to the notebook user (uid/gid) so the
    container can write to it.
    """
    try:
        project.logs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProjectError(
            f"Cannot create the project directory {project.path}: {e.strerror}. "
            "Ask the administrator to check ProjectSpawner.projects_root."
        ) from e
    created = False
    if not project.dockerfile.exists():
        tmp = project.dockerfile.with_name(f".{DOCKERFILE}.tmp")
        tmp.write_text(dockerfile_text)
        os.replace(tmp, project.dockerfile)
        created = True
    if os.geteuid() == 0:
        for p in (project.path, project.path / ".gpulab", project.logs_dir, project.dockerfile):
            os.chown(p, uid, gid)
    return created

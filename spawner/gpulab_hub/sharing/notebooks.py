"""A notebook inside someone's project, read safely: for Save a copy and public links.

Paths are untrusted: each part must be a plain name (no ``..``, no hidden
``.names`` such as ``.gpulab`` or ``.ipynb_checkpoints``), and the file is opened
through safefs.py: one folder at a time with O_NOFOLLOW, so no symbolic link is
followed anywhere (a link swapped in later cannot lead out of the project), only a
regular file is read (never a FIFO or device file), and at most MAX_BYTES of it.

Both copy.py (Save a copy) and public.py (public links) use these; neither imports
the other's page for them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jupyterhub.slugs import is_valid_safe_slug

from gpulab_hub.projects import Project, ProjectError, safe_owner, safefs

MAX_BYTES = 50 * 1024 * 1024  # the largest notebook copied (or shown on a public page)
MAX_DEPTH = 16
NOTEBOOK = ".ipynb"
# One part of a path: letters (any script), digits, spaces and a few punctuation
# marks; never starting with a dot or a space.
_PART = re.compile(r"[^\W][\w .,()+@=&'~-]*", re.UNICODE)


class FileRefused(Exception):
    """A file that cannot be read or copied, with the reason to show and an HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_path(path: str) -> list[str]:
    """The parts of a notebook's path inside a project, or FileRefused."""
    if not path or len(path) > 1024 or path.startswith("/") or "\\" in path:
        raise FileRefused(400, "Give the notebook's path inside the project, like nb/x.ipynb.")
    parts = path.split("/")
    if len(parts) > MAX_DEPTH:
        raise FileRefused(400, "That path is too deep.")
    for part in parts:
        if (
            not _PART.fullmatch(part)
            or part.endswith(" ")
            or len(part.encode()) > 255
            or part in {".", ".."}
        ):
            raise FileRefused(400, f"Not a name gpulab copies: {part!r}.")
    if not parts[-1].endswith(NOTEBOOK) or parts[-1] == NOTEBOOK:
        raise FileRefused(400, "Only notebooks (.ipynb) can be copied.")
    return parts


def check_project(owner: str, project: str) -> None:
    try:
        safe_owner(owner)
    except ProjectError as e:
        raise FileRefused(404, "No such project.") from e
    if not is_valid_safe_slug(project or ""):
        raise FileRefused(404, "No such project.")


# What a refusal of safefs.py means for this page: HTTP status and the words shown.
_REFUSED = {
    safefs.LINK: (403, "The path leads through a link; not copied."),
    safefs.MISSING: (404, "No such file in that project."),
    safefs.NOT_DIR: (404, "No such file in that project."),
    safefs.SPECIAL: (400, "That is not a notebook file."),
    safefs.NOT_FILE: (400, "That is not a notebook file."),
    safefs.TOO_BIG: (413, f"That notebook is over {MAX_BYTES // 2**20} MiB."),
}


def _refused(e: safefs.Refused, last: str = "") -> FileRefused:
    status, message = _REFUSED.get(e.reason, (400, str(e)))
    if e.reason == safefs.LINK and e.rel == last:
        message = "That notebook is a link; not copied."
    return FileRefused(status, message)


def open_project_dir(projects_root: str | Path, owner: str, project: str, parts=()) -> int:
    """A descriptor of ``<root>/<owner>/<project>/<parts...>``, no link followed below root."""
    check_project(owner, project)
    try:
        fd = safefs.open_project(Project(Path(projects_root), owner, project))
        try:
            return safefs.open_dirs(fd, parts)
        finally:
            os.close(fd)
    except safefs.Refused as e:
        raise _refused(e) from e


def read_notebook(projects_root: str | Path, owner: str, project: str, path: str) -> bytes:
    """The bytes of one notebook of ``owner/project``, opened without following links."""
    parts = check_path(path)
    dir_fd = open_project_dir(projects_root, owner, project)
    try:
        return safefs.read_file(dir_fd, "/".join(parts), MAX_BYTES)
    except safefs.Refused as e:
        raise _refused(e, "/".join(parts)) from e
    finally:
        os.close(dir_fd)

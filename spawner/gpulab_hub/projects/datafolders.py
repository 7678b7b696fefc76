"""Making a project's data folders on the host, never through a link.

``objects.data_folders`` names the folders under the data root that a container
writes (in data scope "project": ``projects/<owner>/<project>/{models,outputs,
huggingface}``). Docker mounts each one by its host path, following links, so no
one but the hub may be able to change any folder on the way to it: every folder
between the data root and a data folder is made here root's (0755) and a link or a
non-folder there is refused; only the data folder itself (the last component) is
given to the notebook user, and only when it is made here, through its descriptor.
The data root itself is the admin's (links allowed there, as for projects_root).
"""

from __future__ import annotations

import os
import stat
from pathlib import PurePosixPath

from gpulab_hub.projects import ProjectError, objects, safefs

HUB_MODE = 0o755  # the hub's folders on the way (mounted nowhere)
DATA_MODE = 0o750  # a data folder: the notebook user's


def _parts(data_root: str, folder: str) -> tuple[str, ...]:
    """The components of ``folder`` below ``data_root``; ValueError if it is not below it."""
    rel = PurePosixPath(folder).relative_to(PurePosixPath(data_root))
    parts = rel.parts
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{folder!r} is not a folder below the data root {data_root!r}")
    return parts


def _enter(dir_fd: int, name: str, where: str) -> tuple[int, bool]:
    """A descriptor of the folder ``name`` in ``dir_fd`` (made if missing) and whether
    it was made now. A link, or anything but a folder, is refused."""
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
        made = True
    except FileExistsError:
        made = False
    try:
        fd = os.open(name, safefs.DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        raise ProjectError(
            f"The data folder {where} is {safefs.kind(st.st_mode)}, not a folder; gpulab "
            "does not mount it. Ask the administrator to remove it."
        ) from e
    if not stat.S_ISDIR(os.fstat(fd).st_mode):  # pragma: no cover (O_DIRECTORY)
        os.close(fd)
        raise ProjectError(f"The data folder {where} is not a folder; gpulab does not mount it.")
    return fd, made


def ensure_folder(data_root: str, folder: str, uid: int, gid: int) -> bool:
    """Blocking: ``folder`` below ``data_root``, its parents the hub's, itself given to
    ``uid:gid`` when made now (an existing one is left as it is). Whether it was made."""
    parts = _parts(data_root, folder)
    fd = safefs.open_root(data_root)
    made = False
    try:
        path = str(data_root)
        for i, name in enumerate(parts):
            path = f"{path}/{name}"
            new, made = _enter(fd, name, path)
            os.close(fd)
            fd = new
            if not made:
                continue
            if i == len(parts) - 1:
                os.fchmod(fd, DATA_MODE)  # whatever the hub's umask (077)
                safefs.chown_fd(fd, uid, gid)
            else:
                os.fchmod(fd, HUB_MODE)
        return made
    finally:
        os.close(fd)


def ensure(settings: objects.ContainerInputs, uid: int, gid: int) -> None:
    """Blocking: every data folder of this container (objects.data_folders)."""
    for folder in objects.data_folders(settings):
        ensure_folder(settings.data_root, folder, uid, gid)

"""Atomic, durable file writes, shared by the hub and the user side.

A reader sees the old file or the new one, never half of one; after a crash (power loss
included) the new one is there. The temporary file is created in the destination's own
folder with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name, so a link (or any
entry) someone planted at that name is refused, never followed.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic"]

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def fsync_dir(folder: str | os.PathLike[str] | int) -> None:
    """Make a rename, creation or removal in ``folder`` durable (a path or an open fd)."""
    if isinstance(folder, int):
        os.fsync(folder)
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o644,
    owner: tuple[int, int] | None = None,
    dir_fd: int | None = None,
    precondition: Callable[[], bool] | None = None,
) -> bool:
    """Replace ``path`` by a file holding ``data``, atomically and durably; True when
    it did.

    ``mode``: the new file's permission bits, whatever the process's umask.
    ``owner``: ``(uid, gid)`` to give the new file (through its descriptor) before it
    takes ``path``'s place; None keeps the writer's own.
    ``dir_fd``: an open folder; ``path`` is then a bare name inside it (no ``/``), and
    the folder is never looked up by path again (for callers that walked to it safely).
    ``precondition``: asked once the new file is written and durable, right before it
    takes ``path``'s place (a compare-and-swap: "is the old file still what I read?");
    False leaves ``path`` as it is, removes the new file and returns False.
    """
    if dir_fd is None:
        target = Path(path)
        folder: str | os.PathLike[str] = target.parent
        name = target.name
    else:
        name = os.fspath(path)
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"write_atomic with dir_fd takes a bare file name, not {name!r}")
        folder = "."
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    tmp_path = tmp if dir_fd is not None else os.path.join(folder, tmp)
    fd = os.open(tmp_path, _FLAGS, 0o600, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if precondition is not None and not precondition():
            os.unlink(tmp_path, dir_fd=dir_fd)
            return False
        if dir_fd is None:
            os.replace(tmp_path, os.path.join(folder, name))
        else:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp_path, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(dir_fd if dir_fd is not None else folder)
    return True

"""The hub's folder (``<GPULAB_HOME>/hub``) is private: files 0600, folders 0700.

It holds the database (password hashes, tokens), the cookie secret, logs, pid
files, the GPU allocation record, sharing records and deleted users' archives.
``gpulab up`` and the hub run with umask 077, so what they create there is
private from the start, and :func:`protect` fixes what an older version left
readable. The folders that containers mount (projects, data) are not in it and
get their modes explicitly where they are made.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

UMASK = 0o077
# Archives of deleted users and projects: the folder is made private; its contents
# are left as they were archived (nobody else can reach them through it).
NOT_WALKED = ("deleted",)


def _private(path: str, st: os.stat_result) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        os.chmod(path, mode & 0o700, follow_symlinks=False)


def protect(hub_dir: str | Path) -> None:
    """Make ``hub_dir`` and everything in it private to its owner (links left alone)."""
    hub_dir = Path(hub_dir)
    if not hub_dir.is_dir() or hub_dir.is_symlink():
        return
    for top, dirs, files in os.walk(hub_dir, followlinks=False):
        _private(top, os.lstat(top))
        for name in dirs + files:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                _private(path, st)
        if top == str(hub_dir):
            dirs[:] = [d for d in dirs if d not in NOT_WALKED]


def start_private(hub_dir: str | Path) -> None:
    """In the hub's process, before it makes anything: umask 077, and the folder fixed.

    Parents of the hub folder (``GPULAB_HOME``, which also holds the projects) are
    made before the umask changes, so they stay reachable by the containers' engine.
    """
    Path(hub_dir).mkdir(parents=True, exist_ok=True)
    os.umask(UMASK)
    protect(hub_dir)

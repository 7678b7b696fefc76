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


CONFIG_D = "jupyterhub_config.d"  # the admin's own configuration files, in GPULAB_HOME


def config_d_files(home: str | Path) -> tuple[list[Path], list[str]]:
    """The admin's ``$GPULAB_HOME/jupyterhub_config.d/*.py``, in name order, that the hub
    may run: regular files (never a link) owned by the hub's user, in a folder of the hub's
    user, neither writable by group or others. -> (files, sentences on what was skipped).
    Like The Littlest JupyterHub's ``jupyterhub_config.d``: a site's lines survive updates
    of gpulab's own ``jupyterhub_config.py``."""
    folder = Path(home) / CONFIG_D
    skipped: list[str] = []
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return [], []
    me, loose = os.geteuid(), stat.S_IWGRP | stat.S_IWOTH
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or st.st_mode & loose:
        return [], [f"{folder} is not a folder of the hub's user that only it may change: ignored"]
    files: list[Path] = []
    for path in sorted(folder.iterdir()):
        if path.suffix != ".py":
            continue
        fst = os.lstat(path)
        if not stat.S_ISREG(fst.st_mode) or fst.st_uid != me or fst.st_mode & loose:
            skipped.append(f"{path} is a link, someone else's, or writable by others: ignored")
            continue
        files.append(path)
    return files, skipped

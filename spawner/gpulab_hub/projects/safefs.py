"""Files in a project folder, opened as hostile input.

The project user controls every entry of their project folder, at any time.
So the hub opens paths there one component at a time from a directory
descriptor, with O_NOFOLLOW (no link is followed, not even one swapped in
between two calls), checks with fstat that what it opened is a regular file
or a folder before it reads, opens files with O_NONBLOCK (a FIFO never
blocks), bounds every read, creates files only exclusively and changes
ownership only through descriptors. Errors are :class:`Refused`, a
``ProjectError`` whose message names the entry relative to the project.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from gpulab_hub.projects import DOCKERFILE, Project, ProjectError, safe_owner

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 64  # folders inside folders, below the project folder
_CHUNK = 1 << 20

# Why an entry is refused (Refused.reason).
LINK, SPECIAL, TOO_BIG, MISSING, NOT_DIR, NOT_FILE, TOO_MANY = (
    "link",
    "special",
    "too_big",
    "missing",
    "not_dir",
    "not_file",
    "too_many",
)


class Refused(ProjectError):
    """An entry of a project folder that gpulab does not open; ``reason`` says why."""

    def __init__(self, message: str, reason: str, rel: str):
        super().__init__(message)
        self.reason = reason
        self.rel = rel


def size_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def kind(mode: int) -> str:
    """What an entry is, in words."""
    if stat.S_ISLNK(mode):
        return "a link"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a file"


def _shown(rel: str) -> str:
    return "project folder itself" if rel in ("", ".") else rel


def refuse(rel: str, mode: int, want: str = "file") -> Refused:
    """The error for an entry ``rel`` of type ``mode`` where a ``want`` (file/folder) was needed."""
    what = kind(mode)
    if rel == "Dockerfile" and stat.S_ISLNK(mode):
        return Refused(
            "The project's Dockerfile is a link; gpulab builds only a regular file named "
            "Dockerfile. Replace the link with the file itself.",
            LINK,
            rel,
        )
    if stat.S_ISLNK(mode):
        return Refused(
            f"The project's {_shown(rel)} is a link; gpulab does not follow links in a project "
            "folder. Replace the link with the file or folder itself.",
            LINK,
            rel,
        )
    if want == "folder" and not stat.S_ISDIR(mode):
        return Refused(f"The project's {_shown(rel)} is {what}, not a folder.", NOT_DIR, rel)
    if stat.S_ISDIR(mode):
        return Refused(f"The project's {_shown(rel)} is a folder, not a file.", NOT_FILE, rel)
    return Refused(
        f"The project's {_shown(rel)} is {what}, not a regular file; gpulab reads only "
        "regular files and folders in a project. Remove it, or move it out of the project.",
        SPECIAL,
        rel,
    )


def missing(rel: str) -> Refused:
    return Refused(f"The project has no {_shown(rel)}.", MISSING, rel)


def too_big(rel: str, limit: int) -> Refused:
    return Refused(
        f"The project's {rel} is larger than {size_text(limit)}; gpulab reads at most "
        f"{size_text(limit)} of it.",
        TOO_BIG,
        rel,
    )


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel not in ("", ".") else name


def lstat(name: str, dir_fd: int, rel: str) -> os.stat_result:
    """The entry itself (a link is not followed); Refused when it is not there."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise missing(rel) from e


def open_dir(name: str, dir_fd: int, rel: str) -> int:
    """A descriptor of the folder ``name`` in ``dir_fd`` (caller closes); never through a link."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise missing(rel) from e
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            raise refuse(rel, lstat(name, dir_fd, rel).st_mode, "folder") from e
        raise


def open_dirs(dir_fd: int, parts, rel: str = "") -> int:
    """A descriptor of ``dir_fd/parts[0]/parts[1]/...``, one folder at a time, no link."""
    fd = os.dup(dir_fd)
    try:
        for name in parts:
            rel = join(rel, name)
            new = open_dir(name, fd, rel)
            os.close(fd)
            fd = new
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_root(path: str | Path) -> int:
    """A descriptor of a hub-owned folder named by the admin (links allowed there)."""
    return os.open(str(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_project(project: Project) -> int:
    """A descriptor of the project folder: its root (admin-set), then owner and name, no link."""
    fd = open_root(project.root)
    try:
        try:
            owner = open_dir(safe_owner(project.owner), fd, "")
        except Refused as e:
            raise Refused(f"There is no project {project.name}.", e.reason, "") from e
        try:
            return open_dir(project.name, owner, "")
        except Refused as e:
            raise Refused(f"There is no project {project.name}.", e.reason, "") from e
        finally:
            os.close(owner)
    finally:
        os.close(fd)


def open_file(name: str, dir_fd: int, rel: str) -> tuple[int, os.stat_result]:
    """A regular file ``name`` in ``dir_fd``, opened read-only: (descriptor, its fstat).

    Checks the entry before opening it (a device is not opened) and the opened
    descriptor after (an entry swapped in between is refused too)."""
    st = lstat(name, dir_fd, rel)
    if not stat.S_ISREG(st.st_mode):
        raise refuse(rel, st.st_mode)
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise missing(rel) from e
        if e.errno == errno.ELOOP:
            raise refuse(rel, stat.S_IFLNK) from e
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise refuse(rel, st.st_mode)
    return fd, st


def read_fd(fd: int, limit: int, rel: str) -> bytes:
    """At most ``limit`` bytes of an open file; Refused when it holds more."""
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise too_big(rel, limit)
        chunks.append(chunk)


def read_file(dir_fd: int, rel: str, limit: int) -> bytes:
    """The bytes of the regular file ``rel`` (``a/b/c``) below ``dir_fd``, at most ``limit``."""
    *folders, name = rel.split("/")
    parent = open_dirs(dir_fd, folders)
    try:
        fd, st = open_file(name, parent, rel)
    finally:
        os.close(parent)
    try:
        if st.st_size > limit:
            raise too_big(rel, limit)
        return read_fd(fd, limit, rel)
    finally:
        os.close(fd)


def chown_fd(fd: int, uid: int, gid: int) -> None:
    """Give the open file or folder to ``uid:gid`` (only when the hub runs as root)."""
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)


def create_exclusive(
    dir_fd: int, name: str, data: bytes, uid: int | None = None, gid: int | None = None
) -> bool:
    """Create the new file ``name`` in ``dir_fd`` holding ``data``; False if anything is there.

    Never opens an existing entry (a link or file planted there stays as it is);
    the new file is given to ``uid:gid`` through its descriptor.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            if uid is not None and gid is not None:
                chown_fd(f.fileno(), uid, gid)
    except BaseException:
        os.unlink(name, dir_fd=dir_fd)
        raise
    return True


def entry_kind(entry: os.DirEntry) -> str:
    """'link', 'folder', 'file' or 'special' for a directory entry, without following it."""
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "folder"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "special"


class Budget:
    """How many entries a walk may still visit; Refused when it runs out."""

    def __init__(self, entries: int, what: str):
        self.left = entries
        self.what = what

    def take(self, rel: str) -> None:
        self.left -= 1
        if self.left < 0:
            raise Refused(
                f"{self.what} holds too many files and folders (stopped at {rel}).", TOO_MANY, rel
            )


def entries(dir_fd: int, budget: Budget | None = None, rel: str = "") -> list[tuple[str, str]]:
    """``(name, kind)`` of each entry of the open folder ``rel``, sorted by name; each
    entry counts against ``budget`` as it is read (a huge folder stops early)."""
    out = []
    with os.scandir(dir_fd) as it:
        for e in it:
            if budget is not None:
                budget.take(join(rel, e.name))
            out.append((e.name, entry_kind(e)))
    return sorted(out)


def walk(
    dir_fd: int, rel: str, budget: Budget, skip=lambda name: False, depth: int = 0
) -> Iterator[tuple[str, str, int, str]]:
    """Every entry below the open folder ``dir_fd`` (named ``rel``), depth first.

    Yields ``(rel path, kind, parent descriptor, name)``; folders are entered by
    descriptor without following links, and ``skip(name)`` entries are left out.
    The parent descriptor is valid only until the next step of the walk.
    """
    if depth > MAX_DEPTH:
        raise Refused(f"The project's {rel} is more than {MAX_DEPTH} folders deep.", TOO_MANY, rel)
    for name, what in entries(dir_fd, budget, rel):
        if skip(name):
            continue
        path = join(rel, name)
        yield path, what, dir_fd, name
        if what == "folder":
            sub = open_dir(name, dir_fd, path)
            try:
                yield from walk(sub, path, budget, skip, depth + 1)
            finally:
                os.close(sub)


def ensure_project(project: Project, dockerfile_text: str, uid: int, gid: int) -> bool:
    """Create the project's directory and Dockerfile if missing (re-runnable).

    Returns True when the Dockerfile was written now. An existing entry named
    Dockerfile (even a link) is never touched. No link is followed; only what
    is created here is given to the notebook user (``uid``/``gid``: its ids on
    the host), through descriptors.
    """
    owner = safe_owner(project.owner)
    try:
        project.root.mkdir(parents=True, exist_ok=True)
        root_fd = open_root(project.root)
        try:
            _mkdir(root_fd, owner, 0o755)
            user_fd = open_dir(owner, root_fd, "")
        finally:
            os.close(root_fd)
        try:
            created = _mkdir(user_fd, project.name, 0o755)
            fd = open_dir(project.name, user_fd, "")
        finally:
            os.close(user_fd)
    except (OSError, Refused) as e:
        if isinstance(e, Refused):
            why = "it is a link" if e.reason == LINK else "it is not a folder"
        else:
            why = e.strerror
        raise ProjectError(
            f"Cannot create the project directory {project.path}: {why}. "
            "Ask the administrator to check ProjectSpawner.projects_root."
        ) from e
    try:
        if created:
            chown_fd(fd, uid, gid)
        try:
            os.stat(DOCKERFILE, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return create_exclusive(fd, DOCKERFILE, dockerfile_text.encode(), uid, gid)
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

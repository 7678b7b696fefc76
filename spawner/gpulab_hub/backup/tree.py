"""Folders into a tar archive, one folder at a time from descriptors, never through a link.

:class:`Writer` adds members and keeps each file member's sha256 and size for the
manifest. :meth:`Writer.add_tree` walks a folder: every entry is looked at with
``lstat`` through its folder's descriptor, folders are opened with ``O_NOFOLLOW`` and
files with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks) and checked with ``fstat``
after opening (an entry swapped for a link in between is refused). In a tree of the
users' own (``hostile=True``) a link is stored as a link member (its target as text; what
it points to is never read), elsewhere it is left out; FIFOs, sockets and devices are
always left out, each named in the manifest's ``left_out``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 64  # folders inside folders
CHUNK = 1 << 20


class _Reader(io.RawIOBase):
    """Exactly ``size`` bytes of an open file, hashed as they pass: a file that shrinks
    while it is read is padded with zeros (and said so), one that grows is cut."""

    def __init__(self, fd: int, size: int):
        self.fd, self.left, self.short = fd, size, False
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        chunks, got = [], 0
        while got < n:
            chunk = os.read(self.fd, min(CHUNK, n - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        if got < n:
            self.short = True
            data += b"\0" * (n - len(data))
        self.left -= len(data)
        self.sha.update(data)
        return data


@dataclass
class Writer:
    """A tar archive being written, and what the manifest says of it."""

    tar: tarfile.TarFile
    say: Callable[[str], None] = print
    members: dict[str, dict] = field(default_factory=dict)  # name -> {sha256, size} | {link}
    left_out: list[str] = field(default_factory=list)  # sentences
    files: int = 0
    bytes: int = 0

    def _info(self, name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = int(st.st_mtime)
        info.uid, info.gid = st.st_uid, st.st_gid
        info.uname = info.gname = ""
        return info

    def add_bytes(self, name: str, data: bytes, st: os.stat_result | None = None) -> None:
        """A file member holding ``data`` (read elsewhere, e.g. under a record's lock)."""
        info = tarfile.TarInfo(name)
        if st is not None:
            info = self._info(name, st, tarfile.REGTYPE)
        else:
            info.mode = 0o600
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))
        self._count(name, hashlib.sha256(data).hexdigest(), len(data))

    def add_fd(self, name: str, fd: int, st: os.stat_result) -> None:
        """A file member read from the open regular file ``fd`` (``st``: its fstat)."""
        info = self._info(name, st, tarfile.REGTYPE)
        info.size = st.st_size
        reader = _Reader(fd, st.st_size)
        self.tar.addfile(info, reader)
        if reader.short:
            self.left_out.append(f"{name} shrank while it was read: its end is zeros")
        self._count(name, reader.sha.hexdigest(), st.st_size)

    def add_dir(self, name: str, st: os.stat_result) -> None:
        self.tar.addfile(self._info(name, st, tarfile.DIRTYPE))
        self.members[name] = {"type": "folder"}

    def add_link(self, name: str, target: str, st: os.stat_result) -> None:
        info = self._info(name, st, tarfile.SYMTYPE)
        info.linkname = target
        self.tar.addfile(info)
        self.members[name] = {"type": "link", "target": target}

    def _count(self, name: str, sha: str, size: int) -> None:
        self.members[name] = {"type": "file", "sha256": sha, "size": size}
        self.files += 1
        self.bytes += size

    # --- folders --------------------------------------------------------------------
    def add_tree(
        self,
        path: str | os.PathLike,
        arc: str,
        *,
        hostile: bool,
        skip: Callable[[str, os.stat_result], bool] = lambda rel, st: False,
        read_locked: Callable[[str, int, str], bytes | None] | None = None,
    ) -> None:
        """Add the folder ``path`` (itself opened as the admin set it) as ``arc/...``.

        ``skip(rel, st)`` leaves an entry out (``rel``: its path below ``path``).
        ``read_locked(rel, dir_fd, name)`` may return a file's bytes read under its
        store's lock (None: read it here)."""
        try:
            fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            self._walk(fd, "", arc, hostile, skip, read_locked, 0)
        finally:
            os.close(fd)

    def _walk(self, dir_fd, rel, arc, hostile, skip, read_locked, depth) -> None:
        with os.scandir(dir_fd) as it:
            names = sorted(entry.name for entry in it)
        for name in names:
            sub = f"{rel}/{name}" if rel else name
            target = f"{arc}/{sub}"
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile
            if skip(sub, st):
                continue
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                if hostile:
                    self.add_link(target, os.readlink(name, dir_fd=dir_fd), st)
                else:
                    self.left_out.append(f"{target} is a link: gpulab does not follow it")
            elif stat.S_ISDIR(mode):
                if depth >= MAX_DEPTH:
                    self.left_out.append(f"{target}: folders deeper than {MAX_DEPTH} left out")
                    continue
                try:
                    sub_fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
                except OSError as e:
                    self._gone(target, e)
                    continue
                try:
                    self.add_dir(target, os.fstat(sub_fd))
                    self._walk(sub_fd, sub, arc, hostile, skip, read_locked, depth + 1)
                finally:
                    os.close(sub_fd)
            elif stat.S_ISREG(mode):
                self._file(dir_fd, name, sub, target, read_locked)
            else:
                self.left_out.append(f"{target} is not a file or folder (a FIFO, socket or device)")

    def _file(self, dir_fd, name, rel, target, read_locked) -> None:
        if read_locked is not None:
            data = read_locked(rel, dir_fd, name)
            if data is not None:
                self.add_bytes(target, data, os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
                return
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            self._gone(target, e)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.left_out.append(f"{target} is not a file or folder (a FIFO, socket or device)")
                return
            self.add_fd(target, fd, st)
        finally:
            os.close(fd)

    def _gone(self, target: str, e: OSError) -> None:
        if e.errno == errno.ENOENT:
            return  # removed meanwhile
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            self.left_out.append(f"{target} became a link while it was read: left out")
            return
        self.left_out.append(f"{target} could not be read ({e.strerror or e}): left out")

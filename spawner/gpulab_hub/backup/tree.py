"""Folders into a tar archive, one folder at a time from descriptors, never through a link.

:class:`Writer` adds members and hands each one (its sha256 and size) and each entry
left out to the manifest's member list as it goes (nothing of it is kept in memory).
:meth:`Writer.add_tree` walks a folder: every entry is looked at with ``lstat`` through
its folder's descriptor, folders are opened with ``O_NOFOLLOW`` and files with
``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks) and checked with ``fstat`` after
opening (an entry swapped for a link in between is refused). In a tree of the users' own
(``hostile=True``) a link is stored as a link member (its target as text; what it points
to is never read), elsewhere it is left out; FIFOs, sockets and devices are always left
out, each named. A file with holes is stored sparse (sparse.py: its holes are never
read); each project is held to the admin's :class:`Limits`, and what is over them is
left out, named, with one line per project in the report.
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

from gpulab_hub.backup import sparse

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 64  # folders inside folders
CHUNK = 1 << 20
SPECIAL = "is not a file or folder (a FIFO, socket or device)"
MAX_SAID = 1000  # sentences of what was left out that the report keeps (all are listed)


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


def shown(name: str) -> str:
    """A name as a report prints it: as it is, or quoted with escapes where it holds a
    newline, a control character or bytes that are not UTF-8."""
    return name if name.isprintable() else ascii(name)


@dataclass(frozen=True)
class Limits:
    """What one project folder may put in a backup (0: no limit): entries (files,
    folders, links) and bytes (counted by what is stored: a sparse file's data, not its
    holes). ``files_name``, ``bytes_name``: the settings that set them, for the report."""

    files: int = 0
    bytes: int = 0
    files_name: str = "the limit of files per project"
    bytes_name: str = "the limit of bytes per project"


@dataclass
class _Unit:
    files: int = 0
    bytes: int = 0
    left: int = 0
    first: str = ""
    why: str = ""
    said: bool = False


@dataclass
class Writer:
    """A tar archive being written, and what the manifest says of it: each member and
    each entry left out is handed to ``listing`` (one dict each, in the archive's order:
    the manifest's member list, streamed), ``left_out`` keeps the first MAX_SAID
    sentences for the report."""

    tar: tarfile.TarFile
    say: Callable[[str], None] = print
    listing: Callable[[dict], None] = lambda entry: None
    limits: Limits = field(default_factory=Limits)
    left_out: list[str] = field(default_factory=list)  # sentences (the first MAX_SAID)
    over: list[str] = field(default_factory=list)  # one sentence per project over a limit
    left_out_count: int = 0
    over_count: int = 0  # of them, left out for a project's limits
    files: int = 0
    bytes: int = 0
    units: dict[str, _Unit] = field(default_factory=dict)

    def leave_out(self, sentence: str, *, said: bool = True) -> None:
        """An entry left out: listed in the manifest; ``said``: also in the report."""
        self.listing({"left_out": sentence})
        self.left_out_count += 1
        if said and len(self.left_out) < MAX_SAID:
            self.left_out.append(sentence)

    def _info(self, name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = int(st.st_mtime)
        info.uid, info.gid = st.st_uid, st.st_gid
        info.uname = info.gname = ""
        return info

    def add_bytes(
        self, name: str, data: bytes, st: os.stat_result | None = None, *, listed: bool = True
    ) -> None:
        """A file member holding ``data`` (read elsewhere, e.g. under a record's lock);
        ``listed``: in the member list (the manifest itself is not)."""
        info = tarfile.TarInfo(name)
        if st is not None:
            info = self._info(name, st, tarfile.REGTYPE)
        else:
            info.mode = 0o600
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))
        if listed:
            self._count(name, hashlib.sha256(data).hexdigest(), len(data))

    def add_fd(
        self, name: str, fd: int, st: os.stat_result, regions=None, *, listed: bool = True
    ) -> None:
        """A file member read from the open regular file ``fd`` (``st``: its fstat):
        whole, or (``regions``: its data regions, sparse.extents) as a sparse member."""
        info = self._info(name, st, tarfile.REGTYPE)
        if regions is not None:
            reader = sparse.Reader(fd, regions)
            self.tar.addfile(sparse.member_info(info, regions, st.st_size), reader)
            stored = sum(length for _, length in regions)
        else:
            info.size = st.st_size
            reader = _Reader(fd, st.st_size)
            self.tar.addfile(info, reader)
            stored = st.st_size
        if reader.short:
            self.leave_out(f"{shown(name)} shrank while it was read: its end is zeros")
        if listed:
            self._count(name, reader.sha.hexdigest(), st.st_size, stored, regions is not None)

    def add_dir(self, name: str, st: os.stat_result) -> None:
        self.tar.addfile(self._info(name, st, tarfile.DIRTYPE))
        self.listing({"name": name, "type": "folder"})

    def add_link(self, name: str, target: str, st: os.stat_result) -> None:
        info = self._info(name, st, tarfile.SYMTYPE)
        info.linkname = target
        self.tar.addfile(info)
        self.listing({"name": name, "type": "link", "target": target})

    def _count(self, name: str, sha: str, size: int, stored=None, holes=False) -> None:
        entry = {"name": name, "type": "file", "sha256": sha, "size": size}
        if holes:
            entry["sparse"] = stored
        self.listing(entry)
        self.files += 1
        self.bytes += size if stored is None else stored

    # --- folders --------------------------------------------------------------------
    def add_tree(
        self,
        path: str | os.PathLike,
        arc: str,
        *,
        hostile: bool,
        skip: Callable[[str, os.stat_result], bool] = lambda rel, st: False,
        read_locked: Callable[[str, int, str], bytes | None] | None = None,
        unit_depth: int = 0,
    ) -> None:
        """Add the folder ``path`` (itself opened as the admin set it) as ``arc/...``.

        ``skip(rel, st)`` leaves an entry out (``rel``: its path below ``path``).
        ``read_locked(rel, dir_fd, name)`` may return a file's bytes read under its
        store's lock (None: read it here). ``unit_depth``: the entries this deep below
        ``path`` are projects (2: <user>/<project>; 1: one deleted account's archive),
        each held to ``limits`` (0: none)."""
        try:
            fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            self._walk(fd, "", arc, hostile, skip, read_locked, 0, unit_depth)
        finally:
            os.close(fd)
        self._say_units()

    def _walk(self, dir_fd, rel, arc, hostile, skip, read_locked, depth, unit_depth) -> None:
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
            unit = self._unit(arc, sub, unit_depth)
            kept = stat.S_ISLNK(mode) or stat.S_ISDIR(mode) or stat.S_ISREG(mode)
            # a project's own Dockerfile is never left out for the count (it rebuilds it)
            dockerfile = name == "Dockerfile" and sub.count("/") == unit_depth
            limited = unit is not None and kept and not dockerfile
            if limited and not self._take_file(unit, target, stat.S_ISDIR(mode)):
                continue
            if stat.S_ISLNK(mode):
                if hostile:
                    self.add_link(target, os.readlink(name, dir_fd=dir_fd), st)
                else:
                    self.leave_out(f"{shown(target)} is a link: gpulab does not follow it")
            elif stat.S_ISDIR(mode):
                if depth >= MAX_DEPTH:
                    self.leave_out(f"{shown(target)}: folders deeper than {MAX_DEPTH} left out")
                    continue
                try:
                    sub_fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
                except OSError as e:
                    self._gone(target, e)
                    continue
                try:
                    self.add_dir(target, os.fstat(sub_fd))
                    self._walk(sub_fd, sub, arc, hostile, skip, read_locked, depth + 1, unit_depth)
                finally:
                    os.close(sub_fd)
            elif stat.S_ISREG(mode):
                self._file(dir_fd, name, sub, target, read_locked, unit)
            else:
                self.leave_out(f"{shown(target)} {SPECIAL}")

    # --- each project's limits --------------------------------------------------------
    def _unit(self, arc: str, rel: str, unit_depth: int) -> _Unit | None:
        """The project ``rel`` lies in (None: no limits here, or ``rel`` is no deeper)."""
        if not unit_depth or not (self.limits.files or self.limits.bytes):
            return None
        parts = rel.split("/")
        if len(parts) <= unit_depth:
            return None
        return self.units.setdefault(f"{arc}/{'/'.join(parts[:unit_depth])}", _Unit())

    def _over(self, unit: _Unit, target: str, why: str) -> None:
        unit.left += 1
        unit.first = unit.first or target
        unit.why = unit.why or why
        self.over_count += 1
        self.leave_out(f"{shown(target)}: left out, its project is {why}", said=False)

    def _take_file(self, unit: _Unit, target: str, folder: bool) -> bool:
        limit = self.limits.files
        if limit and unit.files >= limit:
            what = " (and all it holds)" if folder else ""
            self._over(unit, target + what, f"over the limit of {limit:,} "
                       f"{'file' if limit == 1 else 'files'} per project "
                       f"({self.limits.files_name})")  # fmt: skip
            return False
        unit.files += 1
        return True

    def _take_bytes(self, unit: _Unit | None, target: str, charge: int) -> bool:
        if unit is None or not self.limits.bytes:
            return True
        if unit.bytes + charge > self.limits.bytes:
            self._over(unit, target, f"over the limit of {self.limits.bytes / (1 << 20):,.0f} "
                       f"MiB per project ({self.limits.bytes_name})")  # fmt: skip
            return False
        unit.bytes += charge
        return True

    def _say_units(self) -> None:
        for name, unit in self.units.items():
            if unit.left and not unit.said:
                entries = "entry" if unit.left == 1 else "entries"
                self.over.append(
                    f"{shown(name)}: {unit.why}: {unit.left:,} {entries} left out, the first "
                    f"{shown(unit.first)} (each is named in the archive's member list)"
                )
                unit.said = True

    # --- files ------------------------------------------------------------------------
    def _file(self, dir_fd, name, rel, target, read_locked, unit) -> None:
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
                self.leave_out(f"{shown(target)} {SPECIAL}")
                return
            how = self._how(fd, st, target)
            if how is None:
                return
            regions, charge = how
            if self._take_bytes(unit, target, charge):
                self.add_fd(target, fd, st, regions)
        finally:
            os.close(fd)

    def _how(self, fd: int, st: os.stat_result, target: str):
        """(data regions or None: stored whole, bytes it counts for), or None: left out.
        A file counts by what is stored of it: a sparse file by its data (at least its
        blocks on disk), never by the holes, which are never read."""
        if st.st_size == 0:
            return None, 0
        try:
            regions = sparse.extents(fd, st.st_size)
        except sparse.TooFragmented:
            self.leave_out(f"{shown(target)} has more than {sparse.MAX_EXTENTS:,} holes: left out")
            return None
        if not sparse.has_holes(regions, st.st_size):
            return None, st.st_size
        data = sum(length for _, length in regions)
        blocks = min(st.st_blocks * 512, st.st_size)
        if sparse.stored_size(regions) <= sparse.MAX_STORED:
            return regions, max(data, blocks)
        if st.st_size - data <= sparse.HOLES_READ:
            return None, st.st_size  # stored whole: its holes are small
        self.leave_out(
            f"{shown(target)} is a sparse file with more than 8 GiB of data and "
            f"{(st.st_size - data) / (1 << 30):,.0f} GiB of holes: left out (copy it yourself)"
        )
        return None

    def _gone(self, target: str, e: OSError) -> None:
        if e.errno == errno.ENOENT:
            return  # removed meanwhile
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            self.leave_out(f"{shown(target)} became a link while it was read: left out")
            return
        self.leave_out(f"{shown(target)} could not be read ({e.strerror or e}): left out")

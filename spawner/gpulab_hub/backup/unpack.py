"""Checked archive members written below a folder from descriptors, never through a link.

tarfile's own extraction joins each name to the destination's path, which fails for a
name longer than PATH_MAX (4096 bytes; a project folder 64 folders deep of 255-byte
names is 16 KiB) and resolves each component again. Here each member's folders are
opened one at a time from the folder above (``O_NOFOLLOW | O_DIRECTORY``, made 0700
where missing), files are created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``) and
owners, modes and times are set through descriptors. Folders get their modes, owners
and times last, deepest first (a read-only folder still fills), as tarfile does. A
sparse member (sparse.py) is written region by region and given its size with
``ftruncate``: its holes stay holes.

The members are those restore.py checked and passed through tarfile's ``data`` filter
(names, link targets, modes); anything this module meets that the filter should have
stopped (a link in the way, an entry already there) is refused, and the restore with it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tarfile

from gpulab_hub.backup import BackupError, sparse

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20


class Unpacker:
    """Writes members below the open folder ``root_fd``; ``close()`` sets the folders'
    modes and closes what it opened."""

    def __init__(self, root_fd: int):
        self.root = root_fd
        self.open: list[tuple[str, int]] = []  # the folders of the last member, open
        self.folders: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
        self.as_root = os.geteuid() == 0

    def _folder(self, parts: list[str]) -> int:
        """The folder ``parts`` below the root, opened (made where missing) one folder
        at a time; the folders the last member shared are reused."""
        same = 0
        while same < min(len(parts), len(self.open)) and self.open[same][0] == parts[same]:
            same += 1
        for _, fd in reversed(self.open[same:]):
            os.close(fd)
        del self.open[same:]
        for name in parts[same:]:
            parent = self.open[-1][1] if self.open else self.root
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                pass
            self.open.append((name, os.open(name, DIR_FLAGS, dir_fd=parent)))
        return self.open[-1][1] if self.open else self.root

    def add(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> dict:
        """Write ``m``. -> for a file, what the manifest lists of it (its sha256, as
        backup took it: for a sparse member over its map and data; its size)."""
        parts = m.name.split("/")
        try:
            parent = self._folder(parts[:-1])
            if m.isdir():
                try:
                    os.mkdir(parts[-1], 0o700, dir_fd=parent)
                except FileExistsError:
                    os.close(os.open(parts[-1], DIR_FLAGS, dir_fd=parent))  # a folder
                self.folders.append((tuple(parts), m))
            elif m.issym():
                os.symlink(m.linkname, parts[-1], dir_fd=parent)
                self._owner(m, lambda u, g: os.chown(parts[-1], u, g, dir_fd=parent,
                                                     follow_symlinks=False))  # fmt: skip
                os.utime(parts[-1], (m.mtime, m.mtime), dir_fd=parent, follow_symlinks=False)
            elif m.isreg():
                return self._file(tar, m, parent, parts[-1])
            else:  # restore.verify refused these already
                raise BackupError(f"The archive's {m.name[:200]!r} is no file, folder or link.")
        except OSError as e:
            why = "a link is in the way" if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
            raise BackupError(
                f"The archive's {m.name[:200]!r} cannot be restored ({why or e}); nothing was "
                "restored."
            ) from e
        return {}

    def _file(self, tar, m: tarfile.TarInfo, parent: int, name: str) -> dict:
        fd = os.open(name, NEW_FILE, 0o600, dir_fd=parent)
        try:
            if m.sparse is not None:
                sha = hashlib.sha256(sparse.map_text(m.sparse))
                for offset, chunk in sparse.regions_of(tar, m):
                    sha.update(chunk)
                    os.pwrite(fd, chunk, offset)
                os.ftruncate(fd, m.size)  # the holes after the last region
                said = {"sparse": sum(length for _, length in m.sparse)}
            else:
                sha, src, said = hashlib.sha256(), tar.extractfile(m), {}
                while chunk := src.read(CHUNK):
                    sha.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
            self._owner(m, lambda u, g: os.fchown(fd, u, g))
            if m.mode is not None:
                os.fchmod(fd, m.mode)
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)
        return {"sha256": sha.hexdigest(), "size": m.size, **said}

    def _owner(self, m: tarfile.TarInfo, chown) -> None:
        if self.as_root and m.uid is not None:
            chown(m.uid, -1 if m.gid is None else m.gid)

    def close(self) -> None:
        """The folders' modes, owners and times, deepest first; then close."""
        try:
            for parts, m in sorted(self.folders, key=lambda f: f[0], reverse=True):
                fd = self._folder(list(parts))
                self._owner(m, lambda u, g, fd=fd: os.fchown(fd, u, g))
                if m.mode is not None:
                    os.fchmod(fd, m.mode)
                os.utime(fd, (m.mtime, m.mtime))
        except OSError as e:
            raise BackupError(f"Could not set a restored folder's mode ({e}).") from e
        finally:
            self.release()

    def release(self) -> None:
        """Close the folders still open."""
        for _, fd in reversed(self.open):
            os.close(fd)
        self.open.clear()

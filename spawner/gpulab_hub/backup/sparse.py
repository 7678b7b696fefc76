"""Sparse files in a backup: found with SEEK_DATA/SEEK_HOLE, stored in GNU tar's sparse
format 1.0, never read through a hole.

A file with holes (a 16 TiB file of no blocks is made in a moment) is stored as one tar
member in the format GNU tar writes with ``--sparse --format=posix`` (PAX records
``GNU.sparse.major=1``, ``minor=0``, ``name``, ``realsize``; the member's data is the
map of its data regions, as text, then those regions). Python's tarfile reads that
format (and restores holes as holes) but does not write it, so :func:`member_info`
and :class:`Reader` write it here; GNU tar reads it too. The kernel says where the data
is (``lseek`` with SEEK_DATA and SEEK_HOLE), so a hole is never read, on writing or on
restoring (:func:`regions_of`: only the stored regions are read back).

The manifest's sha256 of a sparse member is over its map (as stored) and its data
regions, which the restorer can check without reading a hole either.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tarfile
from collections.abc import Iterator

BLOCK = tarfile.BLOCKSIZE
MAX_EXTENTS = 1 << 16  # data regions of one file; a file with more is left out, named
MAX_STORED = 8**11 - 1  # bytes tar's size field holds (tarfile misreads larger sparse ones)
HOLES_READ = 1 << 30  # a file too large to store sparse is read whole if its holes are less
CHUNK = 1 << 20


class TooFragmented(Exception):
    """A file with more than MAX_EXTENTS data regions."""


def extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The data regions of the open file ``fd`` (``size``: its fstat size), as
    (offset, length); one region (0, size) for a file without holes or on a file system
    that does not report them. TooFragmented past MAX_EXTENTS."""
    found: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data after pos: the rest is a hole
                break
            if e.errno == errno.EINVAL:  # no SEEK_DATA here: all of it is data
                return [(0, size)]
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if len(found) >= MAX_EXTENTS:
            raise TooFragmented
        found.append((start, end - start))
        pos = end
    os.lseek(fd, 0, os.SEEK_SET)
    return found


def has_holes(regions: list[tuple[int, int]], size: int) -> bool:
    return regions != [(0, size)]


def map_text(regions: list[tuple[int, int]]) -> bytes:
    """The map as format 1.0 stores it (before padding): the count, then each region's
    offset and length, one number a line."""
    lines = [str(len(regions))] + [str(n) for region in regions for n in region]
    return ("\n".join(lines) + "\n").encode()


def stored_size(regions: list[tuple[int, int]]) -> int:
    """Bytes of the member's data: the map padded to whole blocks, then the regions."""
    return _padded(len(map_text(regions))) + sum(length for _, length in regions)


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def member_info(info: tarfile.TarInfo, regions, size: int) -> tarfile.TarInfo:
    """``info`` (a regular file member named as restored) made a format 1.0 sparse
    member of the logical ``size`` with data ``regions``."""
    name = info.name
    head, _, base = name.rpartition("/")
    info.pax_headers = {
        # ``path`` first: tarfile applies the records in order, so GNU.sparse.name wins
        "path": f"{head}/GNUSparseFile.0/{base}" if head else f"GNUSparseFile.0/{base}",
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(size),
    }
    info.size = stored_size(regions)
    return info


class Reader:
    """The member data of a sparse file: its map, then each data region read with
    ``pread`` (a region that shrank is padded with zeros, and said so); hashed as it
    passes (the map as text, then the data). ``read(n)`` gives exactly ``n`` bytes (as
    tarfile.addfile needs) until the member's end."""

    def __init__(self, fd: int, regions: list[tuple[int, int]]):
        self.fd, self.short = fd, False
        text = map_text(regions)
        self.sha = hashlib.sha256(text)
        self._pieces = self._read_all(text + b"\0" * (_padded(len(text)) - len(text)), regions)
        self._pending = b""

    def _read_all(self, head: bytes, regions):
        yield head
        for offset, length in regions:
            done = 0
            while done < length:
                want = min(CHUNK, length - done)
                data = os.pread(self.fd, want, offset + done)
                if len(data) < want:
                    self.short = True
                    data += b"\0" * (want - len(data))
                self.sha.update(data)
                done += want
                yield data

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = CHUNK if n is None or n < 0 else n
        parts, got = [self._pending], len(self._pending)
        while got < n:
            piece = next(self._pieces, None)
            if piece is None:
                break
            parts.append(piece)
            got += len(piece)
        data = b"".join(parts)
        data, self._pending = data[:n], data[n:]
        return data


def regions_of(tar: tarfile.TarFile, m: tarfile.TarInfo) -> Iterator[tuple[int, bytes]]:
    """The data of the sparse member ``m`` of ``tar`` (read as a stream: its current
    member), as (offset in the file, bytes), in chunks: read as tarfile's own
    extraction reads it (the regions lie one after the other in the archive)."""
    source = tar.fileobj
    source.seek(m.offset_data)
    for offset, length in m.sparse:
        done = 0
        while done < length:
            chunk = source.read(min(CHUNK, length - done))
            if not chunk:
                raise EOFError(f"the archive's {m.name[:200]!r} is cut short")
            yield offset + done, chunk
            done += len(chunk)

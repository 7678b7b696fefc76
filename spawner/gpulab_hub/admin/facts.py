"""What the admin page reads off the event loop: the GPU allocation record (who holds
which GPU, since when), the GPU queue (starts waiting for a GPU) and each user's disk
use under the projects folder.

Every function here blocks (file locks, NVML, a walk of the disk): the page calls
them through :func:`gpulab_hub.blocking.run` (the records) or a thread of their own
(the disk walk). Nothing is read at import time.

The disk walk reads folders the users own, so it is read as hostile (as safefs.py
does): one folder at a time from a descriptor, never through a link (O_NOFOLLOW;
a link counts as its own few bytes), never onto another file system, at most
MAX_DEPTH folders deep, at most MAX_ENTRIES entries and MAX_SECONDS per user; a
walk that stops early says so ("at least"). A user's figure is kept a minute
(CACHE_S), so a page reloaded often does not walk the disk again.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub import hubsettings, jsonfile
from gpulab_hub.gpus import allocator, queue
from gpulab_hub.projects import ProjectError, safe_owner
from gpulab_hub.projects.safefs import DIR_FLAGS, size_text

LOG = logging.getLogger("gpulab.admin")
CACHE_S = 60.0  # a user's disk figure is this fresh at most
MAX_ENTRIES = 200_000  # files and folders one user's walk looks at
MAX_SECONDS = 5.0  # one user's walk stops after this long
MAX_DEPTH = 64  # folders inside folders, below the user's folder


@dataclass(frozen=True)
class Holding:
    """One project holding one device, as the allocation record has it."""

    uuid: str
    label: str  # "GPU 0 (NVIDIA H100 80GB HBM3)", or the UUID where the host has no such device
    owner: str
    project: str
    since: float  # epoch seconds

    @property
    def since_iso(self) -> str:
        return iso(self.since)


@dataclass(frozen=True)
class Queued:
    """A start waiting for a GPU (the GPU queue, in the order the starts joined it)."""

    owner: str
    project: str
    asks: str  # "1 GPU", "2 H100 GPUs", "a 1g.10gb MIG slice"
    since: float

    @property
    def since_iso(self) -> str:
        return iso(self.since)


@dataclass(frozen=True)
class Records:
    holdings: tuple[Holding, ...]  # by device, then since
    kept_free: tuple[str, ...]  # labels of devices kept free for a waiting start
    queued: tuple[Queued, ...]
    problems: tuple[str, ...]  # records that could not be read, in words

    def held_by(self, owner: str, project: str) -> list[Holding]:
        return [h for h in self.holdings if (h.owner, h.project) == (owner, project)]


@dataclass(frozen=True)
class Disk:
    """What a user's folder under the projects folder takes on disk."""

    used: int  # bytes (allocated blocks, hard links counted once)
    entries: int  # files and folders counted
    complete: bool  # False: the walk stopped at a cap, or could not open some folders
    note: str = ""  # why it is not complete
    measured_at: float = 0.0  # epoch seconds

    @property
    def words(self) -> str:
        if self.entries == 0 and self.used == 0 and self.complete:
            return "nothing yet"
        return ("" if self.complete else "at least ") + size_text(self.used)


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _asks(r: allocator.Request) -> str:
    if r.mig_profile:
        return f"a {r.gpu_type + ' ' if r.gpu_type else ''}{r.mig_profile} MIG slice"
    kind = f"{r.gpu_type} " if r.gpu_type else ""
    return f"{r.count} {kind}GPU{'' if r.count == 1 else 's'}"


def device_labels() -> dict[str, str]:
    """UUID -> "GPU 0 (NVIDIA H100 80GB HBM3)" of this host's devices (NVML, cached)."""
    from gpulab_hub.gpus.spawner import cached_inventory

    return {d.uuid: allocator.label(d) for d in cached_inventory().devices}


def records(
    where: hubsettings.Layout, labels: Callable[[], dict[str, str]] = device_labels
) -> Records:
    """Blocking: the GPU holdings and the GPU queue, read under their stores' locks."""
    problems: list[str] = []
    held: allocator.Held = {}
    try:
        held = allocator.AllocationStore(where.allocations_file).holdings()
    except (allocator.AllocationError, OSError) as e:
        problems.append(f"The GPU allocation record cannot be read: {e}")
    entries: list[queue.Entry] = []
    if where.queue_file.exists():
        try:
            entries = queue.QueueStore(where.queue_file).entries()
        except (queue.QueueError, jsonfile.RecordError, OSError) as e:
            problems.append(f"The GPU queue cannot be read: {e}")
    names: dict[str, str] = {}
    if held:
        try:
            names = labels()
        except Exception as e:  # noqa: BLE001 - NVML's errors are many; the page still shows
            LOG.warning("gpulab: the admin page cannot list this host's GPUs: %s", e)
    holdings, kept = [], []
    for uuid in sorted(held, key=lambda u: (names.get(u, "~" + u), u)):
        label = names.get(uuid, f"a GPU not seen on this host now ({uuid})")
        for h in sorted(held[uuid], key=lambda h: h.since):
            if h.owner == queue.RESERVED:
                kept.append(label)
            else:
                holdings.append(Holding(uuid, label, h.owner, h.project, h.since))
    queued = tuple(Queued(e.owner, e.project, _asks(e.request), e.enqueued_at) for e in entries)
    return Records(tuple(holdings), tuple(dict.fromkeys(kept)), queued, tuple(problems))


# --- disk use per user ---


class _Walk:
    """One bounded walk of a user's folder (see the module's docstring)."""

    def __init__(self, max_entries: int, max_seconds: float, clock=time.monotonic):
        self.used = 0
        self.entries = 0
        self.notes: list[str] = []
        self.max_entries = max_entries
        self.deadline = clock() + max_seconds
        self.clock = clock
        self.seen: set[tuple[int, int]] = set()  # hard-linked files counted already
        self.stopped = False

    def note(self, words: str) -> None:
        if words not in self.notes:
            self.notes.append(words)

    def count(self, st: os.stat_result) -> None:
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in self.seen:
                return
            self.seen.add(key)
        self.used += st.st_blocks * 512

    def walk(self, top: int) -> None:
        """Count everything below the folder ``top`` (a descriptor; closed here)."""
        dev = os.fstat(top).st_dev
        stack: list[tuple[int, Iterable[os.DirEntry]]] = []
        try:
            stack.append((top, os.scandir(top)))
        except OSError:
            os.close(top)
            raise
        try:
            while stack and not self.stopped:
                fd, listing = stack[-1]
                entry = next(listing, None)
                if entry is None:
                    listing.close()
                    os.close(fd)
                    stack.pop()
                    continue
                self.entries += 1
                if self.entries > self.max_entries or self.clock() > self.deadline:
                    self.stopped = True
                    self.note(
                        f"stopped counting after {self.entries - 1} files and folders"
                        if self.entries > self.max_entries
                        else f"stopped counting after {MAX_SECONDS:g} s"
                    )
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since it was listed
                self.count(st)
                if not stat.S_ISDIR(st.st_mode):
                    continue  # a link counts as itself; a FIFO or device is never opened
                if st.st_dev != dev:
                    self.note("another file system mounted inside is not counted")
                    continue
                if len(stack) > MAX_DEPTH:
                    self.note(f"folders deeper than {MAX_DEPTH} are not counted")
                    continue
                try:
                    sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        self.note("some folders could not be read")
                    continue  # gone, or swapped for a link since it was listed
                try:
                    stack.append((sub, os.scandir(sub)))
                except OSError:
                    os.close(sub)
                    self.note("some folders could not be read")
        finally:
            for fd, listing in stack:
                listing.close()
                os.close(fd)


def measure(root: Path, owner: str, max_entries: int = MAX_ENTRIES,
            max_seconds: float = MAX_SECONDS) -> Disk:  # fmt: skip
    """Blocking: what ``<root>/<owner>`` (the user's projects) takes on disk, now."""
    now = time.time()
    try:
        base = os.open(str(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the admin's
    except FileNotFoundError:
        return Disk(0, 0, True, measured_at=now)
    try:
        try:
            top = os.open(safe_owner(owner), DIR_FLAGS, dir_fd=base)
        except FileNotFoundError:
            return Disk(0, 0, True, measured_at=now)
        except (OSError, ProjectError) as e:
            why = "it cannot be read"
            if getattr(e, "errno", None) in (errno.ELOOP, errno.ENOTDIR):
                mode = os.stat(owner, dir_fd=base, follow_symlinks=False).st_mode
                why = "it is a link" if stat.S_ISLNK(mode) else "it is not a folder"
            return Disk(0, 0, False, f"the user's folder is not counted: {why}", now)
    finally:
        os.close(base)
    w = _Walk(max_entries, max_seconds)
    try:
        w.count(os.fstat(top))
        w.walk(top)
    except OSError as e:
        w.note(f"the user's folder could not be read ({e.strerror})")
    return Disk(w.used, w.entries, not w.notes, "; ".join(w.notes), now)


class DiskCache:
    """Each user's :class:`Disk`, measured at most every ``ttl`` seconds; one walk at a
    time (two page loads never walk the same disk twice at once)."""

    def __init__(self, ttl: float = CACHE_S, clock=time.monotonic, measure=measure):
        self.ttl, self.clock, self._measure = ttl, clock, measure
        self._kept: dict[tuple[str, str], tuple[float, Disk]] = {}
        self._lock = threading.Lock()

    def used(self, root: Path, owners: Iterable[str]) -> dict[str, Disk]:
        """Blocking: the disk use of each of ``owners`` under ``root``."""
        with self._lock:
            found = {}
            for owner in owners:
                key = (str(root), owner)
                kept = self._kept.get(key)
                if kept is None or self.clock() - kept[0] > self.ttl:
                    kept = self._kept[key] = (self.clock(), self._measure(root, owner))
                found[owner] = kept[1]
            return found

    def forget(self, owner: str) -> None:
        """Measure ``owner`` again next time (after an admin deleted a project of theirs)."""
        with self._lock:
            for key in [k for k in self._kept if k[1] == owner]:
                del self._kept[key]


_cache: DiskCache | None = None
_cache_lock = threading.Lock()


def disk_cache() -> DiskCache:
    """The hub's one disk-use cache (made at first use)."""
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = DiskCache()
        return _cache

"""The GPU usage ledger: every GPU holding, recorded durably when it ends.

One JSON object per line, appended under a file lock and fsynced: who, which
project, which GPU (UUID and the words users see, e.g. "GPU 1 (NVIDIA H100)" or a
slice), from, to, and the average utilisation (percent; None where the host cannot
measure it). Append-only: nothing is rewritten, so a crash can at worst leave a
torn last line, which reading skips (and the next append starts on a line of its
own). Reads are bounded: only the last ``max_bytes`` of the file are read, which
covers the fair-share window on any one box (a year of a busy lab is a few MB).

``hours_by_user`` is what the queue's fair-share order and the budgets read;
``Budgets`` says who is over budget; ``export_csv`` is the admin's export.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from gpulab_hub import blocking, jsonfile, stateversion
from gpulab_hub.gpus.allocator import Held

KIND = stateversion.KINDS["gpu-usage"]  # the lines' format (stateversion.py)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # owner and project
UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}")  # GPU-…, MIG-…, or a slice's id
LABEL = re.compile(r"[A-Za-z0-9 ()/._:+-]{0,128}")  # "GPU 1 (NVIDIA H100 80GB HBM3)"
MAX_LINE = 2048  # bytes of one record, newline included
HOUR = 3600.0


class UsageError(Exception):
    """A record the ledger refuses, or a ledger it cannot use; ``str()`` says which."""


@dataclass(frozen=True)
class Record:
    owner: str
    project: str
    uuid: str  # the GPU's or slice's UUID
    label: str  # as users see it: "GPU 1 (NVIDIA H100 80GB HBM3)", "slice 0/4 of GPU 0"
    start: float  # epoch seconds
    end: float
    util: float | None = None  # average GPU utilisation over the holding, percent

    def __post_init__(self) -> None:
        ok = (
            isinstance(self.owner, str)
            and NAME.fullmatch(self.owner)
            and isinstance(self.project, str)
            and NAME.fullmatch(self.project)
            and isinstance(self.uuid, str)
            and UUID.fullmatch(self.uuid)
            and isinstance(self.label, str)
            and LABEL.fullmatch(self.label)
            and _number(self.start)
            and _number(self.end)
            and self.start <= self.end
            and (self.util is None or (_number(self.util) and 0 <= self.util <= 100))
        )
        if not ok:
            raise UsageError(f"not a GPU usage record gpulab keeps: {self!r}")

    def hours(self, since: float = -math.inf, until: float = math.inf) -> float:
        """GPU-hours of this holding inside [since, until]."""
        return max(0.0, min(self.end, until) - max(self.start, since)) / HOUR


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Budgets:
    """GPU-hour budgets over the fair-share window, set by the admin.

    A user's budget is their own (``users``); else the smallest of their groups'
    (``groups``: each member gets that budget, it is not shared); else ``default``;
    None: no budget. Over budget means using at least the budget.
    """

    users: Mapping[str, float] = field(default_factory=dict)
    groups: Mapping[str, float] = field(default_factory=dict)
    members: Mapping[str, Iterable[str]] = field(default_factory=dict)  # group: its users
    default: float | None = None

    def of(self, user: str) -> float | None:
        if user in self.users:
            return self.users[user]
        mine = [h for g, h in self.groups.items() if user in set(self.members.get(g, ()))]
        return min(mine) if mine else self.default

    def over(self, hours: Mapping[str, float]) -> frozenset[str]:
        """The users in ``hours`` who have used their budget up."""
        return frozenset(u for u, h in hours.items() if (b := self.of(u)) is not None and h >= b)

    def words(self, user: str, hours: float, window: str = "this week") -> str:
        """What the home page says, e.g. "GPU this week: 6.2 h of 20 h"."""
        b = self.of(user)
        return f"GPU {window}: {hours:.1f} h" + ("" if b is None else f" of {b:g} h")


class UsageLedger:
    """The append-only ledger file; safe for several hub processes at once."""

    def __init__(self, path: Path, clock=time.time, max_bytes: int = 64 << 20, log=None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self.max_bytes = max_bytes
        self._thread_lock = threading.RLock()
        self._file_lock = blocking.file_lock(
            self.path.with_name(self.path.name + ".lock"), "the GPU usage ledger"
        )
        self.log = log or jsonfile.LOG
        self.skipped = 0  # torn or damaged lines the last read skipped

    def append(self, records: Iterable[Record]) -> None:
        """Add holdings that ended; durable when this returns."""
        lines = []
        for r in records:
            if not isinstance(r, Record):
                raise UsageError(f"not a GPU usage record: {r!r}")
            # Format 1 lines carry no "version" (a line a holding: kept short); later
            # formats name theirs.
            body = asdict(r) if KIND.current == 1 else KIND.stamp(asdict(r))
            line = (json.dumps(body, separators=(",", ":")) + "\n").encode()
            if len(line) > MAX_LINE:
                raise UsageError(f"a GPU usage record is longer than {MAX_LINE} bytes: {r!r}")
            lines.append(line)
        if not lines:
            return
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        with self._thread_lock, self._file_lock:
            created = not self.path.exists()
            try:
                fd = os.open(self.path, flags, 0o600)
            except OSError as e:
                raise UsageError(
                    f"The GPU usage ledger {self.path} cannot be written ({e.strerror or e}): "
                    "it must be a file (not a link) the hub's account can write."
                ) from e
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise UsageError(f"The GPU usage ledger {self.path} is not a regular file.")
                head = b""
                if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
                    head = b"\n"  # a torn last line stays a line of its own
                os.write(fd, head + b"".join(lines))
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                jsonfile.fsync_dir(self.path.parent)

    def records(self, since: float = -math.inf, until: float = math.inf) -> Iterator[Record]:
        """The holdings that overlap [since, until], from the last ``max_bytes`` of the file."""
        self.skipped = 0
        newer = None
        try:
            data = self._tail()
        except FileNotFoundError:
            return
        lines = data.split(b"\n")
        if not data.endswith(b"\n"):
            lines, torn = lines[:-1], lines[-1]
            self.skipped += bool(torn)  # a write cut short by a crash
        for line in lines:
            if not line:
                continue
            try:
                d = json.loads(line)
                if isinstance(d, dict):  # lines of format 1 carry no "version"
                    d = KIND.upgrade(d, self.path)
                    d.pop("version", None)
                r = Record(**d)
            except stateversion.NewerState as e:
                newer = e
                continue
            except (ValueError, TypeError, UsageError):
                self.skipped += 1
                continue
            if r.end >= since and r.start <= until:
                yield r
        if newer is not None:
            self.log.error("gpulab: lines of the GPU usage ledger were skipped: %s", newer)
        if self.skipped:
            self.log.warning(
                "The GPU usage ledger %s has %d damaged or torn line(s); they were skipped.",
                self.path, self.skipped,
            )  # fmt: skip

    def _tail(self) -> bytes:
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UsageError(f"The GPU usage ledger {self.path} is not a regular file.")
            if size <= self.max_bytes:
                return f.read(self.max_bytes)
            f.seek(size - self.max_bytes)
            data = f.read(self.max_bytes)
            return data[data.find(b"\n") + 1 :]  # the first line is cut: drop it

    def hours_by_user(
        self, window: float, now: float | None = None, held: Held | None = None
    ) -> dict[str, float]:
        """GPU-hours per user over the last ``window`` seconds, holdings under way
        (``held``, from the allocation record) counted up to now."""
        now = self._clock() if now is None else now
        since = now - window
        out: dict[str, float] = {}
        for r in self.records(since, now):
            out[r.owner] = out.get(r.owner, 0.0) + r.hours(since, now)
        for hs in (held or {}).values():
            for h in hs:
                part = max(0.0, now - max(h.since, since)) / HOUR
                out[h.owner] = out.get(h.owner, 0.0) + part
        return out

    def export_csv(self, out: TextIO, since: float = -math.inf, until: float = math.inf) -> int:
        """Write the holdings in [since, until] as CSV (times in UTC); how many rows."""
        w = csv.writer(out)
        w.writerow(["user", "project", "gpu", "gpu_uuid", "from", "to", "gpu_hours", "avg_util"])
        n = 0
        for r in self.records(since, until):
            util = "" if r.util is None else f"{r.util:.1f}"
            w.writerow(
                [
                    _cell(r.owner),
                    _cell(r.project),
                    _cell(r.label),
                    _cell(r.uuid),
                    _utc(r.start),
                    _utc(r.end),
                    f"{r.hours():.3f}",
                    util,
                ]
            )
            n += 1
        return n


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cell(s: str) -> str:
    """A cell a spreadsheet shows as text, never runs as a formula."""
    return "'" + s if s[:1] in ("=", "+", "-", "@") else s

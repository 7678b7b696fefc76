"""Small JSON records on disk: read under a lock, written atomically and durably.

Every hub-side record (the GPU allocation record, the sharing settings, the
group-share roles) is a :class:`LockedRecord`. A record that cannot be parsed
(half-written by a crash before writes were atomic, truncated by a full disk,
garbled by an editor) never ends in a traceback: the store moves the file aside
to ``<name>.corrupt-<time>``, starts from what it can recover (each store says
what that is), and logs one message naming both files and how to restore.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gpulab_contract import files
from gpulab_hub import blocking, stateversion

LOG = logging.getLogger("gpulab_hub")


fsync_dir = files.fsync_dir  # make a rename, creation or removal in a folder durable

# Hub records are the hub account's alone, whatever umask the writing command has.
RECORD_MODE = 0o600


def write_atomic(path: Path, data) -> None:
    """Write ``data`` as JSON to ``path`` with gpulab's one atomic writer
    (gpulab_contract.files): a reader sees the old or the new file, never half of one,
    and after a crash (power loss included) the new one is there."""
    text = json.dumps(data, indent=1)
    files.write_atomic(path, text.encode("utf-8"), mode=RECORD_MODE)


def move_aside(path: Path) -> Path:
    """Rename a damaged ``path`` to ``<name>.corrupt-<time>`` (kept for repair); the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        aside = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
        if not aside.exists():
            break
    os.replace(path, aside)
    fsync_dir(path.parent)
    return aside


def _reason(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"not JSON: {e.msg} at line {e.lineno} column {e.colno}"
    if isinstance(e, UnicodeDecodeError):
        return "not text (binary bytes in it)"
    return str(e) or type(e).__name__


class RecordError(Exception):
    """A record that cannot be read at all (permissions, I/O); ``str()`` says what to do."""


class NotARecord(Exception):
    """What lies in a record's place is no record file (a link, a FIFO, too large)."""


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, never following a link in its place and
    never reading more than ``max_bytes``; NotARecord for anything else there."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotARecord("a link, which gpulab never follows") from e
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARecord("not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotARecord(f"larger than {max_bytes} bytes")
    return data


def section_of(raw: bytes, path: Path, kind: stateversion.Kind, section: str):
    """The ``section`` of a record file's bytes, brought to ``kind``'s current format;
    ValueError/TypeError/KeyError where the file is damaged, stateversion.NewerState
    where a newer gpulab wrote it."""
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise TypeError(f"a JSON {type(data).__name__}, not an object")
    return kind.upgrade(data, path)[section]


class LockedRecord:
    """One JSON file ``{"version": 1, <section>: ...}`` read and changed under a file lock
    (other hub processes) and a thread lock (this one); the base of hub-side stores.

    Subclasses check the section's shape in :meth:`_parse` (raise ValueError, TypeError
    or KeyError on anything else), say what the record is (``what``), and what a
    damaged one is replaced with (:meth:`_recover`) and means (``on_damage``).
    """

    section = "items"
    # The record's kind of state file: its format and the steps from older ones
    # (stateversion.KINDS; a file of a newer gpulab is refused, never moved aside).
    kind: stateversion.Kind = stateversion.Kind("record", ())
    what = "The record"  # "The GPU allocation record": how messages name the file
    on_damage = "it starts empty"  # what the replacement means, for the admin
    Error: type[Exception] = RecordError
    # Records kept from users' input: never follow a link in the record's place, never
    # read more than this (None: the file is read as it is).
    max_bytes: int | None = None

    # How long a change waits for the record before the user is told it is busy.
    lock_timeout: float = blocking.LOCK_TIMEOUT

    def __init__(self, path: Path, log: logging.Logger | logging.LoggerAdapter | None = None):
        self.path = Path(path)
        self._file_lock = blocking.file_lock(
            self.path.with_name(self.path.name + ".lock"), self.named, self.lock_timeout
        )
        self._thread_lock = threading.RLock()
        self.log = log or LOG

    @property
    def named(self) -> str:
        """The record as a sentence names it mid-way ("the GPU allocation record")."""
        return self.what[:1].lower() + self.what[1:]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the record (re-entrant): what is read inside stays true until the end.
        Blocking work (never on the event loop, blocking.off_loop); a record held
        elsewhere longer than ``lock_timeout`` raises blocking.Busy, in the user's words."""
        blocking.off_loop(f"Taking the lock of {self.named}")
        if not self._thread_lock.acquire(timeout=self.lock_timeout):
            raise blocking.Busy(self.named)
        try:
            with self._file_lock:
                yield
        finally:
            self._thread_lock.release()

    # --- overridden by the stores ----------------------------------------------------

    def _parse(self, section):
        """The section as the store uses it; raise ValueError/TypeError/KeyError if wrong."""
        if not isinstance(section, dict) or not all(isinstance(v, dict) for v in section.values()):
            raise TypeError(f'"{self.section}" is not a mapping of records')
        return section

    def _missing(self):
        """What a record that does not exist (yet) holds."""
        return self._parse({})

    def _recover(self):
        """What a damaged record is replaced with."""
        return self._parse({})

    # --- reading and writing ---------------------------------------------------------

    def _read(self):
        """The section (call with the record held); repairs a damaged file, see above."""
        try:
            if self.max_bytes is None:
                raw = self.path.read_bytes()
            else:
                raw = read_regular(self.path, self.max_bytes)
        except FileNotFoundError:
            return self._missing()
        except NotARecord as e:
            return self._damaged(str(e))
        except OSError as e:
            raise self.Error(
                f"{self.what} {self.path} cannot be read ({e.strerror or e}): give the hub's "
                "account read and write access to it (and to its folder), then try again."
            ) from e
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            data = self.kind.upgrade(data, self.path)
            if self.section not in data:
                raise KeyError(f'no "{self.section}" in it')
            return self._parse(data[self.section])
        except stateversion.NewerState as e:
            raise self.Error(f"{e}.") from e
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return self._damaged(_reason(e))

    def _damaged(self, reason: str):
        aside = move_aside(self.path)
        records = self._recover()
        self._write(records)
        self.log.error(
            "%s %s is damaged (%s); gpulab moved it to %s and started a new one: %s. To "
            "restore the old one instead, stop the hub, repair the moved file and move it "
            "back to %s.",
            self.what, self.path, reason, aside.name, self.on_damage, self.path.name,
        )  # fmt: skip
        return records

    def _dump(self, records) -> dict:
        return records

    def _write(self, records) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, self.kind.stamp({self.section: self._dump(records)}))

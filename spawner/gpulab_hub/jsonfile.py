"""Small JSON records on disk: read, and write atomically (temporary file, fsync, rename)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


def write_atomic(path: Path, data) -> None:
    """Write ``data`` as JSON to ``path`` so a reader sees the old or the new file, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)  # the rename itself, durable
    os.fsync(fd)
    os.close(fd)


class LockedRecord:
    """One JSON file ``{"version": 1, <section>: {...}}`` read and changed under a file lock
    (other hub processes) and a thread lock (this one); the base of small hub-side stores."""

    section = "items"

    def __init__(self, path: Path):
        from filelock import FileLock

        self.path = Path(path)
        self._file_lock = FileLock(str(self.path.with_name(self.path.name + ".lock")))
        self._thread_lock = threading.RLock()

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return data.get(self.section, {}) if isinstance(data, dict) else {}

    def _write(self, records: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, {"version": 1, self.section: records})

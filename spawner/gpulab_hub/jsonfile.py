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

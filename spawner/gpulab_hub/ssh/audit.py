"""The SSH gateway's session log: one JSON line per event, to a file and to stderr.

Events: ``connect``, ``auth`` (ok or not, the method, the key's fingerprint),
``refused`` (a session or forward the user may not have, and why), ``session-start``
and ``session-end`` (kind: shell, exec, sftp, forward; duration, exit status, bytes),
``revoked`` (an open connection closed because its access went) and ``disconnect``.
Never a password, a token, a command's text (only its length) or what flows through a
session. Every string is cut to :data:`MAX_STRING` characters and values are only
plain JSON scalars, so a line stays one line whatever a client sends.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO

MAX_STRING = 200
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def _value(v):
    if v is None or isinstance(v, bool | int | float):
        return v
    return str(v)[:MAX_STRING]


class Audit:
    """Appends events to ``path`` (made 0600; a link there is refused) and ``stream``."""

    def __init__(self, path: str | None, stream: IO[str] | None = None):
        self.path = path
        self.stream = stream
        self._fd: int | None = None
        self._broken = False

    def _file(self) -> int | None:
        if self._fd is None and self.path and not self._broken:
            try:
                self._fd = os.open(self.path, _FLAGS, 0o600)
            except OSError as e:
                self._broken = True
                self._say(f"gpulab-ssh: cannot write the session log {self.path}: {e}")
        return self._fd

    def _say(self, line: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):
            return

    def event(self, event: str, **fields) -> dict:
        """Log one event; returns the record (tests read it)."""
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event}
        record.update({k: _value(v) for k, v in fields.items()})
        line = json.dumps(record, ensure_ascii=True, separators=(",", ":"))
        self._say(line)
        fd = self._file()
        if fd is not None:
            try:
                os.write(fd, (line + "\n").encode("ascii"))
            except OSError as e:
                self._say(f"gpulab-ssh: cannot write the session log {self.path}: {e}")
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

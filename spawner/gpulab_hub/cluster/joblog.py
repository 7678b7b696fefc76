"""What a project's batch script tells the hub, read from the job's output file.

The script (batch.py) writes three kinds of lines, and only its own: the container's
output goes elsewhere, so a project cannot write one of them.

- ``gpulab-progress: <words>``: a step of the start, shown on the spawn page;
- ``gpulab-ready <address>:<port>``: the container's port, published on the node;
- ``gpulab: <words>``: why the job failed (lines starting ``gpulab:   `` quote the
  container's last output).

The file lives in a hub-owned folder on storage the nodes mount. It is read as the
hub reads any file a job could have touched: never through a link, only a regular
file, in bounded pieces, at most MAX_BYTES in all.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub.cluster import ClusterError
from gpulab_hub.cluster.batch import FAILURE, PROGRESS, READY
from gpulab_hub.images.project import plain_text

MAX_BYTES = 1 << 20  # of one job's output, in all
CHUNK = 64 << 10  # read at once
MAX_LINE = 600  # characters of one line kept (Docker's errors are long)
_READY = re.compile(re.escape(READY) + r" ([0-9.]{7,15}):([0-9]{1,5})")


@dataclass(frozen=True)
class Ready:
    address: str
    port: int


@dataclass(frozen=True)
class Said:
    """One line of the script: ``kind`` is "progress", "ready", "failure" or "other"."""

    kind: str
    text: str
    ready: Ready | None = None


def parse(line: str) -> Said:
    """One line of the job's output, as the hub takes it (full-match rules)."""
    line = plain_text(line).rstrip()[:MAX_LINE]
    m = _READY.fullmatch(line)
    if m:
        try:
            address = str(ipaddress.IPv4Address(m.group(1)))
        except ValueError:
            return Said("other", line)
        port = int(m.group(2))
        if 1 <= port <= 65535:
            return Said("ready", line, Ready(address, port))
        return Said("other", line)
    if line.startswith(PROGRESS + " "):
        return Said("progress", line[len(PROGRESS) + 1 :].strip())
    if line.startswith(FAILURE + " "):
        return Said("failure", line[len(FAILURE) + 1 :])
    return Said("other", line)


class JobLog:
    """The job's output file, read as it grows (each ``read`` gives the new lines)."""

    def __init__(self, path: Path, limit: int = MAX_BYTES):
        self.path = Path(path)
        self.limit = limit
        self.offset = 0
        self._partial = b""

    def read(self) -> list[Said]:
        """Blocking: the whole lines written since the last read (none while the file
        does not exist yet)."""
        if self.offset >= self.limit:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return []
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ClusterError(f"The job's output {self.path} is a link: not read") from e
            raise ClusterError(f"The job's output {self.path} cannot be read: {e.strerror}") from e
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ClusterError(f"The job's output {self.path} is not a regular file")
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = os.read(fd, min(CHUNK, self.limit - self.offset))
        finally:
            os.close(fd)
        self.offset += len(data)
        data = self._partial + data
        *whole, self._partial = data.split(b"\n")
        if self.offset >= self.limit and self._partial:
            whole.append(self._partial)  # the last piece it will read
            self._partial = b""
        return [parse(line.decode(errors="replace")) for line in whole]

    def read_all(self) -> list[Said]:
        """Blocking: every line not read yet, up to the limit (after the job ended)."""
        said: list[Said] = []
        while True:
            before = self.offset
            said += self.read()
            if self.offset == before:
                break
        if self._partial:  # a last line without its newline
            said.append(parse(self._partial.decode(errors="replace")))
            self._partial = b""
        return said

"""PID files that name a process, not only a number.

After a reboot (or a long time) the PID in a file may belong to an unrelated
process. gpulab records with the PID what makes the process itself: the boot it
runs in, its start time (field 22 of ``/proc/<pid>/stat``, clock ticks since
boot) and, for messages, its command line; it signals a recorded process only
while it is the same one (same boot, same start time).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpulab_hub import jsonfile


@dataclass(frozen=True)
class Identity:
    pid: int
    boot: str  # /proc/sys/kernel/random/boot_id
    start: int  # clock ticks after boot (set at fork: an exec keeps it)
    # what it runs, for messages: the kernel fills it in during exec, so a process read
    # right after it was started may show none yet; boot and start identify it
    cmdline: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        cmd = " ".join(self.cmdline) or "(no command line)"
        return f"process {self.pid} ({cmd[:120]}, started {self.started()})"

    def started(self) -> str:
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            uptime = float(Path("/proc/uptime").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return "at an unknown time"
        if boot != self.boot:
            return "before the last reboot"
        at = time.time() - uptime + self.start / os.sysconf("SC_CLK_TCK")
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def identity(pid: int, proc: Path = Path("/proc")) -> Identity | None:
    """The running process ``pid``, or None if there is none."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
        boot = (proc / "sys/kernel/random/boot_id").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields after
    # the last ")" start at field 3, so the start time (field 22) is the 20th of them.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie: it has exited, only its parent has not reaped it
        return None
    args = tuple(a.decode(errors="replace") for a in cmdline.split(b"\0") if a)
    return Identity(pid, boot, int(fields[19]), args)


def write(path: Path, pid: int) -> bool:
    """Record ``pid`` and what identifies it, atomically; False (nothing written) if
    it is no longer running."""
    me = identity(pid)
    for _ in range(50):  # a process just started: its command line, once exec is done
        if me is None or me.cmdline:
            break
        time.sleep(0.02)
        me = identity(pid)
    if me is None:
        return False
    record = asdict(me)
    record["cmdline"] = list(me.cmdline)
    jsonfile.write_atomic(path, record)
    return True


def read(path: Path) -> Identity | int | None:
    """What ``path`` records: an Identity, a bare PID (a file of older gpulab), or None."""
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    if text.isdigit():
        return int(text)
    try:
        r = json.loads(text)
        return Identity(int(r["pid"]), str(r["boot"]), int(r["start"]), tuple(r["cmdline"]))
    except (ValueError, KeyError, TypeError):
        return None


def check(path: Path, program: str) -> tuple[Identity | None, str]:
    """(the live process ``path`` names, "") or (None, why the file is stale; "" if there
    is no file). ``program`` is the name a bare PID's command line must show."""
    recorded = read(path)
    if recorded is None:
        stale = f"{path} cannot be read as a PID file" if Path(path).exists() else ""
        return None, stale
    pid = recorded if isinstance(recorded, int) else recorded.pid
    now = identity(pid)
    if now is None:
        return None, f"{path} names process {pid}, which is no longer running"
    if isinstance(recorded, int):
        if not any(Path(a).name.startswith(program) for a in now.cmdline[:3]):
            return None, f"{path} names {now.describe()}, which is not {program}"
        return now, ""
    if now != recorded:
        return None, (
            f"{path} names {recorded.describe()}; process {pid} is now another one: "
            f"{now.describe()}"
        )
    return now, ""


def children_by_parent(live_only: bool = False, proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """Every process's children, by parent PID, from /proc (``live_only``: zombies left
    out)."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if not (live_only and state == "Z"):
            children.setdefault(int(ppid), []).append(int(entry.name))
    return children

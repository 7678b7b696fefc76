"""The processes of this container that use its GPUs, and whose kernels they are.

The driver reports PIDs as the host's PID namespace numbers them; a container
started without ``--pid=host`` numbers its processes differently. So processes
are found from inside: every process whose open files include
``/dev/nvidia<minor>`` of one of this container's GPUs and ``/dev/nvidia-uvm``
(a CUDA context). They are matched to the driver's list per device:

1. the same PID, and that process holds the device: the server shares the
   host's PID namespace (a plain host, or ``--pid=host``), and the driver's
   lists are then the whole truth;
2. otherwise, when as many local processes as driver entries are left on a
   device, they are paired in PID order (both namespaces hand out PIDs in
   creation order); such a pairing is marked ``"order"``. A local process
   left unpaired is still listed, with its GPU memory unknown (None).

What is left of the driver's list is summed per device as "other processes":
how many and how much memory, nothing that names them (they may be another
tenant's). The server's own process (where the sampler runs) is never listed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

KERNEL_FILE = re.compile(r"kernel-([0-9a-fA-F-]{36})\.json")
NVIDIA_NODE = re.compile(r"^/dev/nvidia(\d+)$")
MAX_COMMAND = 300


@dataclass
class LocalProcess:
    pid: int
    ppid: int
    name: str
    command: str
    minors: set[int] = field(default_factory=set)
    uvm: bool = False
    ancestors: list[int] = field(default_factory=list)
    kernel_id: str | None = None  # from its own or an ancestor's command line


def _stat(proc: str, pid: int) -> tuple[str, int] | None:
    """(name, parent PID) from /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    left, right = raw.find("("), raw.rfind(")")
    fields = raw[right + 2 :].split()
    return raw[left + 1 : right], int(fields[1]) if len(fields) > 1 else 0


def _cmdline(proc: str, pid: int) -> str:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _nvidia_handles(proc: str, pid: int) -> tuple[set[int], bool]:
    """Minor numbers of /dev/nvidiaN the process has open, and whether it has nvidia-uvm."""
    minors: set[int] = set()
    uvm = False
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return minors, uvm  # gone, or not ours to read
    for fd in fds:
        try:
            target = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if not target.startswith("/dev/nvidia"):
            continue
        if target == "/dev/nvidia-uvm":
            uvm = True
        elif m := NVIDIA_NODE.match(target):
            minors.add(int(m[1]))
    return minors, uvm


def scan(proc: str = "/proc", exclude: set[int] | None = None) -> list[LocalProcess]:
    """Every visible process with a handle on an NVIDIA GPU device node."""
    exclude = {os.getpid()} if exclude is None else exclude
    found = []
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid in exclude:
            continue
        minors, uvm = _nvidia_handles(proc, pid)
        if not minors and not uvm:
            continue
        stat = _stat(proc, pid)
        if stat is None:
            continue
        found.append(LocalProcess(pid, stat[1], stat[0], _cmdline(proc, pid), minors, uvm))
    for p in found:
        _trace_ancestry(proc, p)
    return found


def _trace_ancestry(proc: str, p: LocalProcess, depth: int = 32) -> None:
    """Parent chain and the kernel (from a ``kernel-<id>.json`` argument) it runs under."""
    m = KERNEL_FILE.search(p.command)
    p.kernel_id = m[1] if m else None
    pid = p.ppid
    while pid > 1 and len(p.ancestors) < depth:
        p.ancestors.append(pid)
        if p.kernel_id is None and (m := KERNEL_FILE.search(_cmdline(proc, pid))):
            p.kernel_id = m[1]
        stat = _stat(proc, pid)
        if stat is None:
            break
        pid = stat[1]
    p.command = p.command[:MAX_COMMAND]


def attribute(
    local: list[LocalProcess],
    driver: dict[str, list[tuple[int, int | None]]],
    minors: dict[str, int | None],
) -> tuple[list[dict], list[dict]]:
    """Match the driver's per-device lists to local processes.

    ``driver`` maps a device UUID to (driver PID, bytes or None) pairs,
    ``minors`` a device UUID to its /dev/nvidia minor number. Returns
    (rows for local processes, "other processes" per device).
    """
    rows: dict[int, dict] = {}
    others = []

    def use(p: LocalProcess, uuid: str, used, how: str | None, driver_pid=None) -> None:
        row = rows.setdefault(p.pid, _row(p))
        row["gpus"].append({"uuid": uuid, "memory_used": used, "match": how})
        if driver_pid is not None and driver_pid != p.pid:
            row["driver_pid"] = driver_pid

    pending = []
    for uuid, entries in driver.items():
        minor = minors.get(uuid)
        cands = {p.pid: p for p in local if p.uvm and (minor is None or minor in p.minors)}
        left = []
        for dpid, used in entries:
            if dpid in cands:
                use(cands.pop(dpid), uuid, used, "pid")
            else:
                left.append((dpid, used))
        pending.append((uuid, cands, left))
    # One PID that matched means the driver's PIDs are ours: its lists are then the
    # whole truth, and a local process missing from a device's list holds nothing there.
    shared_namespace = bool(rows)
    for uuid, cands, left in pending:
        if not shared_namespace and left and len(left) == len(cands):
            for (dpid, used), pid in zip(sorted(left), sorted(cands), strict=True):
                use(cands[pid], uuid, used, "order", dpid)
            cands, left = {}, []
        for p in cands.values():
            if not shared_namespace:
                use(p, uuid, None, None)
        if left:
            known = [u for _, u in left if u is not None]
            others.append(
                {"uuid": uuid, "count": len(left), "memory_used": sum(known) if known else None}
            )
    return sorted(rows.values(), key=lambda r: r["pid"]), others


def _row(p: LocalProcess) -> dict:
    return {
        "pid": p.pid,
        "name": p.name,
        "command": p.command,
        "kernel_id": p.kernel_id,
        "ancestors": p.ancestors,
        "gpus": [],
    }

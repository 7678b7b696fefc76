"""Processes of the test cluster (tests/cluster_kit.py): finding them by parent, by
command line and by namespace, and ending them. Used by the kit and its tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpulab_hub import pidfile


def is_nsfs(path: Path) -> bool:
    """True if ``path`` is a namespace bind-mounted by unshare (a mount point)."""
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == str(path) for line in f)
    except OSError:
        return False


def with_descendants(pids: list[int]) -> list[int]:
    children = pidfile.children_by_parent()
    found, todo = set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child != os.getpid():
                found.add(child)
                todo.append(child)
    return sorted(found)


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def daemons_left(kit) -> list[str]:
    """Live (non-zombie) processes whose command line names the kit's folder, as
    ``pgrep -a -f`` prints them."""
    done = subprocess.run(["pgrep", "-a", "-f", str(kit.root)], capture_output=True, text=True)
    return [
        line
        for line in done.stdout.splitlines()
        if pidfile.identity(int(line.split()[0])) is not None
    ]


def batch_script_pid(cluster, job_id: int) -> int | None:
    """The PID of a running job's batch script on its node (None until it runs)."""
    script = f"/job{job_id:05d}/slurm_script".encode()
    root = str(cluster.root).encode()
    for p in Path("/proc").iterdir():
        cmd = cmdline(p) if p.name.isdigit() else b""
        if script in cmd and root in cmd:
            return int(p.name)
    return None


def cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def in_mount_namespace(inode: int) -> list[int]:
    """PIDs of the processes in the mount namespace of that inode."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.stat(p / "ns" / "mnt").st_ino == inode:
                found.append(int(p.name))
        except OSError:
            continue
    return found

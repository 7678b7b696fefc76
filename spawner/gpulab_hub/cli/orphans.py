"""What a hub that fails to start leaves behind, and how `gpulab up` stops it.

JupyterHub starts its proxy (configurable-http-proxy) and its managed services (the
SSH gateway, Caddy, the GPU keeper, the idle culler) each in a session of its own, and
stops them only once it is running: a hub that exits before then (its port taken, a
service that does not come up, a SIGTERM from `gpulab up` that gave up waiting) leaves
them running, holding their ports, and the next `gpulab up` fails on them.

So `gpulab up` makes itself the *subreaper* of what it starts (Linux's
``PR_SET_CHILD_SUBREAPER``): whatever the hub leaves orphaned becomes a child of
`gpulab up` instead of init's, and a failed start stops each of them. What was already
its child before the hub started (a dockerd it started) is kept.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from urllib.parse import urlsplit

from gpulab_hub import host, pidfile

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of this process's descendants become its children (False where the
    kernel says no; then a failed start may leave the proxy, as before)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def children(pid: int | None = None) -> set[int]:
    """The live children of ``pid`` (this process by default), from /proc."""
    pid = os.getpid() if pid is None else pid
    return set(pidfile.children_by_parent(live_only=True).get(pid, ()))


def stop_left_behind(keep: set[int]) -> list[str]:
    """Stops every child of this process but ``keep`` (SIGTERM, then SIGKILL), then
    the orphans that leaves; returns what was stopped, described."""
    stopped: list[str] = []
    for _ in range(5):  # a stopped child's own children become ours in turn
        left = children() - keep
        if not left:
            break
        stopped += _stop(sorted(left))
        _reap()
    return stopped


def stop_left_proxy(hub_dir: Path) -> str:
    """Stops the proxy JupyterHub's PID file names, if it still runs without its hub
    (a hub killed outright never stops it); returns what was stopped, described."""
    proxy, _ = pidfile.check(hub_dir / PROXY_PIDFILE, "configurable-http-proxy")
    if proxy is None or not host.stop_pid(proxy.pid, expect=proxy):
        return ""
    (hub_dir / PROXY_PIDFILE).unlink(missing_ok=True)
    return proxy.describe()


def stop_left_services(hub_port: int) -> list[str]:
    """Stops the services a hub on ``hub_port`` started and left running (a hub killed
    outright never stops them). A service is known by the environment JupyterHub gives
    it: JUPYTERHUB_SERVICE_NAME, and JUPYTERHUB_API_URL on the hub's port."""
    return _stop(services_of(hub_port))


def services_of(hub_port: int) -> list[int]:
    """PIDs of the live services of a hub on ``hub_port`` (stop_left_services)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(entry / "environ", "rb") as f:
                environ = f.read(MAX_ENVIRON_BYTES).split(b"\0")
        except OSError:  # gone, or another user's
            continue
        named = any(v.startswith(b"JUPYTERHUB_SERVICE_NAME=") for v in environ)
        api = [v for v in environ if v.startswith(b"JUPYTERHUB_API_URL=")]
        if (
            named
            and api
            and urlsplit(api[0].split(b"=", 1)[1].decode(errors="replace")).port == hub_port
        ):
            found.append(int(entry.name))
    return found


MAX_ENVIRON_BYTES = 1 << 20

# JupyterHub's ConfigurableHTTPProxy.pid_file, relative to the hub's folder (its cwd)
PROXY_PIDFILE = "jupyterhub-proxy.pid"


def _stop(pids: list[int]) -> list[str]:
    """Stops each of ``pids`` that still runs (SIGTERM, then SIGKILL); what was stopped,
    described."""
    stopped = []
    for pid in pids:
        me = pidfile.identity(pid)
        if me is not None and host.stop_pid(pid, timeout=10, expect=me):
            stopped.append(me.describe())
    return stopped


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

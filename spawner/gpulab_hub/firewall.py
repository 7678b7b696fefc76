"""What containers may reach of the host itself: gpulab's iptables rules.

Docker keeps containers of different networks apart and NATs them out, but a
container can still open a connection to any address of the host (its bridge's
gateway, the host's own address), so every host service listening on 0.0.0.0
answers every project and every build. gpulab's chain in the INPUT table
(``GPULAB-INPUT``, first in INPUT) answers that:

- replies to connections the host opened (the hub and the proxy reaching a
  project) pass;
- a build's network (bridge interfaces ``gpb<hex>``, one per build, images.build)
  reaches nothing of the host;
- the projects' network reaches the hub's API port only (``GPULAB-<bridge>``: a
  RETURN per hub port, first, then DROP; ``gpulab down`` takes its port's rule
  away, so two hubs on one network, as in tests, each keep theirs).

Re-runnable: every rule is checked (``iptables -C``) before it is added.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading

CHAIN = "GPULAB-INPUT"
BUILD_IFACE_PREFIX = "gpb"
BUILD_IFACES = BUILD_IFACE_PREFIX + "+"  # iptables' wildcard: every build bridge
_IFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
_lock = threading.Lock()
_builds_done = False


class FirewallError(Exception):
    """The rules could not be set; the message says what to do."""


def _iptables(*args: str, check: bool = True) -> bool:
    exe = shutil.which("iptables")
    if not exe:
        raise FirewallError(
            "iptables is not installed: gpulab needs it to keep projects and builds away from "
            "the host's own services (apt-get install iptables)."
        )
    done = subprocess.run([exe, "-w", "5", *args], capture_output=True, text=True)
    if done.returncode != 0 and check:
        raise FirewallError(f"iptables {' '.join(args)} failed: {done.stderr.strip()}")
    return done.returncode == 0


def _ensure_chain(name: str) -> None:
    if not _iptables("-n", "-L", name, check=False):
        _iptables("-N", name)


def _ensure_rule(chain: str, *rule: str, first: bool = False) -> None:
    if not _iptables("-C", chain, *rule, check=False):
        _iptables(*(("-I", chain, "1") if first else ("-A", chain)), *rule)


def ensure_base() -> None:
    """gpulab's chain, first in INPUT: replies pass, build networks reach nothing."""
    _ensure_chain(CHAIN)
    _ensure_rule("INPUT", "-j", CHAIN, first=True)
    _ensure_rule(CHAIN, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN")
    _ensure_rule(CHAIN, "-i", BUILD_IFACES, "-j", "DROP")


def ensure_builds() -> None:
    """ensure_base, once per process (each build asks; the first one sets it)."""
    global _builds_done
    with _lock:
        if not _builds_done:
            ensure_base()
            _builds_done = True


def check_iface(name: str) -> str:
    if not _IFACE.fullmatch(name or ""):
        raise FirewallError(f"Not a network interface name: {name!r}")
    return name


def ensure_projects(bridge: str, hub_port: int) -> None:
    """The projects' network (bridge interface ``bridge``) reaches the hub's port only."""
    check_iface(bridge)
    if not 0 < int(hub_port) < 65536:
        raise FirewallError(f"Not a port: {hub_port!r}")
    ensure_base()
    sub = _projects_chain(bridge)
    _ensure_chain(sub)
    _ensure_rule(sub, *_port_rule(hub_port), first=True)
    _ensure_rule(sub, "-j", "DROP")  # appended once: the ports' rules go before it
    _ensure_rule(CHAIN, "-i", bridge, "-j", sub)


def forget_projects_port(bridge: str, hub_port: int) -> None:
    """``gpulab down``: the hub's port is no longer open to the projects' network."""
    check_iface(bridge)
    sub = _projects_chain(bridge)
    while _iptables("-C", sub, *_port_rule(hub_port), check=False):
        _iptables("-D", sub, *_port_rule(hub_port))


def _projects_chain(bridge: str) -> str:
    return f"GPULAB-{bridge}"[:28]


def _port_rule(hub_port: int) -> tuple[str, ...]:
    if not 0 < int(hub_port) < 65536:
        raise FirewallError(f"Not a port: {hub_port!r}")
    return ("-p", "tcp", "--dport", str(int(hub_port)), "-j", "RETURN")


def bridge_of(network: dict) -> str:
    """The host interface of a Docker bridge network (from ``docker network inspect``)."""
    name = (network.get("Options") or {}).get("com.docker.network.bridge.name")
    return check_iface(name or "br-" + network["Id"][:12])

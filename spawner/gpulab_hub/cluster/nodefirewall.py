"""The hub's machine keeps its builds off the cluster's nodes: gpulab's iptables rules
in Docker's ``DOCKER-USER`` chain (FORWARD), one per node address.

A project's server on a node answers only the addresses the hub connects from
(gpulab_jupyter.hubpeers). A build step on the hub's machine leaves it NATed to that
same address, so without these rules a ``RUN`` line could reach any project's
published port as if it were the hub. Each rule drops what a build bridge (``gpb+``,
gpulab_hub.firewall) sends to one node address; builds still reach package indexes and
everything else off the cluster. Re-runnable: each rule is checked before it is added.
"""

from __future__ import annotations

import ipaddress
import threading

from gpulab_hub import firewall
from gpulab_hub.cluster import ClusterError

CHAIN = "DOCKER-USER"
_lock = threading.Lock()
_done: set[str] = set()


def rule(address: str) -> tuple[str, ...]:
    """The rule for one node address (IPv4, checked)."""
    node = str(ipaddress.IPv4Address(address))
    return ("-i", firewall.BUILD_IFACES, "-d", f"{node}/32", "-j", "DROP")


def keep_builds_off(addresses) -> None:
    """Blocking: builds on this machine reach none of ``addresses`` (the nodes')."""
    with _lock:
        todo = sorted({str(ipaddress.IPv4Address(a)) for a in addresses} - _done)
        try:
            for address in todo:
                firewall._ensure_rule(CHAIN, *rule(address), first=True)
                _done.add(address)
        except firewall.FirewallError as e:
            raise ClusterError(
                "The hub could not keep image builds away from the cluster's nodes "
                f"({e}), so a build could reach other projects as the hub. Ask the "
                "administrator: the hub needs iptables and Docker's DOCKER-USER chain "
                "(docs/cluster.md)."
            ) from e


def remove(addresses) -> None:
    """Blocking: the rules of ``addresses`` gone (for tests and ``gpulab down``)."""
    with _lock:
        for address in addresses:
            while firewall._iptables("-D", CHAIN, *rule(address), check=False):
                pass
            _done.discard(str(ipaddress.IPv4Address(address)))

"""Only the hub reaches this server: a project's server on a Slurm node answers the
addresses the hub (and its proxy) connect from, and no one else.

On a cluster the project's port is published on the node's cluster address, where
every other host of the cluster network, other projects' containers among them, can
connect. The hub's spawner names the addresses it connects from in
``GPULAB_HUB_PEERS`` (comma-separated IPv4 addresses); with it set, every request
whose TCP peer is neither one of them nor this container's own loopback is answered
403 before any handler, page or websocket sees it: no login redirect, no version, no
static file. The peer is the socket's own address (``request.connection.context
.address``), never ``X-Forwarded-For``/``X-Real-Ip``, which a client writes itself.
Without the variable (one machine: the hub reaches the server on its own bridge,
where traffic between containers is off) nothing changes. A value that is not a list
of addresses lets loopback only: the server refuses rather than trusting anyone.

Why an address check holds: project containers have no ``NET_RAW`` (no raw sockets,
no spoofed source), and a TCP connection needs the answer to reach its source, so a
container cannot connect as the hub's address. What shares the hub's address on
the hub's machine (its builds, NATed out) is kept off the nodes by the hub's
firewall (gpulab_hub.cluster.nodefirewall).
"""

from __future__ import annotations

import ipaddress

from tornado import web
from tornado.routing import Matcher, Rule

from gpulab_contract import environment

ENV = environment.HUB_PEERS
REFUSED = (
    "This project's server answers only the gpulab hub. Open the project from the "
    "hub's home page.\n"
)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


def allowed_peers(value: str | None) -> frozenset[str] | None:
    """The hub's addresses from ``GPULAB_HUB_PEERS``; None where it is unset (no
    check); an empty set (loopback only) where it holds anything but IPv4 addresses."""
    if value is None:
        return None
    peers = set()
    for part in value.split(","):
        try:
            peers.add(str(ipaddress.IPv4Address(part.strip())))
        except ValueError:
            return frozenset()
    return frozenset(peers)


def peer_allowed(address, peers: frozenset[str]) -> bool:
    """Whether a socket peer (``(host, port, ...)``; "" for a unix socket) may talk."""
    host = address[0] if isinstance(address, tuple) and address else ""
    if not isinstance(host, str) or not host:
        return False
    ip = _ip(host)
    return ip is not None and (ip.is_loopback or str(ip) in peers)


class _NotFromHub(Matcher):
    """Matches every request whose TCP peer is not the hub's."""

    def __init__(self, peers: frozenset[str]):
        self.peers = peers

    def match(self, request):
        context = getattr(request.connection, "context", None)
        address = getattr(context, "address", None)
        return None if peer_allowed(address, self.peers) else {}


class RefusedHandler(web.RequestHandler):
    """403 for every method, in the user's words; nothing of the server behind it."""

    def prepare(self):
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(REFUSED)


def only_hub_peers(web_app: web.Application, env=None, log=None) -> frozenset[str] | None:
    """Put the peer check first among ``web_app``'s routes (routes added later go
    after it) where ``GPULAB_HUB_PEERS`` is set; the peers, or None (no check)."""
    value = environment.read(env).hub_peers
    peers = allowed_peers(value)
    if peers is None:
        return None
    web_app.default_router.rules.insert(0, Rule(_NotFromHub(peers), RefusedHandler))
    if log is not None:
        if peers:
            log.info("gpulab: this server answers only the hub (%s)", ", ".join(sorted(peers)))
        else:
            log.error("gpulab: %s=%r holds no address; only loopback may connect", ENV, value)
    return peers

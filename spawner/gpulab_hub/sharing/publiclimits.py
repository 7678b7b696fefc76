"""Views of public notebook links per client address: who the client is, and how many.

**Who.** Behind JupyterHub, every request reaches the hub from its proxy
(configurable-http-proxy, started by the hub on the same host), which appends the
address it saw to ``X-Forwarded-For``. So:

- the TCP peer is the client, unless it is this host (the proxy: loopback, or any
  address this host has, checked by binding a socket to it) or one of
  ``JupyterHub.trusted_downstream_ips``;
- then ``X-Forwarded-For`` is read from its right end, skipping the addresses
  in ``JupyterHub.trusted_downstream_ips`` (JupyterHub's own rule); the first other
  entry is the client. Entries to its left are whatever the client sent: ignored.
- ``X-Real-Ip`` is never believed. (Tornado, and so JupyterHub's ``remote_ip``,
  takes it as it comes; the proxy passes it on from the client.)

A project container that calls the hub's port itself is its own peer and is
counted by its address, whatever headers it sends. IPv6 clients count per /64
network (one host may hold a whole /64).

**How many.** A token bucket per address: a burst of N views, then one every 60/N s.
At most MAX_ADDRESSES buckets are kept (least recently seen dropped first).
"""

from __future__ import annotations

import functools
import ipaddress
import math
import socket
import time
from collections import OrderedDict
from collections.abc import Iterable

MAX_ADDRESSES = 100_000

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _ip(text: str | None):
    """An address (IPv4-mapped IPv6 as IPv4), or None."""
    try:
        ip = ipaddress.ip_address((text or "").strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def trusted_networks(entries: Iterable[str]) -> list[Network]:
    """``JupyterHub.trusted_downstream_ips`` as networks (single addresses or CIDR)."""
    nets = []
    for entry in entries:
        try:
            nets.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            continue
    return nets


def _in(ip, nets: list[Network]) -> bool:
    return any(ip.version == net.version and ip in net for net in nets)


@functools.lru_cache(maxsize=1024)
def is_this_host(ip) -> bool:
    """Whether ``ip`` is an address of this host (its proxy connects from one of them:
    loopback, or the host's own address the kernel picks to reach the hub's bridge
    address). A socket can be bound only to an address the host has."""
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
        return True
    except OSError:
        return False


def _key(ip) -> str:
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def client_address(request, trusted: list[Network]) -> str:
    """The client of a tornado ``request`` as the rate limit counts it (see above)."""
    address = getattr(request.connection.context, "address", None)
    peer = _ip(address[0]) if isinstance(address, tuple) and address else None
    if peer is None:
        return "unix-socket"  # only the hub's own host can reach a socket file
    if not (is_this_host(peer) or _in(peer, trusted)):
        return _key(peer)
    client = peer
    forwarded = ",".join(request.headers.get_list("X-Forwarded-For"))
    for entry in reversed(forwarded.split(",") if forwarded else []):
        ip = _ip(entry)
        if ip is None:
            break  # not an address: what trusted hops passed on ends here
        client = ip
        if not _in(ip, trusted):
            break
    return _key(client)


class RateLimiter:
    """Views per minute per key (a token bucket each; event loop only)."""

    def __init__(self, per_minute: int, max_keys: int = MAX_ADDRESSES, clock=time.monotonic):
        self.per_minute, self.max_keys, self.clock = per_minute, max_keys, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> int:
        """0 when ``key`` may have one more view now (and counts it), else the whole
        seconds until it may."""
        if self.per_minute <= 0:
            return 0
        now, rate = self.clock(), self.per_minute / 60.0
        tokens, then = self._buckets.pop(key, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - then) * rate)
        if tokens >= 1.0:
            tokens -= 1.0
            wait = 0
        else:
            wait = max(1, math.ceil((1.0 - tokens) / rate))
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait

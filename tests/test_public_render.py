"""Bounds on anonymous views of public notebook links, without a hub: the render
process's time limit, coalescing and the cache, the size limit, the per-address
rate limit and who "the client" is behind JupyterHub's proxy. The same bounds are
exercised through a real hub in test_public_links.py."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from tornado.httputil import HTTPHeaders

from gpulab_hub.sharing import publiclimits, publicrender
from gpulab_hub.sharing.publiclimits import RateLimiter, client_address, trusted_networks
from gpulab_hub.sharing.publicrender import (
    GpulabPublicLinks,
    PublicRenders,
    RenderCache,
    Rendered,
    TooLarge,
)

OWNER, PROJECT = "alice", "one"


def notebook(cells: int, words: str = "cell text") -> bytes:
    cell = {
        "cell_type": "code",
        "metadata": {},
        "execution_count": 1,
        "source": "for k in range(10):\n    print(k)\n",
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "output line\n" * 5}],
    }
    body = [{"cell_type": "markdown", "metadata": {}, "source": f"# {words}"}]
    body += [{**cell, "id": f"c{i}"} for i in range(cells)]
    nb = {"cells": body, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb).encode()


def renderers() -> list[str]:
    """Render processes on this machine (their pids), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"nbrender.py" in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            continue  # gone meanwhile
    return found


@pytest.fixture
def root(tmp_path):
    (tmp_path / OWNER / PROJECT).mkdir(parents=True)
    return tmp_path


def link(path: str):
    return SimpleNamespace(owner=OWNER, project=PROJECT, path=path)


def test_a_render_that_runs_over_its_time_is_killed():
    limits = GpulabPublicLinks(render_timeout_s=1)
    started = time.monotonic()
    result = asyncio.run(publicrender.render_in_process(notebook(400), limits))
    took = time.monotonic() - started
    assert result == Rendered(failure="slow")
    assert took < 2.5, took  # stopped at its limit, not when nbconvert was done (~4 s)
    assert renderers() == []  # the process is gone, not left running


def test_render_gives_sanitized_html_or_says_not_a_notebook():
    limits = GpulabPublicLinks()
    got = asyncio.run(publicrender.render_in_process(notebook(1, "Hello 4711"), limits))
    assert got.failure == "" and "Hello 4711" in got.html and "<script" not in got.html
    bad = asyncio.run(publicrender.render_in_process(b'{"cells": 7}', limits))
    assert bad == Rendered(failure="invalid")
    assert asyncio.run(publicrender.render_in_process(b"\xff" * 50, limits)).failure == "invalid"


def test_views_of_one_version_share_one_render_then_hit_the_cache(root):
    nb = root / OWNER / PROJECT / "a.ipynb"
    nb.write_bytes(notebook(20, "First words"))

    async def views(renders, n):
        return await asyncio.gather(*(renders.page(root, link("a.ipynb")) for _ in range(n)))

    async def scenario():
        renders = PublicRenders(GpulabPublicLinks())
        first = await views(renders, 10)
        again = await views(renders, 3)
        nb.write_bytes(notebook(20, "Second words"))  # a new version renders once more
        changed = await views(renders, 3)
        return renders, first, again, changed

    renders, first, again, changed = asyncio.run(scenario())
    assert sorted(how for _, _, how in first) == ["miss"] + ["shared"] * 9
    assert all("First words" in r.html for _, r, _ in first)
    assert [how for _, _, how in again] == ["hit"] * 3
    assert sorted(how for _, _, how in changed) == ["miss", "shared", "shared"]
    assert all("Second words" in r.html for _, r, _ in changed)
    assert renders.renders == 2 and len(renders.cache) == 1  # the old version dropped


def test_a_notebook_over_the_limit_is_not_read(root):
    nb = root / OWNER / PROJECT / "big.ipynb"
    with nb.open("wb") as f:
        f.truncate(11 * 2**20)  # sparse: 11 MiB that take no time to read, if read
    renders = PublicRenders(GpulabPublicLinks(max_notebook_mib=10))
    started = time.monotonic()
    with pytest.raises(TooLarge) as err:
        asyncio.run(renders.page(root, link("big.ipynb")))
    assert err.value.size == 11 * 2**20 and renders.renders == 0
    assert time.monotonic() - started < 0.5


def test_the_cache_is_bounded_in_bytes_and_entries():
    page = Rendered(html="x" * 100_000)
    cache = RenderCache(max_bytes=1_000_000, max_entries=5)
    for i in range(8):
        cache.put(("o", "p", f"{i}.ipynb", 0, i, 1, 1, 1), page)
    assert len(cache) == 5 and cache.get(("o", "p", "0.ipynb", 0, 0, 1, 1, 1)) is None
    cache = RenderCache(max_bytes=350_000, max_entries=100)
    for i in range(8):
        cache.put(("o", "p", f"{i}.ipynb", 0, i, 1, 1, 1), Rendered(html="x" * 80_000))
    assert cache.bytes <= 350_000 and len(cache) == 4
    cache.put(("o", "p", "huge.ipynb", 0, 99, 1, 1, 1), Rendered(html="x" * 100_000))
    assert cache.get(("o", "p", "huge.ipynb", 0, 99, 1, 1, 1)) is None  # over a quarter


def test_rate_limit_per_key_with_retry_after():
    now = [1000.0]
    limiter = RateLimiter(30, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(30)] == [0] * 30
    assert limiter.take("a") == 2  # one view every 2 s once the burst is spent
    assert limiter.take("b") == 0  # another address is counted apart
    now[0] += 2.0
    assert limiter.take("a") == 0 and limiter.take("a") == 2
    assert RateLimiter(0).take("a") == 0  # 0: no limit
    small = RateLimiter(1, max_keys=3, clock=lambda: now[0])
    for key in "wxyz":
        small.take(key)
    assert len(small._buckets) == 3  # bounded


def request(peer, headers=()):
    return SimpleNamespace(
        connection=SimpleNamespace(context=SimpleNamespace(address=(peer, 40000))),
        headers=HTTPHeaders(list(headers)),
    )


def host_address() -> str:
    """An address of this host that is not loopback (the one it reaches others from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source
        return s.getsockname()[0]


def test_client_address_is_what_the_proxy_saw():
    none = trusted_networks([])
    # Through the hub's proxy on this host: the last X-Forwarded-For entry (the proxy's).
    via_proxy = request("127.0.0.1", [("X-Forwarded-For", "9.9.9.9, 203.0.113.7")])
    assert client_address(via_proxy, none) == "203.0.113.7"
    # What the client adds itself, and X-Real-Ip, change nothing.
    forged = request(
        "127.0.0.1",
        [("X-Forwarded-For", "1.1.1.1"), ("X-Forwarded-For", "203.0.113.7")]
        + [("X-Real-Ip", "8.8.8.8")],
    )
    assert client_address(forged, none) == "203.0.113.7"
    # The proxy connecting from another address of this host (to the hub's bridge
    # address, the kernel may pick the host's own) is the proxy too.
    here = host_address()
    assert not ipaddress.ip_address(here).is_loopback
    other = request(here, [("X-Forwarded-For", "203.0.113.7")])
    assert client_address(other, none) == "203.0.113.7"
    # A container calling the hub's port itself: its own address, whatever it sends.
    direct = request("172.31.254.5", [("X-Forwarded-For", "203.0.113.9")])
    assert client_address(direct, none) == "172.31.254.5"
    # A TLS proxy in front, named in JupyterHub.trusted_downstream_ips, is skipped.
    front = request("127.0.0.1", [("X-Forwarded-For", "6.6.6.6, 198.51.100.4, 10.0.0.2")])
    assert client_address(front, trusted_networks(["10.0.0.2"])) == "198.51.100.4"
    assert client_address(front, none) == "10.0.0.2"
    # IPv6 per /64; IPv4-mapped IPv6 as IPv4; no header: the peer.
    v6 = request("::1", [("X-Forwarded-For", "2001:db8:1:2:aaaa::1")])
    assert client_address(v6, none) == "2001:db8:1:2::/64"
    mapped = request("::ffff:127.0.0.1", [("X-Forwarded-For", "::ffff:203.0.113.7")])
    assert client_address(mapped, none) == "203.0.113.7"
    assert client_address(request("127.0.0.1"), none) == "127.0.0.1"
    assert publiclimits.MAX_ADDRESSES >= 10_000

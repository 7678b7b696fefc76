"""A project's server on a Slurm node answers the hub's addresses only
(gpulab_jupyter.hubpeers, issue 23): a real Jupyter server with gpulab's extension,
reached from this machine's own non-loopback address, as a container on another node
would reach the published port.

- With ``GPULAB_HUB_PEERS`` naming another address, every request from here is
  refused (403, in the user's words) before any page, API, login redirect or
  websocket answers, even with the server's token and with ``X-Forwarded-For`` /
  ``X-Real-Ip`` naming the hub; the container's own loopback still answers.
- With ``GPULAB_HUB_PEERS`` naming this address, the same requests answer as usual.
- A value that is not a list of addresses lets loopback only.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import time

import pytest

from gpulab_jupyter import hubpeers

TOKEN = "hubpeers-test-token"
FAR = "10.255.255.1"  # the hub, somewhere this machine is not


def _own_address() -> str:
    """This machine's address on its default route (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.254", 9))
        address = s.getsockname()[0]
    assert not address.startswith("127."), "this machine has no non-loopback address"
    return address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _get(host: str, port: int, path: str, source: str, headers=None):
    conn = http.client.HTTPConnection(host, port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Authorization": f"token {TOKEN}", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read(65536).decode("utf-8", "replace")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def own():
    return _own_address()


def _server(tmp_path, peers: str | None):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env.pop(hubpeers.ENV, None)
    if peers is not None:
        env[hubpeers.ENV] = peers
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=0.0.0.0",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={tmp_path}",
         "--ServerApp.trust_xheaders=True", "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        try:
            if _get("127.0.0.1", port, "/api/status", "127.0.0.1")[0] == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the Jupyter server did not answer within 60 s")


@contextlib.contextmanager
def running(tmp_path, peers: str | None):
    """A Jupyter server with gpulab's extension on 0.0.0.0 (its port)."""
    proc, port = _server(tmp_path, peers)
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


PATHS = ["/api/status", "/api/kernels", "/lab", "/login", "/api/kernels/x/channels",
         "/api/gpulab/v1/gpus", "/static/favicons/favicon.ico"]  # fmt: skip
SPOOFED = {"X-Forwarded-For": FAR, "X-Real-Ip": FAR, "X-Forwarded-Proto": "http"}


def test_a_stranger_is_refused_everything_and_loopback_is_not(tmp_path, own):
    with running(tmp_path, FAR) as port:
        for path in PATHS:
            assert _get(own, port, path, own) == (403, hubpeers.REFUSED), path
        assert _get(own, port, "/api/status", own, SPOOFED) == (403, hubpeers.REFUSED)
        status, body = _get("127.0.0.1", port, "/api/status", "127.0.0.1")
        assert status == 200 and '"started"' in body


def test_the_hubs_address_is_answered(tmp_path, own):
    with running(tmp_path, f"192.0.2.77, {own}") as port:
        status, body = _get(own, port, "/api/status", own)
        assert status == 200 and '"started"' in body
        status, body = _get(own, port, "/api/kernels", own)
        assert (status, body.strip()) == (200, "[]")
        assert _get(own, port, "/lab", own)[1] != hubpeers.REFUSED


def test_a_value_that_is_no_address_list_lets_loopback_only(tmp_path, own):
    with running(tmp_path, f"{own}; rm -rf /") as port:
        assert _get(own, port, "/api/status", own) == (403, hubpeers.REFUSED)
        assert _get("127.0.0.1", port, "/api/status", "127.0.0.1")[0] == 200


def test_without_the_variable_nothing_changes(tmp_path, own):
    """One machine: the hub reaches the server on its own bridge; no check."""
    with running(tmp_path, None) as port:
        assert _get(own, port, "/api/status", own)[0] == 200


def test_peer_addresses_are_read_by_full_match():
    assert hubpeers.allowed_peers(None) is None
    assert hubpeers.allowed_peers("10.1.0.1, 10.1.0.2") == {"10.1.0.1", "10.1.0.2"}
    for bad in ("", "10.1.0.1 10.1.0.2", "10.1.0.0/24", "hub", "10.1.0.1,", "::1"):
        assert hubpeers.allowed_peers(bad) == frozenset(), bad
    peers = frozenset({"10.1.0.1"})
    assert hubpeers.peer_allowed(("10.1.0.1", 5), peers)
    assert hubpeers.peer_allowed(("::ffff:10.1.0.1", 5, 0, 0), peers)
    assert hubpeers.peer_allowed(("127.0.0.1", 5), peers)
    assert hubpeers.peer_allowed(("::1", 5, 0, 0), peers)
    assert not hubpeers.peer_allowed(("10.1.0.2", 5), peers)
    assert not hubpeers.peer_allowed("", peers)  # a unix socket: no address
    assert not hubpeers.peer_allowed(None, peers)

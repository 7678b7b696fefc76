#!/usr/bin/python3
"""Debian's Chromium in a network namespace of its own, as a person's browser is on a
machine of its own: it sees no network interface come or go on the Docker host.

Chromium drops every connection it is opening (``net::ERR_NETWORK_CHANGED``) whenever an
address on any interface comes or goes, and Docker makes one for every container it
starts and stops (the host side's IPv6 link-local address) and every network. With two
test workers, the other worker's containers made browser tests fail at random: a form's
POST, a page's fetch, a navigation. In its own namespace Chromium sees only a loopback and
a still veth pair (so it counts itself online), and reaches everything on the host
through a SOCKS4 relay: a listener in Chromium's namespace, whose connections are made in
the host's namespace. Chromium still resolves names itself (``*.localhost``, its
``--host-resolver-rules``, /etc/hosts), as before.

Playwright launches this file as the browser's executable (browser_kit.CHROMIUM). The
process execs Chromium with the same arguments and pipes, plus the proxy's two flags;
the relay is a child that dies with it. Needs root (CAP_SYS_ADMIN), as the Docker tests do.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading

BINARY = "/usr/bin/chromium"
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
LINK, PEER, LINK_ADDRESS = "gpulab0", "gpulab1", "10.254.254.1/30"
SOCKS4_GRANTED, SOCKS4_REFUSED = 0x5A, 0x5B
CHUNK = 1 << 16
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _ip(*args: str) -> None:
    # Playwright may launch the browser with an environment of the test's, without PATH
    ip = shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin") or "ip"
    subprocess.run([ip, *args], check=True, stdout=subprocess.DEVNULL)


def own_namespace() -> None:
    """This process into a new network namespace: a loopback, and a veth pair of its own
    that is up with an address (Chromium's navigator.onLine is true only with such a
    link; the kernel may lack the dummy link type)."""
    _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    # No IPv6 on the pair: its link-local addresses would come a second later, after
    # duplicate address detection, and Chromium would see that change as it starts.
    # (/proc/sys/net is the namespace's own for a process in it.)
    with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as f:
        f.write("1")
    _ip("link", "set", "lo", "up")
    _ip("link", "add", LINK, "type", "veth", "peer", "name", PEER)
    _ip("addr", "add", LINK_ADDRESS, "dev", LINK)
    _ip("link", "set", PEER, "up")
    _ip("link", "set", LINK, "up")


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("closed during the SOCKS request")
        data += part
    return data


def _socks4_request(client: socket.socket) -> tuple[str, int]:
    """(address, port) of a SOCKS4 CONNECT, the only request Chromium makes."""
    version, command, port = struct.unpack("!BBH", _read(client, 4))
    address = str(ipaddress.IPv4Address(_read(client, 4)))
    while _read(client, 1) != b"\0":  # the user id, which Chromium leaves empty
        pass
    if version != 4 or command != 1:
        raise ConnectionError(f"not a SOCKS4 CONNECT: {version}, {command}")
    return address, port


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until either side closes; a half close is passed on."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    open_ends = 2
    while open_ends:
        for key, _ in sel.select():
            src, dst = key.fileobj, key.data
            try:
                data = src.recv(CHUNK)
            except OSError:
                return
            if not data:
                sel.unregister(src)
                open_ends -= 1
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    return
                continue
            try:
                dst.sendall(data)
            except OSError:
                return


def _serve(client: socket.socket, host_ns: int) -> None:
    """One connection: its request read in Chromium's namespace, its upstream made in
    the host's (setns switches only this thread)."""
    with client:
        try:
            _check(_libc.setns(host_ns, CLONE_NEWNET), "setns(host)")
            address, port = _socks4_request(client)
            try:
                upstream = socket.create_connection((address, port), timeout=30)
            except OSError:
                client.sendall(struct.pack("!BBH4s", 0, SOCKS4_REFUSED, 0, bytes(4)))
                return
            with upstream:
                upstream.settimeout(None)
                client.sendall(struct.pack("!BBH4s", 0, SOCKS4_GRANTED, 0, bytes(4)))
                _pump(client, upstream)
        except (OSError, ConnectionError):
            return


def relay(listener: socket.socket, host_ns: int) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, host_ns), daemon=True).start()


def main(argv: list[str]) -> None:
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        own_namespace()
    except (OSError, subprocess.CalledProcessError) as e:  # not root: as before, said
        print(f"chromium_netns: Chromium shares the host's network ({e})", file=sys.stderr)
        os.execv(BINARY, [BINARY, *argv])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the relay: dies with Chromium, holds none of Playwright's pipes
        try:
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")
            os.closerange(3, host_ns)
            os.closerange(host_ns + 1, listener.fileno())
            relay(listener, host_ns)
        finally:
            os._exit(0)
    listener.close()
    os.close(host_ns)
    proxy = [f"--proxy-server=socks4://127.0.0.1:{port}", "--proxy-bypass-list=<-loopback>"]
    os.execv(BINARY, [BINARY, *proxy, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])

"""Load for benchmarks/gpu_status.py: a real `jupyter server`, and keep-alive pollers."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JUPYTER = str(Path(sys.executable).parent / "jupyter")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))] if s else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real `jupyter server` on 127.0.0.1 (a subprocess), stopped on exit."""

    def __init__(self, *extra: str, env: dict | None = None):
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.dir = tempfile.mkdtemp(prefix="gpulab-bench-")
        cmd = [
            JUPYTER,
            "server",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.dir}",
            *extra,
        ]
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=self.dir, **(env or {}))
        self.log = open(Path(self.dir) / "server.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def __enter__(self):
        import requests

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = requests.get(
                    f"http://127.0.0.1:{self.port}/api/status",
                    headers={"Authorization": f"token {self.token}"},
                    timeout=2,
                )
                if r.ok:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"jupyter server did not start; see {self.dir}/server.log")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


async def poll(port: int, path: str, token: str, clients: int, seconds: float) -> dict:
    """``clients`` keep-alive connections, each GETting ``path`` once a second."""
    lat: list[float] = []
    errors: list[str] = []
    head = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: token {token}\r\n\r\n"
    ).encode()

    async def one(k: int):
        await asyncio.sleep(k / clients)  # spread over the second, as tabs are
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n in range(int(seconds)):
            t = time.perf_counter()
            writer.write(head)
            headers = await reader.readuntil(b"\r\n\r\n")
            length = int(headers.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            lat.append((time.perf_counter() - t) * 1e3)
            if not headers.startswith(b"HTTP/1.1 200"):
                errors.append(headers.split(b"\r\n")[0].decode())
            await asyncio.sleep(max(0.0, start + n + 1 - loop.time()))
        writer.close()

    await asyncio.gather(*(one(k) for k in range(clients)))
    return {
        "requests": len(lat),
        "errors": len(errors),
        "p50_ms": round(pct(lat, 50), 3),
        "p99_ms": round(pct(lat, 99), 3),
        "max_ms": round(max(lat), 3),
    }

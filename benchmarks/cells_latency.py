"""Cells on the server's side (docs/cells-on-the-server.md): what they cost.

A plain JupyterLab from this checkout's .venv (gpulab-jupyter, jupyter-collaboration and
jupyter-server-nbmodel installed) on a free 127.0.0.1 port, started three times:

1. ``idle_mb``: the Jupyter server's resident memory (its own process, not kernels), 20 s
   after a JupyterLab page opened one notebook and its kernel started, with
   jupyter-server-nbmodel loaded and with it turned off
   (``ServerApp.jpserver_extensions``);
2. ``latency``: print to screen, in Debian's Chromium: a cell prints ``time.time()`` 40
   times, every 0.25 s; the page notes when each line shows (a MutationObserver on the
   output area, the same clock); median and 90th percentile in ms, for cells run on the
   server's side and for cells run through the tab's kernel connection
   (``c.ServerSideCells.enabled = False``, JupyterLab's own path).

Not part of `make test`.

    .venv/bin/python benchmarks/cells_latency.py

Last line: ``cells idle_mb_with=<MB> idle_mb_without=<MB> server_p50=<ms> server_p90=<ms>
plain_p50=<ms> plain_p90=<ms>``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
JUPYTER = REPO / ".venv" / "bin" / "jupyter"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
CELL = (
    "import time\nfor i in range(40):\n"
    "    print(repr(time.time()), flush=True)\n    time.sleep(0.25)\n"
)
WATCH = """() => {
  window.__seen = [];
  const panel = '.jp-NotebookPanel:not(.lm-mod-hidden)';
  const area = document.querySelector(panel + ' .jp-Cell .jp-OutputArea');
  new MutationObserver(() => {
    const now = Date.now() / 1000;
    for (const m of area.innerText.matchAll(/^(\\d{10}\\.\\d+)$/gm)) {
      if (!window.__seen.some(s => s[0] === m[1])) window.__seen.push([m[1], now]);
    }
  }).observe(area, { childList: true, subtree: true, characterData: true });
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def lab(parent: Path, *extra: str):
    port, token = free_port(), secrets.token_hex(16)
    root = Path(tempfile.mkdtemp(dir=parent))  # its own files and workspace
    log = open(root / f"server-{port}.log", "w")  # noqa: SIM115 (closed below)
    print(f"server log: {log.name}", file=sys.stderr)
    proc = subprocess.Popen(
        [str(JUPYTER), "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
         *extra],  # fmt: skip
        stdout=log, stderr=subprocess.STDOUT, cwd=root,  # jupyter-collaboration's store
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if proc.poll() is not None:
                raise RuntimeError(f"the server ended: {log.name}")
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"{base}/api/status?token={token}", timeout=5).ok:
                    break
            time.sleep(0.5)
        yield base, token, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def put_notebook(base: str, token: str, name: str) -> None:
    cell = {"cell_type": "code", "id": "bench1", "execution_count": None, "metadata": {},
            "outputs": [], "source": CELL}  # fmt: skip
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4,
          "nbformat_minor": 5}  # fmt: skip
    body = {"type": "notebook", "format": "json", "content": nb}
    r = requests.put(f"{base}/api/contents/{name}?token={token}", json=body, timeout=30)
    r.raise_for_status()


def open_page(browser, base: str, token: str, name: str):
    page = browser.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{base}/lab/tree/{name}?token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status=idle]", timeout=60_000)
    return page


def latency(browser, base: str, token: str) -> list[float]:
    put_notebook(base, token, "latency.ipynb")
    page = open_page(browser, base, token, "latency.ipynb")
    page.evaluate(WATCH)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and page.evaluate("window.__seen.length") < 40:
        time.sleep(0.5)
    seen = page.evaluate("window.__seen")
    page.close()
    return [(shown - float(printed)) * 1000 for printed, shown in seen]


def idle_memory(browser, root: Path, *extra: str) -> float:
    with lab(root, *extra) as (base, token, pid):
        put_notebook(base, token, "idle.ipynb")
        page = open_page(browser, base, token, "idle.ipynb")
        time.sleep(20)
        mb = rss_mb(pid)
        page.close()
        return mb


def main() -> int:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        root = Path(tempfile.mkdtemp(prefix="cells-bench-"))
        os.environ.setdefault("JUPYTER_CONFIG_DIR", str(root / "config"))
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        mb_with = idle_memory(browser, root)
        off = "--ServerApp.jpserver_extensions=jupyter_server_nbmodel=False"
        mb_without = idle_memory(browser, root, off)
        with lab(root) as (base, token, _):
            server = latency(browser, base, token)
        with lab(root, "--ServerSideCells.enabled=False") as (base, token, _):
            plain = latency(browser, base, token)
        browser.close()

    def p(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=10)[8] if q == 0.9 else statistics.median(values)

    print(f"idle server memory: {mb_with:.0f} MB with jupyter-server-nbmodel, "
          f"{mb_without:.0f} MB without")  # fmt: skip
    print(f"print to screen, {len(server)} lines on the server's side, {len(plain)} plain")
    print(
        f"cells idle_mb_with={mb_with:.0f} idle_mb_without={mb_without:.0f} "
        f"server_p50={p(server, 0.5):.0f} server_p90={p(server, 0.9):.0f} "
        f"plain_p50={p(plain, 0.5):.0f} plain_p90={p(plain, 0.9):.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

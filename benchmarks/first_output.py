"""A cell's first output, click by click: the part of the first minute that
benchmarks/first_hour.py times for a stopped project and for its anchor, a plain
``jupyter lab`` started on this machine.

Each measure is one person's path, in one Chromium page: start the server (gpulab:
the start page's button; plain: the command), JupyterLab's page, the Launcher's
Python 3 card, one line typed as soon as the new notebook's cell takes typing,
Shift+Enter once, the printed line. Its parts, from timestamps the page gives:

- ``spawn``: the click (or the command) to the navigation that loads JupyterLab
  (gpulab: the hub said the server is ready and the spawn page moved on; plain:
  the first answer of the server, polled every 0.1 s as a person reloads);
- ``proxy``: that navigation to the first byte of JupyterLab's page (the hub's
  proxy, the project server's login through the hub, its redirects);
- ``lab``: the first byte to JupyterLab's file browser and Launcher on screen;
- ``notebook``: the Launcher card's click to a cell that takes typing;
- ``kernel`` and ``execution``: the line typed to the line printed, which is the
  kernel's start (the notebook's kernel starts as it is made) and the execution; the
  execution is timed again in the next cell, the kernel ready, and ``kernel`` is the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from playwright.sync_api import Page

PARTS = ("spawn", "proxy", "lab", "notebook", "kernel", "execution")
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
FOCUSED = f"""() => {{
  const a = document.activeElement;
  return !!(a && a.isContentEditable && a.closest('{PANEL} .jp-Cell:first-child .cm-content'));
}}"""
# The navigation that loaded the page: when it began and its first byte (epoch ms).
NAVIGATION = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  return [performance.timeOrigin, performance.timeOrigin + n.responseStart];
}"""
# What JupyterLab's page fetched until then, slowest first (name, start, duration; ms).
RESOURCES = """() => performance.getEntriesByType('resource')
  .map(r => [r.name.replace(location.origin, ''), Math.round(r.startTime), Math.round(r.duration)])
  .sort((a, b) => b[2] - a[2]).slice(0, 12)"""
TIMEOUT_MS = 300_000


@dataclass
class Measure:
    parts: dict[str, float] = field(default_factory=dict)
    slowest: list = field(default_factory=list)  # RESOURCES, as JupyterLab came on screen

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def lab_on_screen(page: Page) -> None:
    page.locator("#filebrowser").wait_for(timeout=TIMEOUT_MS)
    page.locator(".jp-Launcher:visible .jp-LauncherCard[data-category=Notebook]").first.wait_for(
        timeout=TIMEOUT_MS
    )


def decline_news(page: Page) -> None:
    """JupyterLab's one question about Jupyter's news, where it asks (a plain one)."""
    button = page.get_by_role("button", name="No", exact=True)
    if button.count():
        button.first.click()


def new_notebook_output(page: Page, n: int, m: Measure, wait_idle: bool = False) -> None:
    """The Launcher's Python 3 card, ``print(<n>*7)`` typed at once, Shift+Enter, the line.

    ``wait_idle``: Shift+Enter only once the status bar says the kernel is Idle. A plain
    JupyterLab 4.6.6 drops a Shift+Enter pressed while a new notebook's kernel starts
    (jupyterlab/jupyterlab#8490; docs/first-hour.md), so its person waits for that:
    its fastest path that prints. gpulab's is pressed at once."""
    t0 = time.time()
    page.locator(".jp-Launcher:visible .jp-LauncherCard[data-category=Notebook]").first.click()
    page.wait_for_function(FOCUSED, timeout=TIMEOUT_MS, polling=20)
    t1 = time.time()
    page.keyboard.type(f"print({n}*7)")
    t2 = time.time()
    if wait_idle:
        page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$")).wait_for(
            timeout=TIMEOUT_MS
        )
    page.keyboard.press("Shift+Enter")
    out = page.locator(f"{PANEL} .jp-Cell").first.locator(".jp-OutputArea-output")
    out.get_by_text(str(n * 7), exact=True).wait_for(timeout=TIMEOUT_MS)
    t3 = time.time()
    # The same again in the cell below (where Shift+Enter left the cursor), the kernel
    # now ready: the execution alone; the rest of the first run was the kernel's start.
    page.keyboard.type(f"print({n}*11)")
    t4 = time.time()
    page.keyboard.press("Shift+Enter")
    again = page.locator(f"{PANEL} .jp-Cell").nth(1).locator(".jp-OutputArea-output")
    again.get_by_text(str(n * 11), exact=True).wait_for(timeout=TIMEOUT_MS)
    execution = time.time() - t4
    m.parts["notebook"] = t1 - t0
    m.parts["kernel"] = max(0.0, t3 - t2 - execution)
    m.parts["execution"] = min(execution, t3 - t2)


def after_navigation(page: Page, clicked: float, m: Measure) -> None:
    """spawn, proxy and lab from the page's navigation timing (epoch seconds)."""
    lab_on_screen(page)
    shown = time.time()
    m.slowest = page.evaluate(RESOURCES)
    began, first_byte = (v / 1000 for v in page.evaluate(NAVIGATION))
    m.parts["spawn"] = max(0.0, began - clicked)
    m.parts["proxy"] = max(0.0, first_byte - began)
    m.parts["lab"] = max(0.0, shown - first_byte)


def summary(measures: list[Measure]) -> dict[str, float]:
    """p50 of each part and of the total, p95 of the total (nearest rank)."""
    totals = sorted(m.total for m in measures)
    out = {p: statistics.median(m.parts[p] for m in measures) for p in PARTS}
    out["p50"] = statistics.median(totals)
    out["p95"] = totals[min(len(totals) - 1, round(0.95 * (len(totals) - 1) + 0.4999))]
    return out


def slowest(label: str, m: Measure) -> str:
    """The requests of JupyterLab's page that took longest, in its last round."""
    rows = [f"  {d:6d} ms from {t:6d} ms  {name[:110]}" for name, t, d in m.slowest]
    return f"{label}, the page's slowest requests until JupyterLab was on screen:\n" + "\n".join(
        rows
    )


def line(label: str, measures: list[Measure]) -> str:
    s = summary(measures)
    parts = " ".join(f"{p}={s[p]:.2f}" for p in PARTS)
    rounds = ", ".join(f"{m.total:.2f}" for m in measures)
    return f"{label}: p50 {s['p50']:.2f} s, p95 {s['p95']:.2f} s ({parts}); each: {rounds}"


class PlainLab:
    """A plain JupyterLab (the anchor): its own venv with JupyterLab and ipykernel at
    the versions the project images pin, on 127.0.0.1, no token, a folder of its own."""

    def __init__(self, home: Path, jupyterlab: str, ipykernel: str):
        self.home = home
        self.venv = home / "plain-venv"
        self.root = home / "plain-root"
        self.pins = [f"jupyterlab=={jupyterlab}", f"ipykernel=={ipykernel}"]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def install(self) -> None:
        if not (self.venv / "bin" / "jupyter-lab").exists():
            subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
            done = subprocess.run(
                [str(self.venv / "bin" / "pip"), "install", "-q", *self.pins],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if done.returncode:
                raise RuntimeError(f"pip could not install {self.pins}:\n{done.stderr[-3000:]}")
        # The same question about Jupyter's news as gpulab's images answer (none asked).
        settings = self.venv / "share" / "jupyter" / "lab" / "settings"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "overrides.json").write_text(
            '{"@jupyterlab/apputils-extension:notification":'
            ' {"checkForUpdates": false, "fetchNews": "false"}}'
        )

    def start(self) -> float:
        """Start it (a fresh folder each time); the epoch second the command ran."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
        env.update(HOME=str(self.home), JUPYTER_CONFIG_DIR=str(self.home / "plain-config"))
        cmd = [
            str(self.venv / "bin" / "jupyter-lab"),
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ip=127.0.0.1",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={self.root}",
        ]
        started = time.time()
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        return started

    def wait_answers(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/lab", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the plain JupyterLab did not answer at {self.url} in {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


def plain_round(page: Page, lab: PlainLab, n: int) -> Measure:
    m = Measure()
    started = lab.start()
    try:
        lab.wait_answers()
        page.goto(f"{lab.url}/lab")
        after_navigation(page, started, m)
        decline_news(page)
        new_notebook_output(page, n, m, wait_idle=True)
    finally:
        lab.stop()
    return m

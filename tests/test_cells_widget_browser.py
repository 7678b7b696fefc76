"""An ipywidgets slider in a JupyterLab page, its cell run on the server's side: the
slider shows and moves in the page, the kernel sees the value it was moved to, and the
.ipynb on disk keeps the slider's output (its view and its text) after the page saved
the notebook and after the widget was closed.

A real Jupyter server from this checkout's .venv (cells_kit.local_server), Debian's
Chromium; the notebook is read back from its file. Screenshot:
test-output/cells-widget-slider.png."""

from __future__ import annotations

import json
import time

import pytest
from browser_kit import SHOTS
from cells_kit import cell_of, cell_text, code_cell, local_server, put_notebook
from playwright.sync_api import expect

pytest.importorskip("jupyter_server_nbmodel")
pytest.importorskip("ipywidgets")

pytestmark = [pytest.mark.browser]

VIEW = "application/vnd.jupyter.widget-view+json"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS = [
    ("s1", "import ipywidgets\nw = ipywidgets.IntSlider(value=3, max=10)\nw\n"),
    ("s2", "print('slider at', w.value)\n"),
    ("s3", "w.close()\nprint('closed')\n"),
]


def saved_when(path, ok, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    nb: dict = {}
    while time.monotonic() < deadline:
        try:
            nb = json.loads(path.read_text())
        except (OSError, ValueError):
            nb = {}
        if nb and ok(nb):
            return nb
        time.sleep(0.5)
    raise AssertionError(f"the saved notebook never got there: {json.dumps(nb)[:3000]}")


def has_view(nb: dict) -> bool:
    return any(VIEW in o.get("data", {}) for o in cell_of(nb, "s1").get("outputs", []))


def run_cell(page, n: int) -> None:
    page.locator(f"{PANEL} .jp-Cell").nth(n).locator(".jp-InputArea").click()
    page.keyboard.press("Escape")  # command mode: Shift+Enter runs the selected cell
    page.keyboard.press("Shift+Enter")


def test_a_slider_run_on_the_server_side_moves_and_stays_in_the_saved_notebook(tmp_path, browser):
    with local_server(tmp_path) as c:
        put_notebook(c, "", "slider.ipynb", [code_cell(cid, src) for cid, src in CELLS])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(60_000)
        try:
            page.goto(f"{c.base}/lab/tree/slider.ipynb?token={c.token}")
            expect(page.locator(f"{PANEL} .jp-Cell")).to_have_count(3, timeout=90_000)
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]")).to_be_visible(
                timeout=90_000
            )
            run_cell(page, 0)
            slider = page.locator(f"{PANEL} .jp-Cell").first.locator(".widget-slider")
            expect(slider).to_be_visible(timeout=30_000)
            readout = page.locator(f"{PANEL} .jp-Cell").first.locator(".widget-readout")
            expect(readout).to_have_text("3")
            # the person moves it: the handle, then the arrow keys
            page.locator(f"{PANEL} .jp-Cell").first.locator(".noUi-handle").click()
            for _ in range(4):
                page.keyboard.press("ArrowRight")
            expect(readout).to_have_text("7")
            run_cell(page, 1)
            s2 = page.locator(f"{PANEL} .jp-Cell").nth(1).locator(".jp-OutputArea")
            expect(s2).to_have_text("slider at 7", timeout=30_000)
            page.screenshot(path=SHOTS / "cells-widget-slider.png")
            page.keyboard.press("Control+s")
            moved = lambda nb: has_view(nb) and "slider at" in cell_text(nb, "s2")  # noqa: E731
            nb = saved_when(tmp_path / "slider.ipynb", moved)
            assert cell_text(nb, "s2") == "slider at 7\n"
            # the widget closed (its page view goes): its output stays in the file
            run_cell(page, 2)
            expect(page.locator(f"{PANEL} .jp-Cell").nth(2).locator(".jp-OutputArea")).to_have_text(
                "closed", timeout=30_000
            )
            page.keyboard.press("Control+s")
            nb = saved_when(tmp_path / "slider.ipynb", lambda nb: "closed" in cell_text(nb, "s3"))
            outputs = cell_of(nb, "s1")["outputs"]
            assert len(outputs) == 1 and VIEW in outputs[0]["data"], outputs
            assert "IntSlider" in "".join(outputs[0]["data"]["text/plain"]), outputs
        finally:
            page.close()

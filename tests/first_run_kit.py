"""A person's first Shift+Enter in a new notebook, in JupyterLab through Chromium.

Each way people make a notebook (the Launcher's Python 3 card, File > New > Notebook,
the file browser's + and then the card, a copy made with the file browser's Duplicate),
then one line typed and Shift+Enter pressed once, as soon as the cell takes typing: no
waiting for the kernel. Used by test_lab_first_run_browser.py on a project's JupyterLab.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from browser_kit import SHOTS
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect

WAYS = ("launcher", "file-new", "browser-plus", "copy")
# The notebook the "copy" way duplicates: one empty code cell, as a new one has.
BLANK = "blank.ipynb"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
# The first cell's editor takes typing: focused (a new notebook's), or there to click.
FOCUSED = f"""() => {{
  const a = document.activeElement;
  return !!(a && a.isContentEditable && a.closest('{PANEL} .jp-Cell:first-child .cm-content'));
}}"""


@dataclass
class Run:
    way: str
    line: str
    editable_s: float  # from the click that makes the notebook to a cell that takes typing
    output_s: float | None  # from Shift+Enter to the printed line (None: nothing within 10 s)


def blank_notebook() -> dict:
    cell = {"cell_type": "code", "execution_count": None, "id": "b1a4c000",
            "metadata": {}, "outputs": [], "source": ""}  # fmt: skip
    kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4,
            "nbformat_minor": 5}  # fmt: skip


def decline_news(page: Page) -> None:
    try:  # JupyterLab's "get notified about Jupyter news?" toast (asked once)
        page.get_by_role("button", name="No", exact=True).click(timeout=2_000)
    except PlaywrightError:
        pass


def lab_ready(page: Page) -> None:
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    expect(page.locator("#filebrowser")).to_be_visible(timeout=60_000)


def _launcher_card(page: Page) -> None:
    card = page.locator(".jp-Launcher:visible .jp-LauncherCard[data-category=Notebook]").first
    card.click()


def _make(page: Page, way: str, copy_of: str) -> None:
    """The clicks that make (and open) a notebook."""
    if way == "launcher":
        if not page.locator(".jp-Launcher:visible").count():
            page.get_by_role("menuitem", name="File").click()
            page.locator('.lm-Menu [data-command="launcher:create"]').click()
        _launcher_card(page)
    elif way == "browser-plus":
        page.locator('#filebrowser [data-command="launcher:create"]').first.click()
        _launcher_card(page)
    elif way == "file-new":
        page.get_by_role("menuitem", name="File").click()
        page.locator(".lm-Menu-item[data-type=submenu]", has_text="New").first.hover()
        page.locator('.lm-Menu [data-command="notebook:create-new"]').click()  # File > New
        # JupyterLab asks which kernel (Python 3 chosen): the person clicks Select.
        page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept", has_text="Select").click()
    elif way == "copy":
        names = page.locator("#filebrowser .jp-DirListing-itemText")
        before = set(names.all_inner_texts())
        page.locator("#filebrowser .jp-DirListing-item", has_text=copy_of).first.click(
            button="right"
        )
        page.locator('.lm-Menu [data-command="filebrowser:duplicate"]').click()
        deadline = time.monotonic() + 30
        while not (made := set(names.all_inner_texts()) - before):
            assert time.monotonic() < deadline, "Duplicate made no copy in the file browser"
            page.wait_for_timeout(50)
        (copy,) = made
        page.locator("#filebrowser .jp-DirListing-item", has_text=copy).dblclick()
    else:
        raise ValueError(way)


def first_shift_enter(page: Page, way: str, n: int, copy_of: str = BLANK) -> Run:
    """Make a notebook ``way``, type print(n) as soon as its cell takes typing, press
    Shift+Enter once; how long each part took (output_s None: nothing printed in 10 s)."""
    line = f"print({n})"
    t0 = time.monotonic()
    _make(page, way, copy_of)
    cell = page.locator(f"{PANEL} .jp-Cell").first
    editor = cell.locator(".cm-content[contenteditable=true]")
    expect(editor).to_be_attached(timeout=30_000)
    if not page.evaluate(FOCUSED):
        editor.click()  # no cursor in the cell (an opened notebook): the person clicks in it
    try:
        page.wait_for_function(FOCUSED, timeout=30_000, polling=20)
    except PlaywrightError:
        page.screenshot(path=SHOTS / f"first-run-no-cursor-{n}-{way}.png")
        raise
    editable = time.monotonic() - t0
    page.keyboard.type(line)
    page.keyboard.press("Shift+Enter")
    t1 = time.monotonic()
    output = cell.locator(".jp-OutputArea-output")
    try:
        expect(output).to_have_text(str(n), timeout=10_000)
        took: float | None = time.monotonic() - t1
    except AssertionError:
        took = None
        page.screenshot(path=SHOTS / f"first-run-lost-{n}-{way}.png")
    return Run(way, line, round(editable, 2), None if took is None else round(took, 2))


def close_current(page: Page) -> None:
    """Close the notebook's tab (Alt+W, File > Close Tab): the next one starts alone."""
    page.get_by_role("menuitem", name="File").click()
    page.locator('.lm-Menu [data-command="application:close"]').click()
    dialog = page.locator(".jp-Dialog")
    try:
        dialog.locator(".jp-Dialog-button", has_text="Discard").click(timeout=1_000)
    except PlaywrightError:
        pass

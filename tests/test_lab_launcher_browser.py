"""JupyterLab's launcher with gpulab-jupyter, through Debian's Chromium: the TensorBoard
tile (gpulab_jupyter/tensorboard.py, through jupyter-server-proxy as in the base image)
shows with its icon (gpulab's front end draws it: style/launcher.css), as a user opening
the launcher sees it.

A plain `jupyter lab` from .venv, as in test_lab_extension_browser.py; the screenshot
goes to test-output/launcher-tensorboard.png.
"""

from __future__ import annotations

import pytest
from test_lab_extension_browser import ARGS, CHROMIUM, OUT, running_lab

pytestmark = pytest.mark.browser


def test_the_tensorboard_tile_has_its_icon(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    OUT.mkdir(exist_ok=True)
    with running_lab(tmp_path) as (url, token, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")
            # A first visit opens the launcher; the tile is under "Other".
            card = page.locator(".jp-LauncherCard").filter(has_text="TensorBoard")
            expect(card).to_have_count(1, timeout=90_000)
            section = page.locator(".jp-Launcher-section").filter(has=card)
            expect(section.locator(".jp-Launcher-sectionTitle")).to_have_text("Other")
            # Its icon: gpulab's TensorBoard picture, drawn in the tile's icon box (the
            # box was empty), and a picture the browser can draw.
            box = card.locator(".jp-LauncherCard-icon")
            expect(box).to_be_visible()
            image = box.evaluate("e => getComputedStyle(e).backgroundImage")
            assert image.startswith('url("'), image
            svg = page.evaluate(
                """async src => {
                    const img = new Image();
                    img.src = src;
                    await img.decode();
                    return img.naturalWidth > 0 ? (await fetch(src)).text() : '';
                }""",
                image[len('url("') : -len('")')],
            )
            assert "<title>TensorBoard</title>" in svg and "#ff6f00" in svg, svg[:300]
            size = box.bounding_box()
            assert size and size["width"] >= 40 and size["height"] >= 40, size
            page.wait_for_timeout(500)
            page.locator(".jp-Launcher-section").filter(has=card).screenshot(
                path=str(OUT / "launcher-tensorboard.png")
            )
        finally:
            browser.close()

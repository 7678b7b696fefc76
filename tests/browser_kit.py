"""What every Chromium test shares: Debian's Chromium through Playwright (never a
downloaded browser), its flags, where screenshots go. The ``browser`` fixture
(conftest.py) launches it once per test module."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "test-output"  # git-ignored; look at them
DOCS_IMG = REPO / "docs" / "img"  # the README's and docs' screenshots, from passing runs


def launch(playwright):
    """Debian's Chromium, headless."""
    SHOTS.mkdir(exist_ok=True)
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

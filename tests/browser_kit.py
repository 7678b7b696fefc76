"""What every Chromium test shares: Debian's Chromium through Playwright (never a
downloaded browser) in a network namespace of its own, its flags, where screenshots go.
The ``browser`` fixture (conftest.py) launches it once per test module."""

from __future__ import annotations

from pathlib import Path

CHROMIUM_BINARY = "/usr/bin/chromium"
# What Playwright launches: Debian's Chromium in a network namespace of its own, so the
# other test worker's Docker interfaces, which come and go on this host, never abort
# its connections (chromium_netns.py says how and why).
CHROMIUM = str(Path(__file__).resolve().with_name("chromium_netns.py"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "test-output"  # git-ignored; look at them
DOCS_IMG = REPO / "docs" / "img"  # the README's and docs' screenshots, from passing runs


def launch(playwright):
    """Debian's Chromium, headless."""
    SHOTS.mkdir(exist_ok=True)
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


EXPECT_TIMEOUT_MS = 15_000  # Playwright's 5 s default is short on a loaded 2-core machine

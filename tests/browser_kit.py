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


# Chromium aborts a navigation with this error whenever a network interface on the host
# comes or goes: Docker makes one for every network and container, and the other test
# worker (make test runs two) makes them at any moment.
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"
NAVIGATION_TRIES = 3
EXPECT_TIMEOUT_MS = 15_000  # Playwright's 5 s default is short on a loaded 2-core machine


def survive_network_changes() -> None:
    """Playwright's ``Page.goto`` and ``Page.reload`` try again (3 tries in all) when,
    and only when, Chromium aborted them with ERR_NETWORK_CHANGED; any other error, and
    the third change in a row, fails the test as before."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import Page

    for name in ("goto", "reload"):
        original = getattr(Page, name)
        if getattr(original, "retries_network_changes", False):
            continue

        def navigate(self, *args, _original=original, _name=name, **kwargs):
            for attempt in range(1, NAVIGATION_TRIES + 1):
                try:
                    return _original(self, *args, **kwargs)
                except PlaywrightError as error:
                    if NETWORK_CHANGED not in str(error) or attempt == NAVIGATION_TRIES:
                        raise
                    print(f"Chromium: {NETWORK_CHANGED} in page.{_name} (try {attempt}): again")

        navigate.retries_network_changes = True
        setattr(Page, name, navigate)

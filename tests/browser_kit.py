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


def jupyterhub_admin(page, base: str, name_prefix: str) -> None:
    """JupyterHub's own admin page listing the users whose names start with
    ``name_prefix``, typed into its Search Users box as an admin does.

    JupyterHub 6.1's page does not take the filter from the address
    (``/hub/admin?name_filter=…`` fetches ``name_filter=`` empty): it lists the first
    50 users by id, and a test hub that made more users than that never shows a new one.
    """
    page.goto(f"{base}/hub/admin")
    search = page.get_by_placeholder("Search Users")
    with page.expect_response(
        lambda r: "/hub/api/users?" in r.url and f"name_filter={name_prefix}&" in r.url
    ):
        search.fill(name_prefix)

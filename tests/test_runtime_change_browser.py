"""Change runtime type in a browser: JupyterLab's Kernel menu opens the project's runtime
page on the hub, in the same tab; Save restarts the project (CPU to CPU on this machine,
which has no GPU) and JupyterLab opens again. The home page's row links to the page."""

from __future__ import annotations

import re

import pytest
from browser_kit import SHOTS
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect
from security.people import log_in_admin, make_user, password

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

USER, PROJECT = "rtbrowse", "rt-gpu"


@pytest.fixture
def page(request, browser):
    """One browser page (own cookies), screenshotted when the test fails."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    p = context.new_page()
    yield p
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        try:
            p.screenshot(path=SHOTS / "runtime-failure.png")
            print(f"\npage at failure: {p.url} (test-output/runtime-failure.png)")
        except PlaywrightError:
            pass
    context.close()


@pytest.fixture(scope="module")
def owner(hub):
    user = make_user(hub, log_in_admin(hub), USER)
    user.start_project(PROJECT)
    yield user
    if PROJECT in user.api("GET", f"/hub/api/users/{USER}").json()["servers"]:
        user.stop_project(PROJECT)


def lab_ready(p: Page) -> None:
    expect(p.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    try:  # JupyterLab's "get notified about Jupyter news?" toast
        p.get_by_role("button", name="No", exact=True).click(timeout=3_000)
    except PlaywrightError:
        pass


def test_kernel_menu_opens_the_runtime_page_and_save_restarts(hub, owner, page: Page):
    base = hub.url.rstrip("/")
    page.goto(f"{base}/hub/login")
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(password(USER))
    page.get_by_role("button", name="Sign In").click()
    expect(page).to_have_url(f"{base}/hub/home")
    row = page.locator(f"tr.project[data-project={PROJECT}]")
    expect(row.get_by_role("link", name="Change runtime")).to_have_attribute(
        "href", f"/hub/gpulab/runtime/{USER}/{PROJECT}"
    )

    page.goto(f"{base}/user/{USER}/{PROJECT}/lab")
    lab_ready(page)
    page.get_by_role("menuitem", name="Kernel").click()
    page.get_by_role("menuitem", name="Change runtime type…").click()
    page.wait_for_url(f"{base}/hub/gpulab/runtime/{USER}/{PROJECT}")
    expect(page.get_by_role("heading", name="Change runtime type")).to_be_visible()
    expect(page.locator("#runtime-current")).to_contain_text("Runs on: CPU only (running now)")
    expect(page.locator("#runtime-no-gpu")).to_have_text(
        "Only CPU is offered: this computer has no GPU."
    )
    page.screenshot(path=SHOTS / "runtime-page.png", full_page=True)

    page.get_by_role("button", name="Save and restart").click()
    page.wait_for_url(re.compile(rf"/user/{USER}/{PROJECT}/lab"), timeout=120_000)
    lab_ready(page)

"""In a real browser (Debian's Chromium, driven by Playwright), as a user does it:
sign up, wait for the admin's approval, log in, create a project on the home
page, start it, watch it start, and work in JupyterLab on the project's files.

Screenshots go to test-output/ (git-ignored); when the test passes, the home
page and JupyterLab are also written to docs/img/ for the README.
"""

from __future__ import annotations

import re
import shutil
import time

import pytest
from conftest import REPO
from hubclient import HubUser
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect, sync_playwright

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1280, "height": 800}
SHOTS = REPO / "test-output"
DOCS_IMG = REPO / "docs" / "img"

USER = "dana"
PASSWORD = "dana-Passw0rd-long"
DISPLAY_NAME = "Vision Experiments"
PROJECT = "vision-experiments"  # what JupyterHub's home page makes of DISPLAY_NAME


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def pages(request, browser):
    """New pages, each in its own browser context (own cookies); screenshotted on failure
    (list this fixture after stop_servers_afterwards, so the pages are shot first)."""
    SHOTS.mkdir(exist_ok=True)
    opened: list[tuple[str, Page]] = []

    def new_page(who: str) -> Page:
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(15_000)
        page = context.new_page()
        opened.append((who, page))
        return page

    yield new_page
    rep = getattr(request.node, "rep_call", None)
    for who, page in opened:
        if rep is not None and rep.failed:
            try:
                page.screenshot(path=SHOTS / f"failure-{who}.png")
                print(f"\n{who}'s page at failure: {page.url} (test-output/failure-{who}.png)")
            except PlaywrightError:
                pass
        page.context.close()


@pytest.fixture
def stop_servers_afterwards(hub):
    """Stop every server the test's users got, through the REST API with a token."""
    yield
    admin = HubUser(hub.url, "admin", hub.admin_password)
    if admin.login().status_code != 302:
        return
    admin.new_token()
    for name in (USER, "admin"):
        r = admin.api("GET", f"/hub/api/users/{name}")
        if r.status_code != 200:
            continue
        for server in r.json()["servers"]:
            path = f"servers/{server}" if server else "server"
            admin.api("DELETE", f"/hub/api/users/{name}/{path}")
        deadline = time.monotonic() + 120
        while admin.api("GET", f"/hub/api/users/{name}").json()["servers"]:
            assert time.monotonic() < deadline, f"{name}'s servers did not stop"
            time.sleep(0.5)


def shot(page: Page, name: str) -> None:
    page.screenshot(path=SHOTS / name)


def log_in(page: Page, base: str, name: str, password: str) -> None:
    page.goto(f"{base}/hub/login")
    expect(page.get_by_text("Sign In").first).to_be_visible()
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign In").click()


def test_sign_up_approval_login_project_and_jupyterlab(hub, stop_servers_afterwards, pages):
    base = hub.url
    user = pages("user")

    # 1. Sign up; the page says the admin has to look at it, and logging in is
    # refused until then, with the reason.
    user.goto(f"{base}/hub/signup")
    user.get_by_label("Username").fill(USER)
    user.locator("#password_input").fill(PASSWORD)
    user.locator("#password_confirmation_input").fill(PASSWORD)
    user.get_by_role("button", name="Create User").click()
    expect(user.get_by_role("alert")).to_contain_text("Your information has been sent to the admin")
    shot(user, "01-signup.png")

    log_in(user, base, USER, PASSWORD)
    refused = user.get_by_text(f"User {USER} has not been approved by an administrator yet")
    expect(refused).to_be_visible()
    shot(user, "02-login-not-approved.png")

    # The admin, in another browser, approves the new user on /hub/authorize.
    admin = pages("admin")
    log_in(admin, base, "admin", hub.admin_password)
    expect(admin.get_by_text("Invalid username or password")).to_have_count(0)
    admin.goto(f"{base}/hub/authorize")
    expect(admin.get_by_role("heading", name="Authorization area")).to_be_visible()
    row = admin.get_by_role("row").filter(has_text=USER)
    expect(row).to_contain_text("No")
    row.get_by_role("button", name="Authorize", exact=True).click()
    expect(row.get_by_role("button", name="Unauthorize", exact=True)).to_be_visible()
    expect(row).to_contain_text("Yes")
    shot(admin, "03-admin-approved.png")

    # 2. The user logs in and lands on the home page, with no project yet.
    log_in(user, base, USER, PASSWORD)
    expect(user).to_have_url(f"{base}/hub/home")
    expect(user.get_by_role("heading", name="Named Servers")).to_be_visible()
    expect(user.get_by_text(USER, exact=True)).to_be_visible()  # the navbar's account

    # A new project from the home page: display name in, project name out.
    user.get_by_role("textbox", name="server name").fill(DISPLAY_NAME)
    user.get_by_role("button", name="Add New Server").click()
    project_row = user.get_by_role("row").filter(has_text=DISPLAY_NAME)
    expect(project_row).to_have_count(1)
    expect(project_row).to_contain_text("Never")
    start = project_row.get_by_role("button", name="start", exact=True)
    expect(start).to_have_attribute("href", f"/hub/spawn/{USER}/{PROJECT}")
    shot(user, "04-home-new-project.png")

    # Start it: the spawn page shows progress, then JupyterLab opens.
    start.click()
    user.wait_for_url(re.compile(rf"/(hub/spawn-pending|user)/{USER}/{PROJECT}"), timeout=60_000)
    if "/spawn-pending/" in user.url:
        expect(user.get_by_text("Your server is starting up.")).to_be_visible()
        try:  # the spawn may finish (and the page move on) while we look
            user.get_by_text("Event log").click(timeout=2_000)
            expect(user.locator("#progress-log")).to_contain_text(
                f"Preparing project {PROJECT}", timeout=5_000
            )
            shot(user, "05-spawn-progress.png")
        except (AssertionError, PlaywrightError):
            pass
    user.wait_for_url(f"**/user/{USER}/{PROJECT}/lab**", timeout=120_000)
    expect(user).to_have_url(re.compile(rf"^{re.escape(base)}/user/{USER}/{PROJECT}/lab"))

    # 3. JupyterLab's file browser shows the project folder (/workspace) with its
    # Dockerfile; opening it shows the project's environment, named after it.
    file_browser = user.locator("#filebrowser")
    dockerfile = file_browser.get_by_text("Dockerfile", exact=True)
    expect(dockerfile).to_be_visible(timeout=60_000)
    try:  # JupyterLab's "get notified about Jupyter news?" toast: answer it
        user.get_by_role("button", name="No", exact=True).click(timeout=5_000)
    except PlaywrightError:
        pass
    dockerfile.dblclick()
    expect(user.get_by_role("tab", name="Dockerfile")).to_be_visible()
    editor = user.locator("#jp-main-dock-panel")
    expect(editor.get_by_text(f'# gpulab project "{DISPLAY_NAME}"')).to_be_visible()
    shot(user, "06-lab.png")

    # Back home, the project is running: a link to it and a stop button.
    user.goto(f"{base}/hub/home")
    project_row = user.get_by_role("row").filter(has_text=DISPLAY_NAME)
    expect(project_row.get_by_role("link")).to_have_text(f"/user/{USER}/{PROJECT}/")
    expect(project_row.get_by_role("button", name="stop", exact=True)).to_be_visible()
    shot(user, "07-home-running.png")

    # 4. For the README, only from a passing run.
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SHOTS / "07-home-running.png", DOCS_IMG / "home.png")
    shutil.copyfile(SHOTS / "06-lab.png", DOCS_IMG / "lab.png")

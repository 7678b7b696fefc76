"""In a real browser (Debian's Chromium, driven by Playwright), as a user does it:
sign up (told first that an admin approves accounts), wait for the admin's approval,
log in to gpulab's home page (no default project: its addresses lead home), create
and start a project, work in JupyterLab, see it running on the home page (GPUs, last
build), stop it, delete it (typing its name) and re-create it empty.

Screenshots go to test-output/ (git-ignored); look at them. The README's come from
scripts/walk_first_hour.py instead (a hub as `make up` runs it, without test names).
"""

from __future__ import annotations

import re
import time

import pytest
from browser_kit import SHOTS
from hubclient import HubUser
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

VIEWPORT = {"width": 1280, "height": 800}

USER = "dana"
PASSWORD = "dana-Passw0rd-long"
DISPLAY_NAME = "Vision Experiments"
PROJECT = "vision-experiments"  # what the home page makes of DISPLAY_NAME
OLD_NOTEBOOK = "first-life.ipynb"



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


def project_row(page: Page):
    return page.locator(f"tr.project[data-project='{PROJECT}']")


def server_file_status(page: Page, path: str) -> int:
    """The project server's answer to GET of a file, asked as JupyterLab asks."""
    return page.evaluate(
        """async (url) => {
            const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
            const r = await fetch(url, {headers: {'X-XSRFToken': decodeURIComponent(xsrf)}});
            return r.status;
        }""",
        f"/user/{USER}/{PROJECT}/api/contents/{path}",
    )


def start_and_open_lab(user: Page, base: str) -> None:
    """From the home page's "Create and start": the spawn page, then JupyterLab."""
    user.wait_for_url(re.compile(rf"/(hub/spawn-pending|user)/{USER}/{PROJECT}"), timeout=60_000)
    if "/spawn-pending/" in user.url:
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
    expect(user.locator("#filebrowser").get_by_text("Dockerfile", exact=True)).to_be_visible(
        timeout=60_000
    )
    try:  # JupyterLab's "get notified about Jupyter news?" toast: answer it
        user.get_by_role("button", name="No", exact=True).click(timeout=5_000)
    except PlaywrightError:
        pass


def create(user: Page, display_name: str, button: str = "Create and start") -> None:
    user.get_by_label("New project").fill(display_name)
    user.get_by_role("button", name=button, exact=True).click()


def test_sign_up_approval_login_project_and_jupyterlab(hub, stop_servers_afterwards, pages):
    base = hub.url
    user = pages("user")

    # 1. Sign up; before submitting, the page says an administrator must approve the
    # account first; after, what happens next; logging in is refused until then.
    user.goto(f"{base}/hub/signup")
    approval = user.locator("#signup-approval")
    expect(approval).to_contain_text(
        "An administrator must approve your account before you can log in."
    )
    user.get_by_label("Username").fill(USER)
    user.locator("#password_input").fill(PASSWORD)
    user.locator("#password_confirmation_input").fill(PASSWORD)
    shot(user, "01-signup-form.png")
    user.get_by_role("button", name="Create User").click()
    expect(user.get_by_role("alert")).to_contain_text("Your information has been sent to the admin")
    expect(user.locator("#signup-next")).to_contain_text(
        "An administrator now has to approve your account. You cannot log in until then"
    )
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

    # 2. The user logs in and lands on gpulab's home page, with no project yet and no
    # "default server" anywhere.
    log_in(user, base, USER, PASSWORD)
    expect(user).to_have_url(f"{base}/hub/home")
    expect(user.get_by_role("heading", name="Your projects")).to_be_visible()
    expect(user.get_by_text(USER, exact=True)).to_be_visible()  # the navbar's account
    expect(user.locator("#no-projects")).to_contain_text("You have no project yet")
    for jupyterhub_word in ("My Server", "Named Servers", "Add New Server"):
        expect(user.get_by_text(jupyterhub_word)).to_have_count(0)

    # The default server's addresses lead home, with a word, and make no project.
    for address in ("/hub/spawn", f"/hub/spawn/{USER}", f"/user/{USER}/", "/hub/user-redirect/lab"):
        user.goto(base + address)
        expect(user).to_have_url(re.compile(rf"^{re.escape(base)}/hub/home\?notice=no-default$"))
        expect(user.locator(".home-notice")).to_contain_text("gpulab does not have")
    shot(user, "04-home-no-default.png")
    assert not (hub.home / "projects" / USER / "default").exists()
    expect(user.locator("tr.project")).to_have_count(0)

    # A new project: an empty name is refused in words; the display name gives the
    # project name, shown as it is typed.
    user.goto(f"{base}/hub/home")
    user.get_by_role("button", name="Create", exact=True).click()
    expect(user.locator("#home-error")).to_have_text(
        "Give the project a name first (letters or digits)."
    )
    user.get_by_label("New project").fill(DISPLAY_NAME)
    expect(user.locator("#new-project-slug")).to_have_text(PROJECT)
    shot(user, "04-home-new-project.png")

    # "Create and start": the spawn page shows progress, then JupyterLab opens.
    user.get_by_role("button", name="Create and start", exact=True).click()
    start_and_open_lab(user, base)

    # 3. JupyterLab's file browser shows the project folder (/workspace) with its
    # Dockerfile; opening it shows the project's environment, named after it.
    dockerfile = user.locator("#filebrowser").get_by_text("Dockerfile", exact=True)
    dockerfile.dblclick()
    expect(user.get_by_role("tab", name="Dockerfile")).to_be_visible()
    editor = user.locator("#jp-main-dock-panel")
    expect(editor.get_by_text(f'# gpulab project "{DISPLAY_NAME}"')).to_be_visible()
    shot(user, "06-lab.png")
    # A notebook of the project's first life, saved as JupyterLab saves files.
    saved = user.evaluate(
        """async (url) => {
            const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
            const r = await fetch(url, {method: 'PUT', headers: {
                'X-XSRFToken': decodeURIComponent(xsrf), 'Content-Type': 'application/json'},
                body: JSON.stringify({type: 'notebook', content: {cells: [], metadata: {},
                    nbformat: 4, nbformat_minor: 5}})});
            return r.status;
        }""",
        f"/user/{USER}/{PROJECT}/api/contents/{OLD_NOTEBOOK}",
    )
    assert saved == 201
    assert server_file_status(user, OLD_NOTEBOOK) == 200

    # Back home: the project runs, holds no GPU on this CPU host, its build went well.
    user.goto(f"{base}/hub/home")
    row = project_row(user)
    expect(row.locator(".state")).to_have_text("running")
    expect(row.locator(".gpus")).to_have_text("none")
    expect(row.locator(".build")).to_contain_text("OK")
    expect(row.locator(".build")).to_contain_text(re.compile(r"built \w{3} \d{1,2} \d\d:\d\d"))
    expect(row.get_by_role("link", name="build log")).to_have_attribute(
        "href", f"/hub/gpulab/build-log/{USER}/{PROJECT}"
    )
    expect(row.get_by_role("link", name="Open")).to_have_attribute(
        "href", f"/user/{USER}/{PROJECT}/"
    )
    expect(row.get_by_role("link", name="Share")).to_be_visible()
    expect(row.get_by_role("button", name="Delete")).to_have_count(0)  # stop it first
    user.mouse.move(0, 0)
    shot(user, "07-home-running.png")

    # 4. Stop it from home; then rename and delete are offered.
    row.get_by_role("button", name="Stop").click()
    expect(row.locator(".state")).to_have_text("stopped", timeout=90_000)
    expect(row.get_by_role("link", name="Start")).to_have_attribute(
        "href", f"/hub/spawn/{USER}/{PROJECT}"
    )
    expect(row.get_by_role("link", name="Rename")).to_be_visible()

    # 5. Delete: the dialog says what goes and where, and wants the name typed.
    row.get_by_role("button", name="Delete").click()
    dialog = user.locator("#delete-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("its notebooks, files and Dockerfile")
    expect(dialog).to_contain_text("its shares, share links and public links")
    expect(dialog).to_contain_text("moved to the hub's archive")
    expect(dialog).to_contain_text("A new project of the same name starts empty.")
    confirm = dialog.get_by_label(f"Type its short name {PROJECT} to confirm")
    delete = dialog.get_by_role("button", name="Delete")
    expect(delete).to_be_disabled()
    confirm.fill("vision")
    expect(delete).to_be_disabled()
    confirm.fill(PROJECT)
    expect(delete).to_be_enabled()
    shot(user, "08-home-delete.png")
    delete.click()
    expect(user).to_have_url(f"{base}/hub/home?deleted={PROJECT}")
    notice = user.locator(".home-notice")
    expect(notice).to_contain_text(f"Deleted the project \u201c{PROJECT}\u201d")
    expect(notice).to_contain_text(f"moved to the hub's archive as deleted/{USER}-")
    expect(project_row(user)).to_have_count(0)
    shot(user, "09-home-deleted.png")
    archived = list((hub.home / "hub" / "deleted").glob(f"{USER}-*/projects/{PROJECT}"))
    assert len(archived) == 1 and (archived[0] / OLD_NOTEBOOK).is_file(), archived
    assert archived[0].parent.parent.name in notice.inner_text()

    # Its address leads home too, saying so.
    user.goto(f"{base}/user/{USER}/{PROJECT}/lab")
    expect(user).to_have_url(f"{base}/hub/home?missing={PROJECT}")
    expect(user.locator(".home-notice")).to_have_text(
        f"You have no project named \u201c{PROJECT}\u201d (was it renamed or deleted?)."
    )

    # 6. The same name again starts empty: the old notebook is not back.
    create(user, DISPLAY_NAME)
    start_and_open_lab(user, base)
    expect(user.locator("#filebrowser").get_by_text(OLD_NOTEBOOK)).to_have_count(0)
    assert server_file_status(user, OLD_NOTEBOOK) == 404
    shot(user, "10-lab-recreated.png")

    # Home again: a name the user has, or the one gpulab keeps, is refused in words.
    user.goto(f"{base}/hub/home")
    create(user, DISPLAY_NAME, "Create")
    expect(user.locator("#home-error")).to_have_text(
        f"You already have a project named \u201c{PROJECT}\u201d: choose another name, "
        "or open that one below."
    )
    create(user, "Default", "Create")
    expect(user.locator("#home-error")).to_contain_text("is a name gpulab keeps for itself")
    expect(user.locator("tr.project")).to_have_count(1)

    # (The README's screenshots come from scripts/walk_first_hour.py, on a hub as
    # `make up` runs it: this hub's names carry the test prefix.)

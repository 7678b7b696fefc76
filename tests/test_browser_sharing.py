"""Sharing in JupyterLab, in real browsers (Debian's Chromium through Playwright),
against a real hub and real project containers; one browser context per person.

The owner writes a notebook in their project, opens the Share dialog (the top
bar's Share button) and makes a viewer link; the viewer opens the link, reads
JupyterHub's accept page (whose project, what access), accepts, reads the
notebook, cannot run it (no kernel: the server refuses them one), and saves a
copy into a project of their own, where they land. A collaborator, with a
collaborator link, sees the owner's edit appear while they look, without
reloading (real-time collaboration).

Screenshots go to test-output/sharing-*.png; from a passing run the dialog and
the accept page are also written to docs/img/ for docs/sharing.md.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from urllib.parse import quote

import pytest
from browser_kit import DOCS_IMG, SHOTS
from hubclient import HubUser
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect
from security.people import make_user, password

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

VIEWPORT = {"width": 1280, "height": 800}

# Names of their own, so the suite's other modules on the same hub do not clash.
OWNER, PROJECT = "bsowner", "bs-shared"
VIEWER, VIEWER_PROJECT = "bsviewer", "bs-mine"
COLLABORATOR = "bscollab"
NOTEBOOK = "experiment.ipynb"
COPY = "experiment (copy).ipynb"
CODE = 'result = "accuracy 0.93 on the owner\'s run"\nprint(result)'
OUTPUT = "accuracy 0.93 on the owner's run"
READ_ONLY_NOTICE = f"Viewing {OWNER}'s project read-only — Save a copy to run it"


@pytest.fixture(scope="module")
def people(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    admin.new_token()
    return {n: make_user(hub, admin, n) for n in (OWNER, VIEWER, COLLABORATOR)}


@pytest.fixture(scope="module")
def projects(people):
    """The owner's project, and one of the viewer's own for the copy."""
    started = [(people[OWNER], PROJECT), (people[VIEWER], VIEWER_PROJECT)]
    for user, project in started:
        user.start_project(project)
    yield
    for user, project in started:
        user.stop_project(project)


@pytest.fixture(scope="module")
def contexts(browser, hub):
    """One logged-in browser context per person, kept across this module's tests."""
    SHOTS.mkdir(exist_ok=True)
    made = {}

    def context_of(name: str):
        if name not in made:
            context = browser.new_context(viewport=VIEWPORT)
            context.set_default_timeout(20_000)
            page = context.new_page()
            page.errors = []
            page.on("pageerror", lambda e, errors=page.errors: errors.append(str(e)))
            log_in(page, hub.url, name)
            made[name] = context
        return made[name]

    yield context_of
    for context in made.values():
        context.close()


@pytest.fixture
def shoot_on_failure(request, contexts):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is None or not rep.failed:
        return
    for name in (OWNER, VIEWER, COLLABORATOR):
        try:
            for i, page in enumerate(contexts(name).pages):
                page.screenshot(path=SHOTS / f"sharing-failure-{name}-{i}.png")
                print(f"\n{name}'s page {i} at failure: {page.url}")
        except PlaywrightError:
            pass


def shot(page: Page, name: str) -> None:
    page.screenshot(path=SHOTS / f"sharing-{name}.png")


def log_in(page: Page, base: str, name: str) -> None:
    page.goto(f"{base}/hub/login")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(password(name))
    page.get_by_role("button", name="Sign In").click()
    expect(page).to_have_url(f"{base}/hub/home")


def dismiss_news(page: Page) -> None:
    """JupyterLab's "get notified about Jupyter news?" toast: answer it if it shows."""
    try:
        page.get_by_role("button", name="No", exact=True).click(timeout=3_000)
    except PlaywrightError:
        pass


def open_lab(page: Page, base: str, owner: str, project: str, path: str = "") -> None:
    page.goto(f"{base}/user/{owner}/{project}/lab" + (f"/tree/{quote(path)}" if path else ""))
    lab_ready(page)


def lab_ready(page: Page) -> None:
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    expect(page.locator("#filebrowser")).to_be_visible(timeout=60_000)
    dismiss_news(page)


def open_notebook(page: Page, name: str):
    """Open ``name`` from the file browser; the notebook panel."""
    page.locator("#filebrowser").get_by_text(name, exact=True).dblclick()
    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel.locator(".jp-Cell").first).to_be_visible(timeout=30_000)
    return panel


def cell_input(panel, index: int = 0):
    return panel.locator(".jp-Cell").nth(index).locator(".cm-content")


def server_answer(page: Page, method: str, api_path: str) -> int:
    """The status of a request from the page, as JupyterLab makes them (cookie + XSRF)."""
    return page.evaluate(
        """async ([method, url]) => {
            const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
            const r = await fetch(url, {method, headers: {'X-XSRFToken': decodeURIComponent(xsrf),
                'Content-Type': 'application/json'}, body: method === 'GET' ? undefined : '{}'});
            return r.status;
        }""",
        [method, api_path],
    )


def saved_by_server(user, name: str, text: str, within: float = 30) -> None:
    """Wait until the project's ``name`` on disk holds ``text`` (the server saved it)."""
    deadline = time.monotonic() + within
    path = f"/user/{OWNER}/{PROJECT}/api/contents/{quote(name)}"
    while time.monotonic() < deadline:
        got = user.api("GET", path)
        if got.status_code == 200 and text in json.dumps(got.json().get("content")):
            return
        time.sleep(0.5)
    raise AssertionError(f"{name} on disk never held {text!r}")


def share_dialog(page: Page):
    """Open the Share dialog from the top bar; the dialog and its frame."""
    page.locator(".jp-gpulab-ShareButton").click()
    dialog = page.locator("[data-gpulab=share-dialog]")
    expect(dialog).to_be_visible()
    frame = page.frame_locator("[data-gpulab=share-frame]")
    expect(frame.get_by_role("heading", name=f"Share {PROJECT}")).to_be_visible()
    return dialog, frame


def make_link(frame, role: str) -> str:
    """Make a link for ``role`` on the share page in the dialog; its full URL."""
    form = frame.locator("#link-form")
    form.get_by_label("role").select_option(role)
    form.get_by_role("button", name="Create link").click()
    link = frame.locator("#new-link input")
    expect(link).to_have_value(re.compile(r"/hub/accept-share\?code="))
    return link.input_value()


def accept(page: Page, link: str, role_text: str) -> None:
    """Open a share link, check what JupyterHub's page says, accept it."""
    page.goto(link)
    expect(page.locator("#share-offer")).to_contain_text(f"{OWNER} shares the project")
    expect(page.get_by_text(role_text)).to_be_visible()
    shot(page, "accept-" + ("read-only" if "not run code" in role_text else "collaborator"))
    page.get_by_role("button", name="Accept and open the project").click()
    # Project servers are the hub's own: no OAuth confirm page on the way.
    page.wait_for_url(re.compile(r"/user/"), timeout=60_000)


def test_owner_shares_viewer_reads_and_saves_a_copy(hub, people, projects, contexts,
                                                   shoot_on_failure):  # fmt: skip
    base = hub.url
    # 1. The owner writes a notebook in their project, with output to see.
    owner = contexts(OWNER).pages[0]
    open_lab(owner, base, OWNER, PROJECT)
    owner.locator(".jp-LauncherCard[data-category=Notebook]").first.click()
    panel = owner.locator(".jp-NotebookPanel:visible")
    expect(owner.get_by_role("tab", name="Untitled.ipynb")).to_be_visible()
    # The kernel has started (a cell run before that is not run at all).
    expect(owner.locator("#jp-main-statusbar")).to_contain_text("| Idle", timeout=60_000)
    cell_input(panel).click()
    owner.keyboard.insert_text(CODE)
    owner.keyboard.press("Shift+Enter")
    expect(panel.locator(".jp-OutputArea-output").first).to_have_text(OUTPUT, timeout=60_000)
    # The server has written the output to disk by itself (real-time collaboration) and
    # the tab has heard of it: a save within that moment meets jupyter-collaboration's
    # race, "File Changed" (docs/cells-on-the-server.md, known edges).
    saved_by_server(people[OWNER], "Untitled.ipynb", OUTPUT)
    owner.wait_for_timeout(1_000)
    # The first save asks for a name.
    owner.keyboard.press("Control+s")
    rename = owner.locator(".jp-Dialog")
    rename.locator("input[type=text]").fill(NOTEBOOK)
    rename.get_by_role("button", name="Rename and Save").click()
    expect(owner.get_by_role("tab", name=NOTEBOOK)).to_be_visible()
    expect(owner.locator("#filebrowser").get_by_text(NOTEBOOK, exact=True)).to_be_visible()
    # The owner sees no read-only notice.
    expect(owner.get_by_text(READ_ONLY_NOTICE)).to_be_hidden()

    # 2. Share: the dialog shows the hub's share page; a viewer link, with when it
    # expires in the reader's own time (never an ISO string) and a Copy button.
    dialog, frame = share_dialog(owner)
    link = make_link(frame, "viewer")
    expect(frame.locator("#access")).to_contain_text("viewer")
    expires = frame.locator("#new-link time")
    expect(expires).to_have_text(re.compile(r"^expires in 24 h, [A-Z][a-z]{2} \d{1,2} \d\d:\d\d$"))
    code_row = frame.locator("tr.share-code").last
    expect(code_row.locator("time")).to_have_text(re.compile(r"^expires in 24 h, "))
    for text in (frame.locator("#new-link").inner_text(), frame.locator("#access").inner_text()):
        assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", text), text
    owner.context.grant_permissions(["clipboard-read", "clipboard-write"])
    frame.get_by_role("button", name="Copy").click()
    expect(frame.locator("#new-link-copy")).to_have_text("Copied")
    assert owner.evaluate("navigator.clipboard.readText()") == link
    owner.wait_for_timeout(300)
    shot(owner, "dialog")
    dialog.get_by_role("button", name="Done").click()
    expect(dialog).to_have_count(0)

    # 3. The viewer opens the link: JupyterHub's page says whose project and what access.
    viewer = contexts(VIEWER).pages[0]
    accept(viewer, link, "not run code")

    # 4. They land in the owner's JupyterLab, told it is read-only, and read the notebook.
    viewer.wait_for_url(f"**/user/{OWNER}/{PROJECT}/lab**", timeout=60_000)
    lab_ready(viewer)
    expect(viewer.get_by_text(READ_ONLY_NOTICE)).to_be_visible()
    vpanel = open_notebook(viewer, NOTEBOOK)
    expect(cell_input(vpanel)).to_contain_text("accuracy 0.93")
    expect(vpanel.locator(".jp-OutputArea-output").first).to_have_text(OUTPUT)
    # No kernel for them: JupyterLab does not start one, and the server refuses it.
    expect(vpanel.locator(".jp-Toolbar-kernelName")).to_have_text("No Kernel")
    cell_input(vpanel).click()
    viewer.keyboard.press("Shift+Enter")
    notice = viewer.get_by_text("code does not run here")
    expect(notice).to_be_visible()
    expect(viewer.get_by_text("Error Starting Kernel")).to_have_count(0)
    expect(viewer.get_by_text("Select Kernel", exact=True)).to_have_count(0)
    # What they read stays: the output is not cleared, nothing runs.
    expect(vpanel.locator(".jp-OutputArea-output").first).to_have_text(OUTPUT)
    expect(vpanel.locator(".jp-InputPrompt").first).to_have_text("[1]:")
    # Only collaborators may share on: no Share button for a viewer.
    expect(viewer.locator(".jp-gpulab-ShareButton")).to_be_hidden()
    viewer.wait_for_timeout(500)  # the notice slides in
    shot(viewer, "viewer-read-only")
    server = f"/user/{OWNER}/{PROJECT}/api"
    assert server_answer(viewer, "POST", f"{server}/kernels") == 403
    assert server_answer(viewer, "POST", f"{server}/sessions") == 403
    assert server_answer(viewer, "GET", f"{server}/contents/{NOTEBOOK}") == 200
    assert not [e for e in viewer.errors if "gpulab" in e.lower()], viewer.errors

    # 5. Save a copy (notebook toolbar): the hub's page, then their own project.
    with viewer.context.expect_page() as opened:
        vpanel.locator(".jp-Toolbar").get_by_role("button", name="Save a copy").click()
    copy_page = opened.value
    expect(copy_page.locator("#copy-source")).to_contain_text(f"{OWNER}'s project {PROJECT}")
    copy_page.get_by_label(VIEWER_PROJECT, exact=True).check()
    shot(copy_page, "copy-page")
    copy_page.locator("#copy-submit").click()
    copy_page.wait_for_url(f"**/user/{VIEWER}/{VIEWER_PROJECT}/lab/tree/**", timeout=60_000)
    expect(copy_page.get_by_role("tab", name=COPY)).to_be_visible(timeout=60_000)
    lab_ready(copy_page)
    copied = copy_page.locator(".jp-NotebookPanel:visible")
    expect(copied.locator(".jp-OutputArea-output").first).to_have_text(OUTPUT)
    # Their own project: no read-only notice, and their copy runs.
    expect(copy_page.get_by_text(READ_ONLY_NOTICE)).to_be_hidden()
    shot(copy_page, "copy-landed")
    mine = people[VIEWER].api("GET", f"/user/{VIEWER}/{VIEWER_PROJECT}/api/contents/{quote(COPY)}")
    assert mine.status_code == 200 and mine.json()["type"] == "notebook", mine.text

    # For docs/sharing.md, only from a passing run.
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SHOTS / "sharing-dialog.png", DOCS_IMG / "share-dialog.png")
    shutil.copyfile(SHOTS / "sharing-accept-read-only.png", DOCS_IMG / "share-accept.png")


def test_collaborator_sees_the_owners_edit_live(hub, people, projects, contexts,
                                                shoot_on_failure):  # fmt: skip
    """Needs jupyter-collaboration in the project image (real-time collaboration)."""
    base = hub.url
    owner = contexts(OWNER).pages[0]
    open_lab(owner, base, OWNER, PROJECT, NOTEBOOK)
    dialog, frame = share_dialog(owner)
    link = make_link(frame, "collaborator")
    dialog.get_by_role("button", name="Done").click()

    collab = contexts(COLLABORATOR).pages[0]
    accept(collab, link, "run code in it")
    collab.wait_for_url(f"**/user/{OWNER}/{PROJECT}/lab**", timeout=60_000)
    lab_ready(collab)
    cpanel = open_notebook(collab, NOTEBOOK)
    expect(collab.get_by_text(READ_ONLY_NOTICE)).to_be_hidden()
    expect(cell_input(cpanel)).to_contain_text("accuracy 0.93")

    # The owner edits the cell; the collaborator's page shows it, with no reload.
    marker = "edited live by the owner"
    collab.evaluate("window.__gpulabNotReloaded = true")
    panel = owner.locator(".jp-NotebookPanel:visible")
    cell_input(panel).click()
    owner.keyboard.press("Control+End")
    owner.keyboard.type(f"\n# {marker}")
    expect(cell_input(cpanel)).to_contain_text(marker, timeout=20_000)
    assert collab.evaluate("window.__gpulabNotReloaded === true")
    shot(collab, "collaborator-live")

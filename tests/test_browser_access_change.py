"""What a person in JupyterLab sees when their access to a shared project changes, in
Chromium against a real hub and a real project (issue 24): a collaborator with a
notebook and a live kernel open, whose share the owner revokes, reads one gpulab
dialog with the way home, never "Kernel died"; a viewer's Run, Interrupt and
Restart buttons (toolbar and Run menu) are disabled and clicking them runs nothing.

Screenshots: docs/img/revoked.png and docs/img/viewer-toolbar.png from passing runs.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from browser_kit import DOCS_IMG, SHOTS
from hubclient import HubUser
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect
from security.people import make_user, notebook, password, share_by_link

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

OWNER, PROJECT, TITLE = "acowner", "ac-first", "Ac First"
COLLAB, VIEWER = "accollab", "acviewer"
NOTEBOOK, VIEWER_NOTEBOOK = "train.ipynb", "read-me.ipynb"
CODE = "x = 6 * 7\nprint('answer', x)"
# Words JupyterLab shows when it believes a kernel died or restarts.
KERNEL_WORDS = ("Kernel died", "Dead kernel", "Kernel Restarting", "Kernel Dead")
# GPULAB_REVOKE_WITHIN_S of the tests' hub (conftest.py), plus a page's reaction.
REVOKE_WITHIN_S = 8
# The notebooks name their kernel, as a notebook saved by JupyterLab does: opening one
# starts (or, for a viewer, would start) python3 without JupyterLab's kernel picker.
KERNEL_METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


@pytest.fixture(scope="module")
def people(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    admin.new_token()
    return {n: make_user(hub, admin, n) for n in (OWNER, COLLAB, VIEWER)}


@pytest.fixture(scope="module")
def project(people):
    owner = people[OWNER]
    r = owner.api("POST", f"/hub/api/users/{OWNER}/servers/{PROJECT}",
                  json={"display_name": TITLE})  # fmt: skip
    assert r.status_code in (201, 202), r.text
    owner.stop_project(PROJECT)
    owner.start_project(PROJECT)
    for path in (NOTEBOOK, VIEWER_NOTEBOOK):
        content = notebook(CODE)
        content["metadata"] = dict(KERNEL_METADATA)
        body = {"type": "notebook", "format": "json", "content": content}
        put = owner.api("PUT", f"/user/{OWNER}/{PROJECT}/api/contents/{path}", json=body)
        assert put.status_code in (200, 201), put.text
    yield
    owner.stop_project(PROJECT)


def page_of(browser, hub, name: str) -> Page:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(password(name))
    page.get_by_role("button", name="Sign In").click()
    expect(page).to_have_url(f"{hub.url}/hub/home")
    return page


def open_notebook(page: Page, base: str, path: str = NOTEBOOK):
    page.goto(f"{base}/user/{OWNER}/{PROJECT}/lab/tree/{path}")
    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel.locator(".jp-Cell").first).to_be_visible(timeout=90_000)
    with contextlib.suppress(PlaywrightError):  # the news toast shows only sometimes
        page.get_by_role("button", name="No", exact=True).click(timeout=3_000)
    return panel


def no_kernel_words(page: Page) -> None:
    text = page.locator("body").inner_text()
    for words in KERNEL_WORDS:
        assert words not in text, f"{words!r} shown: {text[-600:]}"


def test_revoked_collaborator_reads_gpulabs_words_not_kernel_died(hub, browser, people, project):
    base = hub.url
    share_by_link(people[OWNER], PROJECT, people[COLLAB], "collaborator")
    collab = page_of(browser, hub, COLLAB)
    panel = open_notebook(collab, base)
    # A live kernel: the collaborator runs the cell and reads its output.
    panel.locator(".jp-Cell").first.click()
    collab.keyboard.press("Shift+Enter")
    output = panel.locator(".jp-OutputArea-output").first
    expect(output).to_contain_text("answer 42", timeout=60_000)
    kernels = people[OWNER].api("GET", f"/user/{OWNER}/{PROJECT}/api/kernels").json()
    assert kernels, "no kernel runs"

    r = people[OWNER].api("PATCH", f"/hub/api/shares/{OWNER}/{PROJECT}", json={"user": COLLAB})
    assert r.status_code == 200, r.text
    revoked_at = time.monotonic()
    dialog = collab.locator(".jp-Dialog")
    expect(dialog).to_contain_text(
        f"{OWNER} stopped sharing “{TITLE}” with you. Your open notebooks here are closed; "
        "nothing of yours was lost.",
        timeout=(REVOKE_WITHIN_S + 12) * 1000,
    )
    waited = time.monotonic() - revoked_at
    assert waited <= REVOKE_WITHIN_S + 12, waited
    expect(dialog).to_have_count(1)
    expect(dialog.locator("#gpulab-access-ended-home")).to_have_attribute("href", "/hub/home")
    expect(collab.locator(".jp-NotebookPanel")).to_have_count(0)  # closed
    status = collab.locator("[data-gpulab=status]")
    expect(status).to_have_text("GPU — no access", timeout=30_000)
    # Only once, and nothing of JupyterLab's kernel dialogs, however long they look.
    collab.wait_for_timeout(12_000)
    expect(collab.locator(".jp-Dialog")).to_have_count(1)
    no_kernel_words(collab)
    collab.screenshot(path=SHOTS / "access-revoked.png")
    collab.screenshot(path=DOCS_IMG / "revoked.png")
    # The kernel was the owner's and is alive.
    after = people[OWNER].api("GET", f"/user/{OWNER}/{PROJECT}/api/kernels").json()
    assert [k["id"] for k in after] == [k["id"] for k in kernels]
    assert all(k["execution_state"] != "dead" for k in after), after
    dialog.get_by_role("button", name="Go to your projects").click()
    expect(collab).to_have_url(f"{base}/hub/home")


def test_viewers_run_interrupt_restart_are_disabled(hub, browser, people, project):
    base = hub.url
    share_by_link(people[OWNER], PROJECT, people[VIEWER], "viewer")
    viewer = page_of(browser, hub, VIEWER)
    panel = open_notebook(viewer, base, VIEWER_NOTEBOOK)
    toolbar = panel.locator(".jp-NotebookPanel-toolbar")
    for name in ("run", "interrupt", "restart", "restart-and-run"):
        button = toolbar.locator(f"[data-jp-item-name={name}] button")
        expect(button).to_be_disabled()
        expect(button).to_have_attribute("aria-disabled", "true")
    viewer.screenshot(path=SHOTS / "access-viewer-toolbar.png")
    viewer.screenshot(path=DOCS_IMG / "viewer-toolbar.png")
    # Clicking runs nothing: no output appears, no kernel starts.
    toolbar.locator("[data-jp-item-name=run] button").click(force=True)
    viewer.wait_for_timeout(2_000)
    expect(panel.locator(".jp-OutputArea-output")).to_have_count(0)
    sessions = people[OWNER].api("GET", f"/user/{OWNER}/{PROJECT}/api/sessions").json()
    assert VIEWER_NOTEBOOK not in [s["path"] for s in sessions], sessions
    # The Run menu's items are disabled too.
    viewer.locator(".lm-MenuBar-itemLabel", has_text="Run").click()
    menu = viewer.locator(".lm-Menu").last
    item = menu.locator(".lm-Menu-item", has_text="Run Selected Cell").first
    expect(item).to_have_attribute("aria-disabled", "true")
    restart = menu.locator(".lm-Menu-item", has_text="Run All Cells").first
    expect(restart).to_have_attribute("aria-disabled", "true")
    viewer.keyboard.press("Escape")

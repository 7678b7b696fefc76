"""Sharing as people meet it, in Chromium against a real hub and a real project: what
the share form offers first, what a link's access lasts, the accept page's words,
no OAuth confirm page, a collaborator's own JupyterLab layout (not the owner's), what a
collaborator whose access ended reads, a new link accepted while their old tab still
polls the project, and a copy into a new project named in free text (issue 24)."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import urlencode

import pytest
from browser_kit import SHOTS
from hubclient import HubUser
from playwright.sync_api import Page, expect
from security.people import make_user, password

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

OWNER, PROJECT, TITLE = "bwowner", "bw-first", "Bw First"
VIEWER, COLLAB = "bwviewer", "bwcollab"
NOTEBOOK = "result.ipynb"


@pytest.fixture(scope="module")
def people(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    admin.new_token()
    return {n: make_user(hub, admin, n) for n in (OWNER, VIEWER, COLLAB)}


@pytest.fixture(scope="module")
def project(people):
    owner = people[OWNER]
    r = owner.api("POST", f"/hub/api/users/{OWNER}/servers/{PROJECT}",
                  json={"display_name": TITLE})  # fmt: skip
    assert r.status_code in (201, 202), r.text
    owner.stop_project(PROJECT)
    owner.start_project(PROJECT)
    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    put = owner.api("PUT", f"/user/{OWNER}/{PROJECT}/api/contents/{NOTEBOOK}",
                    json={"type": "notebook", "content": nb})  # fmt: skip
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


def make_link(owner: Page, role: str | None = None) -> str:
    form = owner.locator("#link-form")
    if role:
        form.get_by_label("role").select_option(role)
    form.get_by_role("button", name="Create link").click()
    link = owner.locator("#new-link input")
    expect(link).to_have_value(re.compile(r"/hub/accept-share\?code="))
    return link.input_value()


def accept(page: Page, link: str) -> None:
    """Accept on gpulab's page; the project opens with no OAuth confirm page between."""
    seen: list[str] = []
    page.on("framenavigated", lambda f: seen.append(f.url) if f == page.main_frame else None)
    page.locator("#share-accept").click()
    page.wait_for_url(f"**/user/{OWNER}/{PROJECT}/lab**", timeout=90_000)
    # The authorize URL only redirects now: no page of it is ever shown.
    assert not [u for u in seen if "/oauth2/authorize" in u], seen
    expect(page.get_by_text("An application is requesting authorization")).to_have_count(0)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)


def dock_tab(page: Page, name: str):
    """The main area's tab of the document ``name``."""
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(
        has=page.locator(".lm-TabBar-tabLabel", has_text=re.compile(rf"^{re.escape(name)}$"))
    )


def test_share_link_accept_and_revoke_in_a_persons_words(hub, browser, people, project):
    base = hub.url
    owner = page_of(browser, hub, OWNER)
    owner.goto(f"{base}/hub/gpulab/share/{PROJECT}")
    # The safer role first, for people and links; a link's access ends with it by default.
    assert owner.locator("#share-role").input_value() == "viewer"
    assert owner.locator("#link-role").input_value() == "viewer"
    expect(owner.locator("#link-lasts")).to_have_value("link")
    expect(owner.locator("#link-lasts option")).to_have_text(
        ["access ends when the link expires", "access lasts until I revoke it"]
    )
    viewer_link = make_link(owner)
    expect(owner.locator("#share-message")).to_contain_text(
        "(viewer); it works for 24 h, only for logged-in users; access through it ends when it "
        "expires."
    )
    expect(owner.locator("#new-link-lasts")).to_contain_text("so does the access of everyone")
    owner.screenshot(path=SHOTS / "sharing-words-share-page.png")

    # The viewer reads who shares what, as what, until when, and who they are.
    viewer = page_of(browser, hub, VIEWER)
    viewer.goto(viewer_link)
    expect(viewer.locator("#share-offer")).to_have_text(
        re.compile(
            rf"{OWNER} shares the project ‘{TITLE}’ with you as\s+a viewer:\s+you can read its "
            r"notebooks and save copies, not run code\."
        )
    )
    expect(viewer.locator("#share-lasts")).to_contain_text(
        "Your access ends when this link expires"
    )
    expect(viewer.locator("#share-signed-in")).to_contain_text(f"Signed in as {VIEWER}")
    expect(viewer.locator("#share-logout")).to_have_attribute("href", re.compile(r"/hub/logout$"))
    expect(viewer.get_by_text("Access user servers via API or browser")).to_have_count(0)
    expect(viewer.get_by_text(f"{OWNER}'s server")).to_have_count(0)
    viewer.screenshot(path=SHOTS / "sharing-words-accept.png")
    accept(viewer, viewer_link)

    # A collaborator by link; the owner revokes the link and with it their access.
    owner.goto(f"{base}/hub/gpulab/share/{PROJECT}")
    collab_link = make_link(owner, "collaborator")
    # The owner works with the notebook open: JupyterLab keeps that layout (the
    # server's "default" workspace).
    owner_lab = owner.context.new_page()
    owner_lab.goto(f"{base}/user/{OWNER}/{PROJECT}/lab/tree/{NOTEBOOK}")
    expect(dock_tab(owner_lab, NOTEBOOK)).to_be_visible(timeout=90_000)
    saved = f"{base}/user/{OWNER}/{PROJECT}/lab/api/workspaces/default"
    deadline = time.monotonic() + 60
    while NOTEBOOK not in owner_lab.request.get(saved).text() and time.monotonic() < deadline:
        owner_lab.wait_for_timeout(500)
    assert NOTEBOOK in owner_lab.request.get(saved).text()
    collab = page_of(browser, hub, COLLAB)
    collab.goto(collab_link)
    expect(collab.locator("#share-offer")).to_contain_text("as a collaborator")
    accept(collab, collab_link)
    # A second tab of theirs on the project stays open (JupyterLab polls the server).
    old_tab = collab.context.new_page()
    answers: list[int] = []
    old_tab.on(
        "response",
        lambda r: answers.append(r.status) if f"/user/{OWNER}/{PROJECT}/api/" in r.url else None,
    )
    old_tab.goto(f"{base}/user/{OWNER}/{PROJECT}/lab")
    expect(old_tab.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    # The collaborator's JupyterLab opens on a layout of their own, not the owner's.
    expect(collab).to_have_url(re.compile(rf"/lab/workspaces/gpulab-{COLLAB}"))
    expect(collab.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").first).to_be_visible()
    expect(dock_tab(collab, NOTEBOOK)).to_have_count(0)
    collab.screenshot(path=SHOTS / "sharing-words-own-layout.png")
    # ...and the owner's is as they left it.
    owner_lab.reload()
    expect(dock_tab(owner_lab, NOTEBOOK)).to_be_visible(timeout=90_000)
    expect(owner_lab).not_to_have_url(re.compile(r"/workspaces/"))
    owner_lab.close()
    row = owner.locator("tr.share-code[data-role=collaborator]")
    owner.goto(f"{base}/hub/gpulab/share/{PROJECT}")
    expect(row.locator(".lasts")).to_have_text("access through it ends then")
    row.get_by_role("button", name="Revoke link and its access").click()
    expect(owner.locator("#share-message")).to_contain_text("the access it gave ended")
    expect(owner.locator("tr.share-user", has_text=COLLAB)).to_have_count(0)

    # Their next page there says what happened, with a way home (within the revoke window).
    deadline_ms = 30_000
    waited = 0
    while True:
        collab.goto(f"{base}/user/{OWNER}/{PROJECT}/lab")
        if collab.locator("#gpulab-no-access").count() or waited >= deadline_ms:
            break
        collab.wait_for_timeout(2_000)
        waited += 2_000
    expect(collab.get_by_role("heading")).to_have_text(
        f"{OWNER} stopped sharing this project with you"
    )
    expect(collab.get_by_text("403 : Forbidden")).to_have_count(0)
    collab.screenshot(path=SHOTS / "sharing-words-revoked.png")
    collab.locator("#gpulab-home-link").click()
    expect(collab).to_have_url(f"{base}/hub/home")

    # Shared with again by a new link while their old tab still asks the project for
    # things (JupyterLab's polls, refused since the revoke): accepting opens the project,
    # not "stopped sharing this project with you".
    deadline = time.monotonic() + 60
    while 403 not in answers and time.monotonic() < deadline:
        old_tab.wait_for_timeout(500)
    assert 403 in answers, answers  # the old tab is refused now
    owner.goto(f"{base}/hub/gpulab/share/{PROJECT}")
    again_link = make_link(owner)
    collab.goto(again_link)
    expect(collab.locator("#share-offer")).to_contain_text("as a viewer")
    collab.locator("#share-accept").click()
    collab.wait_for_url(f"**/user/{OWNER}/{PROJECT}/lab**", wait_until="domcontentloaded")
    expect(collab.locator("#gpulab-no-access")).to_have_count(0)
    expect(collab.get_by_text("stopped sharing this project with you")).to_have_count(0)
    expect(collab.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    expect(collab.locator("body")).to_have_attribute("data-gpulab-access", "read")
    collab.screenshot(path=SHOTS / "sharing-words-shared-again.png")
    old_tab.close()


def test_save_a_copy_into_a_new_project_named_in_free_text(hub, browser, people, project):
    """A viewer saves a copy into a new project called "Bob Copy"."""
    base = hub.url
    # The owner shares with them by name: viewer unless chosen otherwise.
    owner = page_of(browser, hub, OWNER)
    owner.goto(f"{base}/hub/gpulab/share/{PROJECT}")
    owner.locator("#share-form").get_by_label("name").fill(VIEWER)
    owner.locator("#share-form").get_by_role("button", name="Share").click()
    expect(owner.locator("#share-message")).to_have_text(
        f"Shared with user {VIEWER} as viewer. Their access lasts until you revoke it."
    )
    viewer = page_of(browser, hub, VIEWER)
    query = urlencode({"owner": OWNER, "project": PROJECT, "path": NOTEBOOK})
    viewer.goto(f"{base}/hub/gpulab/copy?{query}")
    viewer.locator("#new-project").fill("Bob Copy")
    viewer.locator("#copy-submit").click()
    expect(viewer.get_by_text("Please match the requested format")).to_have_count(0)
    viewer.wait_for_url(re.compile(r"/user/bwviewer/bob-copy/"), timeout=300_000)
    me = people[VIEWER].api("GET", f"/hub/api/users/{VIEWER}?include_stopped_servers=1")
    servers = me.json()["servers"]
    assert servers["bob-copy"]["display_name"] == "Bob Copy", json.dumps(servers)[:500]
    people[VIEWER].stop_project("bob-copy")

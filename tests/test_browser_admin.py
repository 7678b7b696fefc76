"""The admin overview in Chromium, on the session hub: the admin opens it from the nav
bar, sees a user's running project with its GPU holding (or "no GPU" on a host
without one), stops it with the button and sees it stopped, approves a sign-up that
waits, and deletes the project (asked first; gpulab's deletion archives its files);
a plain user's POST of the same approval is refused. What the page reads
(records, disk use) is tested on real files in test_admin_page.py."""

from __future__ import annotations

import re

import pytest
from browser_kit import SHOTS, jupyterhub_admin
from hubclient import HubUser
from playwright.sync_api import expect
from security.people import log_in_admin, make_user, password

from gpulab_hub import gpus

# --- the real hub, in Chromium ---

OWNER, PROJECT, WAITING = "admowner", "admrun", "admwait"


@pytest.fixture(scope="module")
def running(hub):
    """An approved user's running project, and a sign-up waiting for approval."""
    admin = log_in_admin(hub)
    owner = make_user(hub, admin, OWNER)
    owner.start_project(PROJECT)
    waiting = HubUser(hub.url, WAITING, password(WAITING))
    assert waiting.signup().status_code == 200
    assert waiting.login().status_code != 302  # not approved: no login yet
    yield owner, waiting
    model = owner.api("GET", f"/hub/api/users/{OWNER}").json()
    if PROJECT in model.get("servers", {}):
        owner.stop_project(PROJECT)


def row(page, owner: str, project: str):
    return page.locator(f'tr.admin-project[data-owner="{owner}"][data-project="{project}"]')


@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.usefixtures("show_logs_on_failure")
def test_the_admin_stops_a_project_and_approves_a_sign_up_from_the_page(hub, running, browser):
    owner, waiting = running
    # Not an admin: the page and its actions are refused, and nothing is stopped.
    assert owner.http.get(f"{hub.url}/hub/gpulab/admin", timeout=30).status_code == 403
    xsrf = owner.http.cookies.get("_xsrf", path="/hub/")
    refused = owner.http.post(
        f"{hub.url}/hub/gpulab/admin",
        data={"_xsrf": xsrf, "action": "approve", "name": WAITING},
        timeout=30,
    )
    assert refused.status_code == 403
    assert waiting.login().status_code != 302  # still waiting

    gpu_host = bool(gpus.inventory().devices)
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        page.goto(f"{hub.url}/hub/login")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(hub.admin_password)
        page.get_by_role("button", name="Sign In").click()
        expect(page).to_have_url(re.compile(r".*/hub/(home|admin).*"))
        page.locator('[data-gpulab="nav-admin"]').click()
        expect(page).to_have_url(f"{hub.url}/hub/gpulab/admin")
        mine = row(page, OWNER, PROJECT)
        expect(mine).to_have_attribute("data-state", "running")
        expect(mine.locator(".gpus")).to_contain_text("GPU" if gpu_host else "no GPU")
        if not gpu_host:
            expect(page.locator("#admin-gpus-none")).to_contain_text("This host has no GPU")
        expect(page.locator(f'tr.admin-waiting[data-user="{WAITING}"]')).to_be_visible()
        user_row = page.locator(f'tr.admin-user[data-user="{OWNER}"]')
        expect(user_row.locator(".disk")).to_have_text(re.compile(r"\d[\d.]* (bytes|KiB|MiB|GiB)"))
        page.screenshot(path=SHOTS / "admin-page.png", full_page=True)

        mine.get_by_role("button", name="Stop").click()
        expect(page.locator("#admin-said")).to_have_text(
            f"Stopped {OWNER}'s project \u201c{PROJECT}\u201d; the GPUs it held are free."
        )
        expect(row(page, OWNER, PROJECT)).to_have_attribute("data-state", "stopped")
        expect(row(page, OWNER, PROJECT).get_by_role("button", name="Stop")).to_have_count(0)

        page.locator(f'tr.admin-waiting[data-user="{WAITING}"]').get_by_role(
            "button", name="Approve"
        ).click()
        expect(page.locator("#admin-said")).to_have_text(
            f"Approved the account \u201c{WAITING}\u201d: they can log in now."
        )
        expect(page.locator(f'tr.admin-waiting[data-user="{WAITING}"]')).to_have_count(0)
        expect(page.locator(f'tr.admin-user[data-user="{WAITING}"]')).to_be_visible()

        # Delete asks first, then runs gpulab's deletion (the files go to the archive).
        row(page, OWNER, PROJECT).get_by_role("button", name="Delete…").click()
        expect(page.locator("#admin-confirm")).to_contain_text(
            f"Delete {OWNER}'s project \u201c{PROJECT}\u201d?"
        )
        expect(row(page, OWNER, PROJECT)).to_have_count(1)  # nothing deleted yet
        page.locator("#admin-confirm").get_by_role("button", name="Delete for good").click()
        expect(page.locator("#admin-said")).to_have_text(
            re.compile(
                f"Deleted {OWNER}'s project \u201c{PROJECT}\u201d. Its files were moved to "
                f"the hub's archive as deleted/{OWNER}-\\d{{8}}T\\d{{6}}Z"
            )
        )
        expect(row(page, OWNER, PROJECT)).to_have_count(0)
    finally:
        context.close()
    # What the page said is what happened: the server is gone, the account logs in.
    servers = owner.api("GET", f"/hub/api/users/{OWNER}").json()["servers"]
    assert PROJECT not in servers
    assert not (hub.home / "projects" / OWNER / PROJECT).exists()
    archived = list((hub.home / "hub" / "deleted").glob(f"{OWNER}-*/projects/{PROJECT}"))
    assert len(archived) == 1, archived
    assert waiting.login().status_code == 302
    assert (SHOTS / "admin-page.png").stat().st_size > 10_000


GONER, GONER_PROJECT, SCRIPTED = "admgoner", "admkept", "admscript"


@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.usefixtures("show_logs_on_failure")
def test_a_user_is_deleted_only_when_the_admin_typed_their_name(hub, browser):
    """JupyterHub's own admin page deletes a user (the account and all their projects)
    on one click of Delete user; under gpulab that click deletes nothing, and gpulab's
    admin overview deletes them once the admin typed the user's name, as deleting one
    project asks for its name."""
    admin = log_in_admin(hub)
    goner = make_user(hub, admin, GONER)
    goner.make_project(GONER_PROJECT, "Kept Work")
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        page.goto(f"{hub.url}/hub/login")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(hub.admin_password)
        page.get_by_role("button", name="Sign In").click()
        expect(page).to_have_url(re.compile(r".*/hub/(home|admin).*"))

        # JupyterHub's admin page: Edit User, Delete user (one click, no question).
        jupyterhub_admin(page, hub.url, GONER)
        user_rows = page.locator("tr.user-row").filter(has_text=GONER).locator("visible=true")
        expect(user_rows).to_have_count(1)  # the project's row
        user_rows.get_by_role("button", name="Edit User").click()
        page.get_by_test_id("delete-user").click()
        expect(page.get_by_text("Failed to edit user.")).to_be_visible()
        page.screenshot(path=SHOTS / "admin-jupyterhub-delete-refused.png", full_page=True)
        # ...and the user and their project are all there.
        model = admin.api("GET", f"/hub/api/users/{GONER}?include_stopped_servers=1")
        assert model.status_code == 200 and GONER_PROJECT in model.json()["servers"]
        assert goner.login().status_code == 302
        # The page says where users are deleted.
        expect(page.locator("[data-gpulab=admin-delete-user]")).to_contain_text(
            "deletes nobody here"
        )

        # gpulab's admin overview: Delete… asks, with what goes; a mistyped name deletes
        # nothing; their name typed, the user and their project are deleted.
        page.goto(f"{hub.url}/hub/gpulab/admin")
        user_row = page.locator(f'tr.admin-user[data-user="{GONER}"]')
        user_row.get_by_role("button", name="Delete…").click()
        ask = page.locator("#admin-confirm-user")
        expect(ask).to_contain_text(f"Delete the user {GONER} and all their projects?")
        expect(ask).to_contain_text(f"Their 1 project ({GONER_PROJECT})")
        ask.get_by_label("Type their name").fill(GONER + "x")
        ask.get_by_role("button", name="Delete the user for good").click()
        expect(page.locator("#admin-confirm-user-mistyped")).to_contain_text("nothing was deleted")
        assert admin.api("GET", f"/hub/api/users/{GONER}").status_code == 200
        page.screenshot(path=SHOTS / "admin-delete-user-asks.png", full_page=True)
        ask.get_by_label("Type their name").fill(GONER)
        ask.get_by_role("button", name="Delete the user for good").click()
        expect(page.locator("#admin-said")).to_have_text(
            f"Deleted the user {GONER} and their 1 project."
        )
        expect(page.locator(f'tr.admin-user[data-user="{GONER}"]')).to_have_count(0)
        # the admin's own row has no Delete…
        me = page.locator('tr.admin-user[data-user="admin"]')
        expect(me.get_by_role("button", name="Delete…")).to_have_count(0)
    finally:
        context.close()
    assert admin.api("GET", f"/hub/api/users/{GONER}").status_code == 404
    assert goner.login().status_code != 302

    # Through the API: refused unless the request names the user again.
    scripted = make_user(hub, admin, SCRIPTED)
    refused = admin.api("DELETE", f"/hub/api/users/{SCRIPTED}")
    assert refused.status_code == 400, refused.text
    assert f"?confirm={SCRIPTED}" in refused.json()["message"]
    assert admin.api("GET", f"/hub/api/users/{SCRIPTED}").status_code == 200
    wrong = admin.api("DELETE", f"/hub/api/users/{SCRIPTED}", params={"confirm": GONER})
    assert wrong.status_code == 400
    done = admin.api("DELETE", f"/hub/api/users/{SCRIPTED}", params={"confirm": SCRIPTED})
    assert done.status_code == 204, done.text
    assert admin.api("GET", f"/hub/api/users/{SCRIPTED}").status_code == 404
    assert scripted.login().status_code != 302

"""Shared with me (/hub/gpulab/shared): the recipient's list, leaving a share, and
starting the owner's stopped project, against a real hub and a real container."""

from __future__ import annotations

import time
from html import unescape

import pytest
from hubclient import HubUser

from gpulab_hub.sharing import REVOKE_WITHIN_S, roles

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT = "rcalice", "rc-one"
COLLAB, VIEWER, STRANGER = "rcbob", "rccarol", "rcdave"
GROUP = "rcteam"
PAGE = "/hub/gpulab/shared"
CONTENTS = f"/user/{OWNER}/{PROJECT}/api/contents"


def make_user(hub, admin: HubUser, name: str) -> HubUser:
    user = HubUser(hub.url, name, f"{name}-Passw0rd-long")
    assert user.signup().status_code == 200
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def post(user: HubUser, path: str, follow=True, **form):
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    return user.http.post(
        user.base + path, data={"_xsrf": xsrf, **form}, allow_redirects=follow, timeout=60
    )


def share_by_link(owner: HubUser, role: str, user: HubUser) -> None:
    r = owner.api(
        "POST",
        f"/hub/api/share-codes/{OWNER}/{PROJECT}",
        json={"scopes": roles.share_scopes(role, OWNER, PROJECT), "expires_in": 3600},
    )
    assert r.status_code == 200, r.text
    code = r.json()["code"]
    user.http.get(user.base + f"/hub/accept-share?code={code}", timeout=10)
    r = post(user, "/hub/accept-share", follow=False, code=code)
    assert r.status_code == 302, r.text


def wait_status(user: HubUser, path: str, status: int, within: float) -> int:
    deadline = time.monotonic() + within
    while True:
        got = user.api("GET", path).status_code
        if got == status or time.monotonic() > deadline:
            return got
        time.sleep(1)


def row(page_text: str, owner: str, project: str) -> str:
    """The table row of one received share ('' if absent)."""
    start = page_text.find(f'data-owner="{owner}" data-project="{project}"')
    if start < 0:
        return ""
    return page_text[start : page_text.find("</tr>", start)]


@pytest.fixture(scope="module")
def admin(hub):
    a = HubUser(hub.url, "admin", hub.admin_password)
    assert a.login().status_code == 302
    a.new_token()
    return a


@pytest.fixture(scope="module")
def people(hub, admin):
    people = {n: make_user(hub, admin, n) for n in (OWNER, COLLAB, VIEWER, STRANGER)}
    people[OWNER].start_project(PROJECT)
    share_by_link(people[OWNER], "collaborator", people[COLLAB])
    r = admin.api("POST", f"/hub/api/groups/{GROUP}", json={"users": [VIEWER]})
    assert r.status_code == 201, r.text
    r = post(
        people[OWNER], f"/hub/gpulab/share/{PROJECT}", action="group", name=GROUP, role="viewer"
    )
    assert r.status_code == 200, r.text
    yield people
    if people[OWNER].api("GET", f"/hub/api/users/{OWNER}").json()["servers"]:
        people[OWNER].stop_project(PROJECT)


def test_shared_with_me_lists_role_state_and_open_link(people):
    bob, carol, dave = people[COLLAB], people[VIEWER], people[STRANGER]
    page = bob.http.get(bob.base + PAGE, timeout=30)
    assert page.status_code == 200
    mine = row(page.text, OWNER, PROJECT)
    assert "collaborator" in mine
    assert f'href="/user/{OWNER}/{PROJECT}/"' in mine  # Open, the server runs
    assert "Leave" in mine

    # Through a group: listed, but a group's share is not the member's to leave.
    page = carol.http.get(carol.base + PAGE, timeout=30)
    theirs = row(page.text, OWNER, PROJECT)
    assert "viewer" in theirs and f"through group {GROUP}" in theirs
    assert "Leave" not in theirs and "only rcalice or an admin can end it" in theirs
    r = post(carol, PAGE, action="leave", owner=OWNER, project=PROJECT)
    assert r.status_code == 400 and "cannot leave a group" in r.text
    assert f"through group {GROUP}" in row(r.text, OWNER, PROJECT)  # still shared

    # The home page lists it under "Shared with me", with the link to this page.
    home = bob.http.get(bob.base + "/hub/home", timeout=30)
    assert 'href="/hub/gpulab/shared"' in home.text
    shared = home.text.split('id="gpulab-shared-with-me"', 1)[1]
    assert f'data-owner="{OWNER}" data-project="{PROJECT}"' in shared

    # Someone with nothing shared sees nothing of it, and cannot leave or start it.
    page = dave.http.get(dave.base + PAGE, timeout=30)
    assert PROJECT not in page.text and "No project is shared with you" in page.text
    assert post(dave, PAGE, action="leave", owner=OWNER, project=PROJECT).status_code == 404
    assert post(dave, PAGE, action="start", owner=OWNER, project=PROJECT).status_code == 404


def test_start_only_when_the_owner_allowed_it(people):
    alice, bob, carol = people[OWNER], people[COLLAB], people[VIEWER]
    alice.stop_project(PROJECT)
    page = bob.http.get(bob.base + PAGE, timeout=30)
    mine = row(page.text, OWNER, PROJECT)
    assert f"{OWNER}'s project is not running." in mine
    assert "has not allowed collaborators" in mine and ">Start<" not in mine
    r = post(bob, PAGE, action="start", owner=OWNER, project=PROJECT)
    assert r.status_code == 403 and "has not allowed" in r.text
    assert not alice.api("GET", f"/hub/api/users/{OWNER}").json()["servers"]

    # The owner allows it on the share page; a viewer still may not.
    r = post(
        alice, f"/hub/gpulab/share/{PROJECT}", action="settings", allow="collaborators_may_start"
    )
    assert r.status_code == 200, r.text
    assert post(carol, PAGE, action="start", owner=OWNER, project=PROJECT).status_code == 403
    page = bob.http.get(bob.base + PAGE, timeout=30)
    assert ">Start<" in row(page.text, OWNER, PROJECT)
    r = post(bob, PAGE, action="start", owner=OWNER, project=PROJECT)
    assert r.status_code == 200, r.text
    assert f"{OWNER}'s project {PROJECT}" in unescape(r.text)
    alice.wait_ready(PROJECT, timeout=300)
    assert bob.api("GET", CONTENTS).status_code == 200
    # It is the owner's server, started with the owner's identity.
    assert alice.api("GET", CONTENTS).status_code == 200


def test_leaving_ends_access(people):
    bob = people[COLLAB]
    assert bob.api("GET", CONTENTS).status_code == 200
    r = post(bob, PAGE, action="leave", owner=OWNER, project=PROJECT)
    assert r.status_code == 200 and f"You left {OWNER}'s project {PROJECT}." in unescape(r.text)
    assert not row(r.text, OWNER, PROJECT)
    # The hub refuses at once; the project server within its cache time.
    assert wait_status(bob, CONTENTS, 403, within=REVOKE_WITHIN_S + 15) == 403
    assert bob.http.get(bob.base + f"/user/{OWNER}/{PROJECT}/lab", timeout=30).status_code in (
        403,
        404,
    )

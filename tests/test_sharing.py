"""Collaborator sharing: the owner's share page, JupyterHub's sharing API and
share links, against a real hub and a real project container."""

from __future__ import annotations

import re
import time
from html import unescape

import pytest
from hubclient import HubUser

from gpulab_hub.sharing import REVOKE_WITHIN_S

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

# Names of their own, so the suite's other modules on the same hub do not clash.
OWNER, PROJECT = "shalice", "shared-one"
PAGE = f"/hub/gpulab/share/{PROJECT}"
CONTENTS = f"/user/{OWNER}/{PROJECT}/api/contents"


def make_user(hub, admin: HubUser, name: str) -> HubUser:
    user = HubUser(hub.url, name, f"{name}-Passw0rd-long")
    assert user.signup().status_code == 200
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def as_guest(user: HubUser) -> HubUser:
    """A client for the owner's project, with ``user``'s token (HubUser.execute runs there)."""
    guest = HubUser(user.base, OWNER, "")
    guest.token = user.token
    return guest


def page_post(user: HubUser, **form):
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    return user.http.post(user.base + PAGE, data={"_xsrf": xsrf, **form}, timeout=30)


def accept(user: HubUser, accept_url: str):
    """Accept a share link on JupyterHub's own page, as a browser would."""
    page = user.http.get(user.base + accept_url, timeout=10)
    if page.status_code != 200:
        return page
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    code = accept_url.split("code=", 1)[1]
    return user.http.post(
        user.base + "/hub/accept-share",
        data={"_xsrf": xsrf, "code": code},
        allow_redirects=False,
        timeout=10,
    )


def wait_status(user: HubUser, path: str, status: int, within: float) -> int:
    deadline = time.monotonic() + within
    while True:
        got = user.api("GET", path).status_code
        if got == status or time.monotonic() > deadline:
            return got
        time.sleep(1)


@pytest.fixture(scope="module")
def admin(hub):
    a = HubUser(hub.url, "admin", hub.admin_password)
    assert a.login().status_code == 302
    a.new_token()
    return a


@pytest.fixture(scope="module")
def people(hub, admin):
    return {n: make_user(hub, admin, n) for n in (OWNER, "shbob", "shcarol", "shdave")}


@pytest.fixture(scope="module")
def project(people):
    alice = people[OWNER]
    alice.start_project(PROJECT)
    yield
    alice.stop_project(PROJECT)


@pytest.fixture(scope="module")
def short_link(people, project):
    """A link made through the API with the shortest expiry JupyterHub allows (60 s)."""
    r = people[OWNER].api(
        "POST", f"/hub/api/share-codes/{OWNER}/{PROJECT}", json={"expires_in": 60}
    )
    assert r.status_code == 200, r.text
    return r.json()["accept_url"], time.monotonic() + 60


def test_share_page_is_the_owners_only(people, project, short_link):
    alice, bob = people[OWNER], people["shbob"]
    page = alice.http.get(alice.base + PAGE, timeout=30)
    assert page.status_code == 200, page.text
    assert f"Share {PROJECT}" in page.text and "(owner)" in page.text
    # The home page links to it.
    home = alice.http.get(alice.base + "/hub/home", timeout=30)
    assert f'href="/hub/gpulab/share/{PROJECT}"' in home.text
    # Another user has no project of that name: the page (and its form) is not there.
    assert bob.http.get(bob.base + PAGE, timeout=30).status_code == 404
    assert page_post(bob, action="user", name="shdave").status_code == 404


def test_collaborator_works_in_the_project_until_revoked(people, project):
    alice, bob, dave = people[OWNER], people["shbob"], people["shdave"]
    assert bob.api("GET", CONTENTS).status_code == 403
    # The project server keeps the hub's answer on a token for a while: a fresh one.
    bob.new_token()

    r = page_post(alice, action="user", name="shbob", role="collaborator")
    assert r.status_code == 200, r.text
    assert "Shared with user shbob as collaborator." in r.text
    assert "<strong>shbob</strong>" in r.text

    assert bob.api("GET", CONTENTS).status_code == 200
    assert as_guest(bob).execute(PROJECT, "import os; print(os.environ['JUPYTERHUB_USER'])") == (
        f"{OWNER}\n"
    )
    # Unrelated users stay out.
    assert dave.api("GET", CONTENTS).status_code == 403
    # A collaborator cannot share further: neither with a user nor by link.
    where = f"{OWNER}/{PROJECT}"
    refused = bob.api("POST", f"/hub/api/shares/{where}", json={"user": "shdave"})
    assert refused.status_code in (403, 404), refused.text
    refused = bob.api("POST", f"/hub/api/share-codes/{where}", json={})
    assert refused.status_code in (403, 404), refused.text
    assert dave.api("GET", CONTENTS).status_code == 403

    r = page_post(alice, action="revoke-user", name="shbob")
    assert r.status_code == 200, r.text
    assert "<strong>shbob</strong>" not in r.text
    # The hub refuses at once; the project server's cache of token checks expires.
    assert wait_status(bob, CONTENTS, 403, within=REVOKE_WITHIN_S + 15) == 403


def test_someone_revoked_who_accepts_a_new_link_gets_in_at_once(people, project):
    """The project server keeps the hub's answer on a token for REVOKE_WITHIN_S, the
    refusal after a revoke included: it asks the hub again before it refuses."""
    alice, bob = people[OWNER], people["shbob"]
    # the test before revoked bob: the server refuses his token and has that answer
    assert bob.api("GET", CONTENTS).status_code == 403
    r = page_post(alice, action="link", hours="1")
    assert r.status_code == 200, r.text
    url = unescape(re.search(r'value="(http[^"]+accept-share\?code=[^"]+)"', r.text)[1])
    assert accept(bob, url.removeprefix(alice.base)).status_code == 302
    accepted = time.monotonic()
    assert wait_status(bob, CONTENTS, 200, within=REVOKE_WITHIN_S + 15) == 200
    waited = time.monotonic() - accepted
    print(f"\nbob's new access worked {waited:.1f} s after he accepted the link")
    assert waited < 5, f"refused on an old answer for {waited:.0f} s"
    r = page_post(alice, action="revoke-user", name="shbob")
    assert r.status_code == 200, r.text
    assert wait_status(bob, CONTENTS, 403, within=REVOKE_WITHIN_S + 15) == 403


def test_groups_and_refusals_on_the_page(hub, people, project, admin):
    alice = people[OWNER]
    # A member of her own: a token refused here is remembered by the server for 30 s.
    erin = make_user(hub, admin, "sherin")
    r = admin.api("POST", "/hub/api/groups/shteam", json={"users": ["sherin"]})
    assert r.status_code == 201, r.text
    r = page_post(alice, action="group", name="shteam", role="viewer")
    assert r.status_code == 200 and "group <strong>shteam</strong>" in r.text
    # A member of the group reaches the project (JupyterHub 6.1 alone would refuse her:
    # gpulab mirrors the group share as a role the group holds).
    assert wait_status(erin, CONTENTS, 200, within=REVOKE_WITHIN_S + 10) == 200
    r = page_post(alice, action="revoke-group", name="shteam")
    assert r.status_code == 200 and "<strong>shteam</strong>" not in r.text
    assert wait_status(erin, CONTENTS, 403, within=REVOKE_WITHIN_S + 10) == 403

    r = page_post(alice, action="user", name="nosuchuser")
    assert r.status_code == 400 and "No gpulab account named nosuchuser" in r.text
    r = page_post(alice, action="group", name="nosuchgroup")
    assert r.status_code == 400 and "No group named nosuchgroup" in r.text
    r = page_post(alice, action="user", name=OWNER)
    assert r.status_code == 400 and "yours already" in r.text
    r = page_post(alice, action="link", hours="100000")
    assert r.status_code == 400 and "from 1 to 168 hours" in r.text


def test_share_with_someone_approved_who_never_logged_in(hub, people, project, admin):
    alice = people[OWNER]
    # Signed up, not yet approved: not someone to share with.
    frank = HubUser(hub.url, "shfrank", "shfrank-Passw0rd-long")
    assert frank.signup().status_code == 200
    r = page_post(alice, action="user", name="shfrank", role="viewer")
    assert r.status_code == 400 and "once an administrator has approved them" in r.text
    # Approved, and never logged in: the share is made, and waits for him.
    assert admin.authorize("shfrank").status_code == 200
    r = page_post(alice, action="user", name="shfrank", role="viewer")
    assert r.status_code == 200 and "Shared with user shfrank as viewer." in r.text, r.text
    assert frank.login().status_code == 302
    frank.new_token()
    assert wait_status(frank, CONTENTS, 200, within=REVOKE_WITHIN_S + 10) == 200
    r = frank.http.get(hub.url + "/hub/gpulab/shared", timeout=10)
    assert r.status_code == 200 and PROJECT in r.text


def test_link_grants_access_until_revoked(people, project, short_link):
    alice, carol, dave = people[OWNER], people["shcarol"], people["shdave"]
    r = page_post(alice, action="link", hours="2")
    assert r.status_code == 200, r.text
    url = unescape(re.search(r'value="(http[^"]+accept-share\?code=[^"]+)"', r.text).group(1))
    accept_url = url.removeprefix(alice.base)

    # The accept page says whose project it is, and as what (a link is a viewer's first).
    offer = carol.http.get(carol.base + accept_url, timeout=10)
    assert offer.status_code == 200
    assert f"{OWNER} shares the project &lsquo;{PROJECT}&rsquo; with you as" in offer.text
    assert "a viewer:" in offer.text
    assert accept(carol, accept_url).status_code == 302
    assert carol.api("GET", CONTENTS).status_code == 200
    assert "<strong>shcarol</strong>" in alice.http.get(alice.base + PAGE, timeout=30).text

    # A revoked link lets nobody in.
    r = page_post(alice, action="link", hours="1")
    second = unescape(re.search(r'value="http[^"]+(/hub/accept-share\?code=[^"]+)"', r.text)[1])
    ids = re.findall(r'data-id="(sc_\d+)"', r.text)
    r = page_post(alice, action="revoke-link", name=ids[-1])
    assert r.status_code == 200 and "Link revoked." in r.text
    assert accept(dave, second).status_code == 404
    assert dave.api("GET", CONTENTS).status_code == 403


def role_in_listing(page_html: str, name: str) -> str | None:
    m = re.search(r'data-role="([^"]+)">\s*<td>\w+ <strong>' + re.escape(name), page_html)
    return m[1] if m else None


def test_roles_viewer_then_collaborator_then_viewer(people, project):
    alice, dave = people[OWNER], people["shdave"]
    kernels = f"/user/{OWNER}/{PROJECT}/api/kernels"
    r = page_post(alice, action="user", name="shdave", role="viewer")
    assert r.status_code == 200 and "Shared with user shdave as viewer." in r.text, r.text
    assert role_in_listing(r.text, "shdave") == "viewer"
    dave.new_token()
    assert dave.api("GET", CONTENTS).status_code == 200
    refused = dave.api("POST", kernels, json={"name": "python3"})
    assert refused.status_code == 403, refused.text

    r = page_post(alice, action="user", name="shdave", role="collaborator")
    assert role_in_listing(r.text, "shdave") == "collaborator"
    # A higher role works within seconds (the server asks the hub again when it refuses).
    deadline = time.monotonic() + 10
    while (started := dave.api("POST", kernels, json={"name": "python3"})).status_code == 403:
        assert time.monotonic() < deadline, started.text
        time.sleep(1)
    assert started.status_code == 201, started.text
    assert alice.api("DELETE", f"{kernels}/{started.json()['id']}").status_code == 204

    # The owner sets the role: back to viewer takes execute away (within the cache time).
    r = page_post(alice, action="user", name="shdave", role="viewer")
    assert role_in_listing(r.text, "shdave") == "viewer"
    deadline = time.monotonic() + REVOKE_WITHIN_S + 15
    while time.monotonic() < deadline:
        got = dave.api("POST", kernels, json={"name": "python3"})
        if got.status_code == 403:
            break
        if got.status_code == 201:
            alice.api("DELETE", f"{kernels}/{got.json()['id']}")
        time.sleep(2)
    assert got.status_code == 403, got.text

    r = page_post(alice, action="user", name="shdave", role="owner")
    assert r.status_code == 400 and "Choose a role" in r.text
    r = page_post(alice, action="link", hours="1", role="viewer")
    assert r.status_code == 200 and "Link made (viewer)" in r.text
    assert 'data-role="viewer">' in r.text.split('class="share-code"')[-1][:200]
    r = page_post(alice, action="revoke-user", name="shdave")
    assert r.status_code == 200 and role_in_listing(r.text, "shdave") is None


def test_reshare_only_when_the_owner_allows(people, project):
    alice, bob, dave = people[OWNER], people["shbob"], people["shdave"]
    reshare = f"/hub/gpulab/share/{OWNER}/{PROJECT}"

    def post(user, **form):
        xsrf = user.http.cookies.get("_xsrf", path="/hub/")
        return user.http.post(user.base + reshare, data={"_xsrf": xsrf, **form}, timeout=30)

    page_post(alice, action="revoke-user", name="shcarol")  # from the link test
    page_post(alice, action="user", name="shbob", role="collaborator")
    page_post(alice, action="user", name="shdave", role="viewer")
    # Not allowed yet: the collaborator is refused; a viewer or stranger finds nothing.
    assert bob.http.get(bob.base + reshare, timeout=30).status_code == 403
    assert post(bob, action="user", name="shcarol").status_code == 403
    assert dave.http.get(dave.base + reshare, timeout=30).status_code == 404
    assert people["shcarol"].http.get(bob.base + reshare, timeout=30).status_code == 404

    r = page_post(alice, action="settings", allow="collaborators_may_reshare")
    assert r.status_code == 200 and "Settings saved." in r.text
    assert 'id="may-reshare"' in r.text and 'value="collaborators_may_reshare" checked' in r.text
    page = bob.http.get(bob.base + reshare, timeout=30)
    assert page.status_code == 200 and 'id="reshare-note"' in page.text
    assert "Revoke" not in page.text and 'id="settings-form"' not in page.text
    assert dave.http.get(dave.base + reshare, timeout=30).status_code == 404  # viewers never

    carol = people["shcarol"]
    r = post(bob, action="user", name="shcarol", role="viewer")
    assert r.status_code == 200 and "Shared with user shcarol as viewer." in r.text, r.text
    carol.new_token()
    assert carol.api("GET", CONTENTS).status_code == 200
    r = post(bob, action="link", hours="1", role="collaborator")
    assert r.status_code == 200 and "accept-share?code=" in r.text
    # Only the owner revokes and changes the rules; a re-share never lowers access.
    assert post(bob, action="revoke-user", name="shcarol").status_code == 403
    assert post(bob, action="settings").status_code == 403
    r = post(bob, action="user", name=OWNER, role="viewer")
    assert r.status_code == 400 and f"{OWNER}'s already" in unescape(r.text)
    post(bob, action="user", name="shdave", role="viewer")
    assert role_in_listing(alice.http.get(alice.base + PAGE).text, "shdave") == "viewer"

    r = page_post(alice, action="settings")  # nothing ticked: re-sharing off again
    assert 'value="collaborators_may_reshare" checked' not in r.text
    assert bob.http.get(bob.base + reshare, timeout=30).status_code == 403
    for name in ("shbob", "shcarol", "shdave"):
        page_post(alice, action="revoke-user", name=name)


def test_embedded_page_may_be_framed_by_the_same_origin_only(people, project):
    alice = people[OWNER]
    plain = alice.http.get(alice.base + PAGE, timeout=30)
    assert "frame-ancestors 'none'" in plain.headers["Content-Security-Policy"]
    assert 'id="jupyterhub-logo"' in plain.text
    embedded = alice.http.get(alice.base + PAGE + "?embed=1", timeout=30)
    assert embedded.status_code == 200
    assert "frame-ancestors 'self'" in embedded.headers["Content-Security-Policy"]
    assert 'id="jupyterhub-logo"' not in embedded.text  # no navigation bar
    # Its forms keep it embedded.
    assert f'action="{PAGE}?embed=1"' in embedded.text


# Last in the module: the link, made by the module's first test, has had the other
# tests' time to expire (JupyterHub's shortest expiry is 60 s), so little is left to wait.
def test_expired_link_grants_nothing(people, project, short_link):
    dave = people["shdave"]
    accept_url, expires = short_link
    time.sleep(max(0.0, expires - time.monotonic()) + 2)
    assert accept(dave, accept_url).status_code == 404
    # A fresh token: the project server asks the hub (an older one's answer is kept a while).
    dave.new_token()
    assert dave.api("GET", CONTENTS).status_code == 403

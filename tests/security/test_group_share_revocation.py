"""A group share revoked through JupyterHub's REST API ends the members' access within
GPULAB_REVOKE_WITHIN_S, as a revoke on the share page does (issue 23).

gpulab mirrors each group share as a role the group holds (sharing/groupshares.py),
because JupyterHub 6.1 leaves group shares out of the members' tokens. The attack
this guards against: the owner (or an admin) revokes the group's share with
JupyterHub's API, never opening gpulab's share page, and the members keep running
code in the project because the mirror role still grants the share's scopes. Here a
member holds a kernel websocket open and the share is revoked three ways (``PATCH``
and ``DELETE /hub/api/shares/<owner>/<project>``, the admin's ``DELETE
/hub/api/groups/<group>/shared/<owner>/<project>``): the hub drops the role at once,
the project server closes the member's kernel and refuses their token within the
bound, and the owner opens no page in between. The seconds are printed.
"""

from __future__ import annotations

import json
import time

import pytest
from people import (
    closed_within,
    log_in_admin,
    make_user,
    open_ws,
    page_post,
    start_with_notebook,
    ws_status,
)
from test_revocation import kernel_answers

from gpulab_hub.sharing import groupshares, roles

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT, MEMBER, GROUP = "gsowner", "gs-proj", "gsmember", "gsteam"
SERVER = f"/user/{OWNER}/{PROJECT}"
EXECUTE = f"{roles.EXECUTE}!server={OWNER}/{PROJECT}"


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    found = {n: make_user(hub, admin, n) for n in (OWNER, MEMBER)}
    r = admin.api("POST", f"/hub/api/groups/{GROUP}", json={"users": [MEMBER]})
    assert r.status_code == 201, r.text
    return {**found, "admin": admin}


@pytest.fixture(scope="module")
def project(people):
    owner = people[OWNER]
    start_with_notebook(owner, PROJECT)
    yield
    owner.stop_project(PROJECT)


def bound(hub) -> float:
    """The revocation window this hub runs with (the test hub: 8 s)."""
    return float(hub.env["GPULAB_REVOKE_WITHIN_S"])


def member_scopes(member) -> list[str]:
    r = member.api("GET", "/hub/api/user")
    assert r.status_code == 200, r.text
    return r.json().get("scopes", [])


def recorded_roles(hub) -> dict:
    path = hub.home / "hub" / groupshares.FILE_NAME
    return json.loads(path.read_text()).get("roles", {}) if path.exists() else {}


def record_says(hub, role: str, present: bool, within: float = 20.0) -> bool:
    """The roles' record follows JupyterHub's database on the records pool (after the
    commit, not before the answer): whether it says ``role`` is ``present`` within
    ``within`` seconds."""
    deadline = time.monotonic() + within
    while (role in recorded_roles(hub)) != present:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def revoke_group_share(how: str, people) -> None:
    owner, admin = people[OWNER], people["admin"]
    if how == "PATCH":
        r = owner.api("PATCH", f"/hub/api/shares/{OWNER}/{PROJECT}", json={"group": GROUP})
        assert r.status_code == 200 and r.json() == {}, r.text
    elif how == "DELETE":
        r = owner.api("DELETE", f"/hub/api/shares/{OWNER}/{PROJECT}")
        assert r.status_code == 204, r.text
    else:
        r = admin.api("DELETE", f"/hub/api/groups/{GROUP}/shared/{OWNER}/{PROJECT}")
        assert r.status_code == 204, r.text


@pytest.mark.parametrize("how", ["PATCH", "DELETE", "group DELETE"])
def test_a_group_share_revoked_through_the_api_ends_access(hub, people, project, how):
    owner, member = people[OWNER], people[MEMBER]
    r = page_post(owner, PROJECT, action="group", name=GROUP, role="collaborator")
    assert r.status_code == 200 and f"group <strong>{GROUP}</strong>" in r.text, r.text
    role = groupshares.role_name(OWNER, PROJECT, GROUP)
    assert record_says(hub, role, present=True), recorded_roles(hub)
    member.new_token()  # as test_revocation.py: a token made after the share
    assert EXECUTE in member_scopes(member)
    r = member.api("POST", f"{SERVER}/api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    path = f"/api/kernels/{r.json()['id']}/channels"
    ws = open_ws(member.base, SERVER, path, token=member.token)
    assert kernel_answers(ws)

    revoke_group_share(how, people)  # no page of gpulab's is opened from here on
    start, within = time.monotonic(), bound(hub)
    print(f"\nrevoked {GROUP}'s share with {how}; promised window {within} s")
    # The hub: the role is gone as soon as the revoke's answer came back (its record
    # follows on the records pool: checked below).
    assert EXECUTE not in member_scopes(member)
    # The project server: the open kernel is closed, a new request refused.
    seconds, code = closed_within(ws, max(0.0, within - (time.monotonic() - start)))
    seconds = None if seconds is None else round(time.monotonic() - start, 1)
    print(f"  kernel websocket closed after {seconds} s (code {code})")
    assert seconds is not None, f"the kernel websocket was still open after {within} s"
    refused = None
    while time.monotonic() - start < within:
        if member.api("GET", f"{SERVER}/api/contents").status_code == 403:
            refused = round(time.monotonic() - start, 1)
            break
        time.sleep(0.5)
    print(f"  the member's token refused after {refused} s")
    assert refused is not None, f"the member's token still worked after {within} s"
    assert ws_status(member.base, SERVER, path, token=member.token) in (403, 404)
    assert record_says(hub, role, present=False), recorded_roles(hub)

"""Revoking or lowering a share ends the open connections it allowed (issue 13, item 1).

A collaborator keeps a kernel websocket and a terminal open with an API token and a
collaboration room open in a browser session (JupyterHub's OAuth cookie); the owner
revokes the share on the share page. docs/sharing.md promises that the project
server ends them within 30 s: each must be closed by the server within that, and the
owner's own connections stay open. Lowering a collaborator to viewer ends what only a
collaborator may hold (kernel, writable room) the same way. The seconds are printed.
"""

from __future__ import annotations

import json
import time

import pytest
from people import (
    NB,
    browser_session,
    closed_within,
    log_in_admin,
    make_user,
    open_room,
    open_ws,
    page_post,
    send_execute,
    start_with_notebook,
    ws_status,
)

from gpulab_hub.sharing import REVOKE_WITHIN_S

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT = "rvowner", "revoked"
COLLAB, DEMOTED = "rvcollab", "rvdemoted"
SERVER = f"/user/{OWNER}/{PROJECT}"


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {n: make_user(hub, admin, n) for n in (OWNER, COLLAB, DEMOTED)}


@pytest.fixture(scope="module")
def project(people):
    alice = people[OWNER]
    start_with_notebook(alice, PROJECT)
    yield
    alice.stop_project(PROJECT)


def share(alice, name: str, role: str) -> None:
    r = page_post(alice, PROJECT, action="user", name=name, role=role)
    assert r.status_code == 200 and f"as {role}" in r.text, r.text


def connections_of(user, session) -> dict:
    """A kernel websocket and a terminal (API token), a collaboration room (cookies)."""
    r = user.api("POST", f"{SERVER}/api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    r = user.api("POST", f"{SERVER}/api/terminals")
    assert r.status_code == 200, r.text
    terminal = r.json()["name"]
    return {
        "kernel": open_ws(user.base, SERVER, f"/api/kernels/{kernel}/channels", token=user.token),
        "terminal": open_ws(
            user.base, SERVER, f"/terminals/websocket/{terminal}", token=user.token
        ),
        "room": open_room(user.base, SERVER, NB, session=session),
        "kernel_id": kernel,
    }


def kernel_answers(ws, code: str = "print(6 * 7)") -> bool:
    msg_id = send_execute(ws, code)
    deadline = time.monotonic() + 30
    ws.settimeout(5)
    while time.monotonic() < deadline:
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "stream":
            return msg["content"]["text"].strip() == "42"
    return False


def wait_closed(connections: dict, names, within: float) -> dict:
    """Seconds until each of ``names`` was closed by the server (None: still open)."""
    start = time.monotonic()
    took = {}
    for name in names:
        left = max(0.0, within - (time.monotonic() - start))
        seconds, code = closed_within(connections[name], left)
        took[name] = None if seconds is None else round(time.monotonic() - start, 1)
        print(f"  {name}: closed after {took[name]} s (code {code})")
    return took


def test_revoking_ends_open_kernel_terminal_and_room(people, project):
    alice, bob = people[OWNER], people[COLLAB]
    share(alice, COLLAB, "collaborator")
    bob.new_token()  # a token made after the share carries it
    session = browser_session(bob, SERVER)
    assert session is not None
    mine = connections_of(bob, session)
    assert kernel_answers(mine["kernel"])
    owners = open_ws(
        alice.base, SERVER, f"/api/kernels/{mine['kernel_id']}/channels", token=alice.token
    )

    r = page_post(alice, PROJECT, action="revoke-user", name=COLLAB)
    assert r.status_code == 200, r.text
    print(f"\nrevoked {COLLAB}; promised window {REVOKE_WITHIN_S} s")
    took = wait_closed(mine, ("kernel", "terminal", "room"), REVOKE_WITHIN_S)
    assert all(s is not None for s in took.values()), f"still open after the window: {took}"
    # The owner's connection to the same kernel is still open and working.
    assert kernel_answers(owners)
    owners.close()
    # And the collaborator cannot open them again.
    path = f"/api/kernels/{mine['kernel_id']}/channels"
    assert ws_status(bob.base, SERVER, path, token=bob.token) in (403, 404)


def test_lowering_to_viewer_ends_kernel_and_writable_room(people, project):
    alice, carol = people[OWNER], people[DEMOTED]
    share(alice, DEMOTED, "collaborator")
    carol.new_token()
    session = browser_session(carol, SERVER)
    assert session is not None
    mine = connections_of(carol, session)
    assert kernel_answers(mine["kernel"])

    share(alice, DEMOTED, "viewer")
    print(f"\nlowered {DEMOTED} to viewer; promised window {REVOKE_WITHIN_S} s")
    took = wait_closed(mine, ("kernel", "terminal", "room"), REVOKE_WITHIN_S)
    assert all(s is not None for s in took.values()), f"still open after the window: {took}"
    # As a viewer they may open the room again (read-only), not the kernel.
    room = open_room(carol.base, SERVER, NB, session=session)
    room.close()
    path = f"/api/kernels/{mine['kernel_id']}/channels"
    assert ws_status(carol.base, SERVER, path, token=carol.token) == 403
    page_post(alice, PROJECT, action="revoke-user", name=DEMOTED)

"""The viewer role, enforced by the project server (real hub, real project container):
a viewer reads and opens JupyterLab, and every write, kernel, terminal and RTC change
is refused route by route; a collaborator may do each of them."""

from __future__ import annotations

import json
import re
import time
import uuid

import pycrdt
import pytest
import requests
import websocket
from hubclient import HubUser
from test_sharing import accept, make_user

from gpulab_hub.sharing import roles

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT = "vwalice", "viewed"
VIEWER, COLLAB = "vwbob", "vwcarol"
SERVER = f"/user/{OWNER}/{PROJECT}"
NB = "notes.ipynb"
ORIGINAL = "print('the owner wrote this')"


def notebook(source: str) -> dict:
    return {
        "cells": [
            {
                "cell_type": "code",
                "id": "c0ffee00",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": source,
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def put_notebook(user: HubUser, path: str, source: str):
    body = {"type": "notebook", "format": "json", "content": notebook(source)}
    return user.api("PUT", f"{SERVER}/api/contents/{path}", json=body)


def source_on_disk(owner: HubUser, path: str = NB) -> str:
    r = owner.api("GET", f"{SERVER}/api/contents/{path}")
    assert r.status_code == 200, r.text
    return "".join(r.json()["content"]["cells"][0]["source"])


def ws_url(user: HubUser, path: str) -> str:
    return user.base.replace("http", "ws", 1) + SERVER + path


def ws_status(user: HubUser, path: str) -> int:
    """101 if the websocket opened, else the HTTP status the server answered."""
    try:
        ws = websocket.create_connection(
            ws_url(user, path), header=[f"Authorization: token {user.token}"], timeout=20
        )
    except websocket.WebSocketBadStatusException as e:
        return e.status_code
    ws.close()
    return 101


@pytest.fixture(scope="module")
def admin(hub):
    a = HubUser(hub.url, "admin", hub.admin_password)
    assert a.login().status_code == 302
    a.new_token()
    return a


@pytest.fixture(scope="module")
def people(hub, admin):
    return {n: make_user(hub, admin, n) for n in (OWNER, VIEWER, COLLAB, "vwdave")}


def share_by_link(owner: HubUser, guest: HubUser, role: str) -> None:
    r = owner.api(
        "POST",
        f"/hub/api/share-codes/{OWNER}/{PROJECT}",
        json={"expires_in": 600, "scopes": roles.share_scopes(role, OWNER, PROJECT)},
    )
    assert r.status_code == 200, r.text
    assert accept(guest, r.json()["accept_url"]).status_code == 302
    guest.new_token()  # a token made after the share carries its scopes


@pytest.fixture(scope="module")
def project(people):
    alice = people[OWNER]
    alice.start_project(PROJECT)
    assert put_notebook(alice, NB, ORIGINAL).status_code in (200, 201)
    share_by_link(alice, people[VIEWER], "viewer")
    share_by_link(alice, people[COLLAB], "collaborator")
    yield
    alice.stop_project(PROJECT)


@pytest.fixture(scope="module")
def owners_kernel(people, project):
    r = people[OWNER].api("POST", f"{SERVER}/api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture(scope="module")
def owners_terminal(people, project):
    r = people[OWNER].api("POST", f"{SERVER}/api/terminals")
    assert r.status_code == 200, r.text
    return r.json()["name"]


def test_viewer_reads_the_project(people, project):
    bob = people[VIEWER]
    r = bob.api("GET", f"{SERVER}/api/contents/{NB}")
    assert r.status_code == 200, r.text
    assert "".join(r.json()["content"]["cells"][0]["source"]) == ORIGINAL
    assert bob.api("GET", f"{SERVER}/files/{NB}").status_code == 200
    for path in ("/lab", "/api/kernelspecs", "/api/sessions", "/api/kernels", "/api/me"):
        assert bob.api("GET", SERVER + path).status_code == 200, path
    # The page JupyterLab asks for its permissions says read, not write or execute.
    perms = {"contents": ["read", "write"], "kernels": ["read", "execute"]}
    me = bob.api("GET", f"{SERVER}/api/me", params={"permissions": json.dumps(perms)})
    permissions = me.json()["permissions"]
    assert (permissions["contents"], permissions["kernels"]) == (["read"], ["read"])
    # An unrelated user gets nothing.
    assert people["vwdave"].api("GET", f"{SERVER}/api/contents/{NB}").status_code == 403


def test_viewer_opens_jupyterlab_in_a_browser_session(people, project):
    """The browser's OAuth token carries no share scopes: the server looks the share up."""
    bob = people[VIEWER]
    browser = requests.Session()
    browser.cookies.update(bob.http.cookies)
    r = browser.get(bob.base + SERVER + "/lab", timeout=30)
    if "/oauth2/authorize" in r.url:  # JupyterHub asks: authorize this server?
        xsrf = browser.cookies.get("_xsrf", path="/hub/")
        scopes = re.findall(r'name="scopes" value="([^"]+)"', r.text)
        r = browser.post(r.url, data={"_xsrf": xsrf, "scopes": scopes}, timeout=30)
    assert r.status_code == 200 and r.url.endswith(SERVER + "/lab"), (r.status_code, r.url)
    xsrf = browser.cookies.get("_xsrf", path=SERVER + "/") or ""
    headers = {"X-XSRFToken": xsrf}
    got = browser.get(bob.base + f"{SERVER}/api/contents/{NB}", headers=headers, timeout=30)
    assert got.status_code == 200, got.text
    assert ORIGINAL in got.text
    made = browser.post(bob.base + f"{SERVER}/api/kernels", headers=headers, json={}, timeout=30)
    assert made.status_code == 403 and "not authorized" in made.text, made.text
    saved = browser.put(
        bob.base + f"{SERVER}/api/contents/{NB}",
        headers=headers,
        json={"type": "notebook", "format": "json", "content": notebook("x")},
        timeout=30,
    )
    assert saved.status_code == 403 and "not authorized" in saved.text, saved.text
    assert source_on_disk(people[OWNER]) == ORIGINAL


# Each write a viewer must not make: (name, method, path, body, status a collaborator gets).
ROUTES = [
    ("start a kernel", "POST", "/api/kernels", {"name": "python3"}, 201),
    (
        "start a session",
        "POST",
        "/api/sessions",
        {"path": "s.ipynb", "type": "notebook", "name": "", "kernel": {"name": "python3"}},
        201,
    ),
    ("open a terminal", "POST", "/api/terminals", None, 200),
    ("save", "PUT", f"/api/contents/{NB}", "NOTEBOOK", 200),
    ("rename", "PATCH", f"/api/contents/{NB}", {"path": "renamed.ipynb"}, 200),
    ("new file", "POST", "/api/contents", {"type": "file", "ext": ".py"}, 201),
    ("checkpoint", "POST", f"/api/contents/{NB}/checkpoints", None, 201),
    ("delete", "DELETE", "/api/contents/DELETEME.txt", None, 204),
    (
        "settings",
        "PUT",
        "/lab/api/settings/@jupyterlab/apputils-extension:themes",
        {"raw": '{"theme": "JupyterLab Dark"}'},
        204,
    ),
    ("workspace", "PUT", "/lab/api/workspaces/gpulab-test", "WORKSPACE", 204),
]


def _request(user: HubUser, method: str, path: str, body):
    if body == "NOTEBOOK":
        body = {"type": "notebook", "format": "json", "content": notebook(f"by {user.name}")}
    elif body == "WORKSPACE":
        body = {"data": {}, "metadata": {"id": "gpulab-test"}}
    kw = {} if body is None else {"json": body}
    return user.api(method, SERVER + path, **kw)


def _restore(owner: HubUser) -> None:
    """Put the owner's notebook back as it was, and the file the delete test deletes."""
    if owner.api("GET", f"{SERVER}/api/contents/renamed.ipynb").status_code == 200:
        owner.api("PATCH", f"{SERVER}/api/contents/renamed.ipynb", json={"path": NB})
    assert put_notebook(owner, NB, ORIGINAL).status_code == 200
    r = owner.api(
        "PUT",
        f"{SERVER}/api/contents/DELETEME.txt",
        json={"type": "file", "format": "text", "content": "keep me"},
    )
    assert r.status_code in (200, 201), r.text


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "ok"), ROUTES, ids=[r[0] for r in ROUTES]
)
def test_viewer_refused_collaborator_allowed(people, project, name, method, path, body, ok):
    alice, bob, carol = people[OWNER], people[VIEWER], people[COLLAB]
    _restore(alice)
    before = _state(alice)
    r = _request(bob, method, path, body)
    assert r.status_code == 403, f"viewer {name}: {r.status_code} {r.text}"
    assert "not authorized" in r.text, r.text  # the authorizer said no (not, say, XSRF)
    # Nothing changed: files, the notebook, kernels, sessions, terminals.
    assert source_on_disk(alice) == ORIGINAL
    assert _state(alice) == before

    r = _request(carol, method, path, body)
    assert r.status_code == ok, f"collaborator {name}: {r.status_code} {r.text}"
    _stop_new(alice, before)
    _restore(alice)


def _state(owner: HubUser) -> dict:
    def names(path, key):
        r = owner.api("GET", SERVER + path)
        assert r.status_code == 200, r.text
        items = r.json()["content"] if path == "/api/contents" else r.json()
        return sorted(item[key] for item in items)

    return {
        "files": names("/api/contents", "name"),
        "kernels": names("/api/kernels", "id"),
        "sessions": names("/api/sessions", "id"),
        "terminals": names("/api/terminals", "name"),
    }


def _stop_new(owner: HubUser, before: dict) -> None:
    """Stop what a collaborator started (kernels, sessions, terminals)."""
    now = _state(owner)
    for kind in ("sessions", "kernels", "terminals"):
        for item in set(now[kind]) - set(before[kind]):
            owner.api("DELETE", f"{SERVER}/api/{kind}/{item}")


def test_websockets_of_kernels_and_terminals(people, owners_kernel, owners_terminal):
    bob, carol = people[VIEWER], people[COLLAB]
    kernel = f"/api/kernels/{owners_kernel}/channels"
    terminal = f"/terminals/websocket/{owners_terminal}"
    assert ws_status(bob, kernel) == 403
    assert ws_status(bob, terminal) == 403
    assert ws_status(carol, kernel) == 101
    assert ws_status(carol, terminal) == 101
    # The viewer cannot stop them either.
    assert bob.api("DELETE", f"{SERVER}/api/kernels/{owners_kernel}").status_code == 403
    assert bob.api("DELETE", f"{SERVER}/api/terminals/{owners_terminal}").status_code == 403


# --- real-time collaboration ---------------------------------------------------------


class Room:
    """A Y client of the notebook's collaboration room, as JupyterLab is."""

    def __init__(self, user: HubUser, path: str = NB):
        r = user.api(
            "PUT",
            f"{SERVER}/api/collaboration/session/{path}",
            json={"format": "json", "type": "notebook"},
        )
        assert r.status_code in (200, 201), r.text
        session = r.json()
        url = ws_url(user, f"/api/collaboration/room/json:notebook:{session['fileId']}")
        self.ws = websocket.create_connection(
            f"{url}?sessionId={session['sessionId']}",
            header=[f"Authorization: token {user.token}"],
            timeout=20,
        )
        self.doc = pycrdt.Doc()
        self.replies: list[dict] = []
        self.ws.send_binary(pycrdt.create_sync_message(self.doc))
        self.pump(until=lambda: len(self.cells()) > 0)

    def cells(self):
        return self.doc.get("cells", type=pycrdt.Array)

    def source(self) -> str:
        return str(self.cells()[0]["source"])

    def pump(self, until, within: float = 20) -> bool:
        deadline = time.monotonic() + within
        self.ws.settimeout(1)
        while time.monotonic() < deadline:
            if until():
                return True
            try:
                message = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            if isinstance(message, str):
                continue
            if message[0] == 0:  # sync
                reply = pycrdt.handle_sync_message(message[1:], self.doc)
                if reply is not None:
                    self.ws.send_binary(reply)
            elif message[0] == 2:  # raw: JSON replies, such as to "save"
                text = pycrdt.read_message(message[1:])
                self.replies.append(json.loads(text))
        return until()

    def type_in(self, text: str) -> None:
        before = self.doc.get_state()
        source = self.cells()[0]["source"]  # a Y text: insert into it, as an editor does
        source.insert(len(source), text)
        update = self.doc.get_update(before)
        self.ws.send_binary(pycrdt.create_update_message(update))

    def save(self, save_id: int) -> dict | None:
        word = b"save"
        self.ws.send_binary(bytes([2, len(word)]) + word + bytes([save_id]))
        self.pump(until=lambda: any(r.get("responseTo") == save_id for r in self.replies))
        return next((r for r in self.replies if r.get("responseTo") == save_id), None)

    def close(self):
        self.ws.close()


def test_rtc_viewer_sees_live_content_and_cannot_change_it(people, project):
    alice, bob, carol = people[OWNER], people[VIEWER], people[COLLAB]
    _restore(alice)
    watcher = Room(carol)
    viewer = Room(bob)
    try:
        assert viewer.source() == ORIGINAL
        marker = f" # viewer {uuid.uuid4().hex[:6]}"
        viewer.type_in(marker)
        assert viewer.save(7) == {"type": "save", "responseTo": 7, "status": "failed"}
        # The change reaches neither the room (other clients) nor the file.
        assert not watcher.pump(until=lambda: marker in watcher.source(), within=5)
        fresh = Room(carol)
        assert marker not in fresh.source()
        fresh.close()
        assert source_on_disk(alice) == ORIGINAL

        # A collaborator's edit reaches the room, the viewer (live) and the file.
        marker = f" # collaborator {uuid.uuid4().hex[:6]}"
        watcher.type_in(marker)
        assert viewer.pump(until=lambda: marker in viewer.source())
        assert watcher.save(8)["status"] in ("success", "skipped")
        deadline = time.monotonic() + 20
        while marker not in source_on_disk(alice) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert source_on_disk(alice).endswith(marker)
    finally:
        viewer.close()
        watcher.close()
        time.sleep(1)
        _restore(alice)

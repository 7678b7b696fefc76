"""Who the security tests act as, on one real hub: an owner with a running project,
a viewer and a collaborator of it (by share link), another user, an admin without a
share, and anonymous; browser sessions that went through JupyterHub's OAuth."""

from __future__ import annotations

import json
import re
import uuid

import requests
import websocket
from hubclient import HubUser

from gpulab_hub.sharing import roles

NB = "notes.ipynb"
ORIGINAL = "print('the owner wrote this')"


def password(name: str) -> str:
    return f"{name}-Passw0rd-long"


def make_user(hub, admin: HubUser, name: str) -> HubUser:
    user = HubUser(hub.url, name, password(name))
    assert user.signup().status_code == 200
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def log_in_admin(hub) -> HubUser:
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    admin.new_token()
    return admin


def notebook(source: str) -> dict:
    cell = {
        "cell_type": "code",
        "id": "c0ffee00",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": source,
    }
    return {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def start_with_notebook(owner: HubUser, project: str, path: str = NB, source: str = ORIGINAL):
    """Start ``owner``'s ``project`` and put a notebook of one code cell there."""
    owner.start_project(project)
    body = {"type": "notebook", "format": "json", "content": notebook(source)}
    url = f"/user/{owner.name}/{project}/api/contents/{path}"
    assert owner.api("PUT", url, json=body).status_code in (200, 201)


def accept(user: HubUser, accept_url: str):
    """Accept a share link on JupyterHub's own page, as a browser would."""
    page = user.http.get(user.base + accept_url, timeout=10)
    assert page.status_code == 200, page.text
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    code = accept_url.split("code=", 1)[1]
    return user.http.post(
        user.base + "/hub/accept-share",
        data={"_xsrf": xsrf, "code": code},
        allow_redirects=False,
        timeout=10,
    )


def share_by_link(owner: HubUser, project: str, guest: HubUser, role: str) -> None:
    r = owner.api(
        "POST",
        f"/hub/api/share-codes/{owner.name}/{project}",
        json={"expires_in": 600, "scopes": roles.share_scopes(role, owner.name, project)},
    )
    assert r.status_code == 200, r.text
    assert accept(guest, r.json()["accept_url"]).status_code == 302
    guest.new_token()  # a token made after the share carries its scopes


def browser_session(user: HubUser, server: str) -> requests.Session | None:
    """A cookie session on ``server`` (``/user/<owner>/<project>``) after JupyterHub's
    OAuth, as a browser gets it; None where the server turned the user away."""
    import time

    s = requests.Session()
    s.cookies.update(user.http.cookies)
    r = s.get(user.base + server + "/lab", timeout=30)
    if "/oauth2/authorize" in r.url:  # JupyterHub asks: authorize this server?
        xsrf = s.cookies.get("_xsrf", path="/hub/")
        scopes = re.findall(r'name="scopes" value="([^"]+)"', r.text)
        r = s.post(r.url, data={"_xsrf": xsrf, "scopes": scopes}, timeout=30)
    for _ in range(10):  # a share made a moment ago: the server's listing may lag 2 s
        if r.status_code != 403:
            break
        time.sleep(1)
        r = s.get(user.base + server + "/lab", timeout=30)
    if r.status_code != 200 or not r.url.startswith(user.base + server):
        return None
    return s


def xsrf_of(session: requests.Session, server: str) -> dict:
    return {"X-XSRFToken": session.cookies.get("_xsrf", path=server + "/") or ""}


def execute(base: str, server: str, token: str, code: str, timeout: float = 60) -> str:
    """Run ``code`` in a new kernel of ``server`` with ``token``; its stdout."""
    headers = {"Authorization": f"token {token}"}
    r = requests.post(
        base + server + "/api/kernels", headers=headers, json={"name": "python3"}, timeout=30
    )
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    ws = websocket.create_connection(
        ws_url(base, server, f"/api/kernels/{kernel}/channels"),
        header=[f"Authorization: token {token}"],
        timeout=timeout,
    )
    try:
        msg_id = send_execute(ws, code)
        out = []
        while True:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)
    finally:
        ws.close()
        requests.delete(base + server + f"/api/kernels/{kernel}", headers=headers, timeout=30)


def ws_url(base: str, server: str, path: str) -> str:
    return base.replace("http", "ws", 1) + server + path


def send_execute(ws, code: str) -> str:
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "username": "",
        "session": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "version": "5.3",
    }
    body = {"code": code, "silent": False}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": body}
    ws.send(json.dumps({**message, "channel": "shell"}))
    return msg_id


def page_post(user: HubUser, project: str, **form) -> requests.Response:
    """A form on the owner's share page (share with a user, revoke), as a browser."""
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    return user.http.post(
        f"{user.base}/hub/gpulab/share/{project}", data={"_xsrf": xsrf, **form}, timeout=30
    )


def cookie_header(session: requests.Session) -> str:
    return "; ".join(f"{c.name}={c.value}" for c in session.cookies)


def open_ws(base: str, server: str, path: str, *, token: str = "", session=None):
    """A websocket on the server with a token, or with a browser session's cookies."""
    headers = [f"Authorization: token {token}"] if token else []
    cookie = cookie_header(session) if session is not None else None
    return websocket.create_connection(
        ws_url(base, server, path), header=headers, cookie=cookie, timeout=20
    )


def ws_status(base: str, server: str, path: str, *, token: str = "", session=None) -> int:
    """101 if the websocket opened, else the HTTP status the server answered."""
    try:
        ws = open_ws(base, server, path, token=token, session=session)
    except websocket.WebSocketBadStatusException as e:
        return e.status_code
    ws.close()
    return 101


def open_room(base: str, server: str, path: str, *, token: str = "", session=None):
    """The collaboration room of notebook ``path`` (jupyter-collaboration), as JupyterLab
    opens it."""
    headers = {"Authorization": f"token {token}"} if token else {}
    http = session or requests
    if session is not None:
        headers.update(xsrf_of(session, server))
    r = http.put(
        base + f"{server}/api/collaboration/session/{path}",
        headers=headers,
        json={"format": "json", "type": "notebook"},
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    room = f"/api/collaboration/room/json:notebook:{r.json()['fileId']}"
    query = f"?sessionId={r.json()['sessionId']}"
    return open_ws(base, server, room + query, token=token, session=session)


def closed_within(ws, seconds: float) -> tuple[float | None, int | None]:
    """Wait until the server closes ``ws``: (seconds it took, close code), or (None,
    None) if it stayed open ``seconds``."""
    import time

    start = time.monotonic()
    ws.settimeout(1)
    while time.monotonic() - start < seconds:
        try:
            opcode, data = ws.recv_data(control_frame=True)
        except websocket.WebSocketTimeoutException:
            continue
        except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError):
            return time.monotonic() - start, None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            return time.monotonic() - start, code
    return None, None

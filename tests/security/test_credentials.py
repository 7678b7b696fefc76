"""A viewer harvests every credential they can find and tries it (issue 13, item 1).

Reported: pages a read-only viewer could load carried a credential (the project
server's own ``JUPYTERHUB_API_TOKEN``, in jupyter_server's error pages) that the
server then took as its owner's. Here the viewer loads every page, error page and
API answer of the owner's server and of the hub that a viewer can reach, collects
everything that looks like a token, and tries each one: none may start a kernel or
write a file, and none may be anyone's but the viewer's own at the hub. The server's
token itself (which the owner can read in a kernel) must be refused every action.
"""

from __future__ import annotations

import re

import pytest
import requests
from people import (
    NB,
    ORIGINAL,
    browser_session,
    execute,
    log_in_admin,
    make_user,
    notebook,
    share_by_link,
    start_with_notebook,
    xsrf_of,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT, VIEWER = "crowner", "cred", "crviewer"
SERVER = f"/user/{OWNER}/{PROJECT}"

# Pages of the owner's server a viewer's browser can ask for (errors included).
SERVER_PAGES = [
    "",
    "/",
    "/lab",
    f"/lab/tree/{NB}",
    "/lab/workspaces/auto-v",
    "/lab/nothing",
    "/tree",
    f"/notebooks/{NB}",
    f"/edit/{NB}",
    f"/view/{NB}",
    f"/files/{NB}",
    "/files/nothing-here.txt",
    "/nothing-here",
    "/static/nothing.js",
    "/api",
    "/api/me",
    "/api/status",
    "/api/contents",
    "/api/contents/nothing",
    f"/api/contents/{NB}",
    "/api/kernels",
    "/api/kernels/nothing",
    "/api/sessions",
    "/api/terminals",
    "/api/kernelspecs",
    "/api/config/notebook",
    "/api/nbconvert",
    f"/nbconvert/html/{NB}",
    "/lab/api/settings",
    "/lab/api/workspaces",
    "/lab/api/translations",
    "/lab/api/listings",
    "/lab/api/extensions",
    "/lab/api/plugins",
    "/lsp/status",
    "/api/yjs/roomid/x",
    "/api/gpulab/v1/info",
    "/api/gpulab/v1/gpu",
    "/api/gpulab/v1/gpu/history",
    "/api/gpulab/v1/gpu/processes",
    "/api/gpulab/v1/nothing",
]
HUB_PAGES = [
    "/hub/home",
    "/hub/gpulab/shared",
    f"/hub/gpulab/share/{OWNER}/{PROJECT}",
    f"/hub/spawn/{OWNER}/{PROJECT}",
    f"/hub/spawn-pending/{OWNER}/{PROJECT}",
    f"/hub/user/{OWNER}/{PROJECT}/lab",
    "/hub/token",
    "/hub/nothing",
    "/hub/error/503",
    "/hub/api/user",
    f"/hub/api/users/{OWNER}",
    f"/hub/api/shares/{OWNER}/{PROJECT}",
    f"/hub/api/users/{VIEWER}/shared",
    f"/hub/gpulab/copy?owner={OWNER}&project={PROJECT}&path={NB}",
]
# What a credential looks like in a page: JupyterHub's tokens (32 hex), and any
# value of a "token" key or attribute.
TOKEN_PATTERNS = [
    re.compile(r"(?<![0-9a-fA-F])[0-9a-f]{32}(?![0-9a-fA-F])"),
    re.compile(r"""token["']?\s*[:=]\s*["']([^"'&\s]{8,})"""),
    re.compile(r"""data-jupyter-api-token=["']([^"']+)"""),
]


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {n: make_user(hub, admin, n) for n in (OWNER, VIEWER)}


@pytest.fixture(scope="module")
def project(people):
    alice, bob = people[OWNER], people[VIEWER]
    start_with_notebook(alice, PROJECT)
    share_by_link(alice, PROJECT, bob, "viewer")
    yield
    alice.stop_project(PROJECT)


@pytest.fixture(scope="module")
def server_token(people, project) -> str:
    """The project server's own token, as anyone who runs code there can read it."""
    alice = people[OWNER]
    code = "import os; print(os.environ['JUPYTERHUB_API_TOKEN'])"
    token = execute(alice.base, SERVER, alice.token, code).strip()
    assert len(token) >= 16
    return token


def harvest(text: str) -> set[str]:
    found = set()
    for pattern in TOKEN_PATTERNS:
        for m in pattern.finditer(text):
            found.add(m.group(m.lastindex or 0))
    return found


def load_everything(bob, session) -> dict[str, str]:
    """Every page above, as the viewer's browser gets it: URL -> headers and body."""
    seen = {}
    hub = requests.Session()
    hub.cookies.update(bob.http.cookies)
    for path in SERVER_PAGES:
        for method in ("GET", "HEAD"):
            r = session.request(method, bob.base + SERVER + path, timeout=30)
            seen[f"{method} {SERVER}{path}"] = f"{r.status_code} {dict(r.headers)}\n{r.text}"
    # jupyter-collaboration's document session answer, which a viewer may ask for
    r = session.put(
        bob.base + f"{SERVER}/api/collaboration/session/{NB}",
        headers=xsrf_of(session, SERVER),
        json={"format": "json", "type": "notebook"},
        timeout=30,
    )
    seen[f"PUT {SERVER}/api/collaboration/session/{NB}"] = f"{r.status_code}\n{r.text}"
    for path in HUB_PAGES:
        r = hub.get(bob.base + path, timeout=30)
        seen[f"GET {path}"] = f"{r.status_code} {dict(r.headers)}\n{r.text}"
    return seen


def test_no_page_a_viewer_loads_carries_a_credential_of_anyone_else(people, project, server_token):
    alice, bob = people[OWNER], people[VIEWER]
    session = browser_session(bob, SERVER)
    assert session is not None, "the viewer could not open the project at all"
    pages = load_everything(bob, session)
    leaks = [where for where, text in pages.items() if server_token in text]
    assert not leaks, f"the server's own token is in: {leaks}"
    candidates = set().union(*(harvest(text) for text in pages.values()))
    print(f"\n{len(pages)} answers loaded, {len(candidates)} token-like strings tried")
    for candidate in sorted(candidates):
        headers = {"Authorization": f"token {candidate}"}
        me = requests.get(bob.base + "/hub/api/user", headers=headers, timeout=30)
        if me.status_code == 200:
            assert me.json()["name"] == bob.name, f"a page held {me.json()['name']}'s token"
        made = requests.post(
            bob.base + SERVER + "/api/kernels", headers=headers, json={}, timeout=30
        )
        assert made.status_code in (401, 403), f"{candidate[:6]}…: kernel {made.status_code}"
        body = {"type": "notebook", "format": "json", "content": notebook("by the viewer")}
        saved = requests.put(
            bob.base + f"{SERVER}/api/contents/{NB}", headers=headers, json=body, timeout=30
        )
        assert saved.status_code in (401, 403), f"{candidate[:6]}…: save {saved.status_code}"
    r = alice.api("GET", f"{SERVER}/api/contents/{NB}")
    assert "".join(r.json()["content"]["cells"][0]["source"]) == ORIGINAL


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", f"/api/contents/{NB}", None),
        ("GET", "/api/kernels", None),
        ("GET", "/api/gpulab/v1/gpu/processes", None),
        ("GET", "/lab/api/settings", None),
        ("POST", "/api/kernels", {"name": "python3"}),
        ("POST", "/api/terminals", None),
        ("PUT", "/api/contents/planted.txt", {"type": "file", "format": "text", "content": "x"}),
        ("PUT", "/lab/api/workspaces/planted", {"data": {}, "metadata": {"id": "planted"}}),
    ],
)
def test_the_servers_own_token_is_not_the_owner(people, server_token, method, path, body):
    """The token in the server's environment reaches the server (JupyterHub's
    ``access:servers``) but holds no gpulab role: every action is refused."""
    bob = people[VIEWER]
    headers = {"Authorization": f"token {server_token}"}
    kw = {} if body is None else {"json": body}
    r = requests.request(method, bob.base + SERVER + path, headers=headers, timeout=30, **kw)
    assert r.status_code == 403, f"{method} {path} with the server's token: {r.status_code}"

"""The viewer role, enforced by the project server (real hub, real project container):
a viewer reads and opens JupyterLab, and every write, kernel, terminal and RTC change
is refused route by route, in the viewer's words; a collaborator may do each of them.
In Chromium: the viewer is offered only what the role can do, and the owner's terminal
runs the project's Python."""

from __future__ import annotations

import json
import re
import time
import uuid

import pycrdt
import pytest
import requests
import websocket
from browser_kit import SHOTS
from hubclient import HubUser
from security.people import make_user, notebook, share_by_link

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT = "vwalice", "viewed"
VIEWER, COLLAB = "vwbob", "vwcarol"
SERVER = f"/user/{OWNER}/{PROJECT}"
# What the server tells a viewer it refuses (and JupyterLab, when it stops them first).
VIEWER_WORDS = (
    f"You are a viewer of {OWNER}'s project {PROJECT}: you can read it, but not change or "
    "run anything here. Save a copy to work on it."
)
NB = "notes.ipynb"
ORIGINAL = "print('the owner wrote this')"


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


@pytest.fixture(scope="module")
def project(people):
    alice = people[OWNER]
    alice.start_project(PROJECT)
    assert put_notebook(alice, NB, ORIGINAL).status_code in (200, 201)
    share_by_link(alice, PROJECT, people[VIEWER], "viewer")
    share_by_link(alice, PROJECT, people[COLLAB], "collaborator")
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
    # on a layout of their own, not the owner's (gpulab_jupyter/workspaces.py)
    own = f"{SERVER}/lab/workspaces/gpulab-{VIEWER}"
    assert r.status_code == 200 and r.url.endswith(own), (r.status_code, r.url)
    xsrf = browser.cookies.get("_xsrf", path=SERVER + "/") or ""
    headers = {"X-XSRFToken": xsrf}
    got = browser.get(bob.base + f"{SERVER}/api/contents/{NB}", headers=headers, timeout=30)
    assert got.status_code == 200, got.text
    assert ORIGINAL in got.text
    made = browser.post(bob.base + f"{SERVER}/api/kernels", headers=headers, json={}, timeout=30)
    assert made.status_code == 403 and made.json()["message"] == VIEWER_WORDS, made.text
    saved = browser.put(
        bob.base + f"{SERVER}/api/contents/{NB}",
        headers=headers,
        json={"type": "notebook", "format": "json", "content": notebook("x")},
        timeout=30,
    )
    assert saved.status_code == 403 and saved.json()["message"] == VIEWER_WORDS, saved.text
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
    # The authorizer said no (not, say, XSRF), in the viewer's words.
    assert r.json()["message"] == VIEWER_WORDS, r.text
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


# --- in Chromium: what the viewer is offered, and the owner's terminal -----------------

def lab_page(browser, hub, name: str):
    """A logged-in browser of ``name`` on the owner's JupyterLab (authorized, news declined)."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(f"{name}-Passw0rd-long")
    page.get_by_role("button", name="Sign In").click()
    page.wait_for_url("**/hub/home")
    page.goto(f"{hub.url}{SERVER}/lab")
    page.wait_for_url(re.compile(r"/hub/api/oauth2/authorize|/lab"), timeout=60_000)
    if "/oauth2/authorize" in page.url:  # JupyterHub asks once for another person's server
        page.get_by_role("button", name="Authorize").click()
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    expect(page.locator("#filebrowser")).to_be_visible(timeout=60_000)
    try:  # JupyterLab's "get notified about Jupyter news?" toast
        page.get_by_role("button", name="No", exact=True).click(timeout=3_000)
    except PlaywrightError:
        pass
    return page


def open_launcher(page) -> None:
    page.locator("#jp-main-dock-panel").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+Shift+L")  # File > New Launcher


@pytest.mark.browser
def test_viewer_is_offered_only_what_a_viewer_can_do(hub, people, project, browser):
    from playwright.sync_api import expect

    _restore(people[OWNER])
    page = lab_page(browser, hub, VIEWER)
    try:
        expect(page.locator("body")).to_have_attribute("data-gpulab-access", "read")
        # The launcher: no tiles (new notebook, console, terminal, files), and why.
        open_launcher(page)
        note = page.locator(".jp-Launcher-content [data-gpulab=launcher-note]").last
        expect(note).to_have_text(VIEWER_WORDS)
        expect(page.locator(".jp-LauncherCard:visible")).to_have_count(0)
        # The file browser: no "+", new folder or upload (refresh stays).
        toolbar = page.locator("#filebrowser .jp-FileBrowser-toolbar")
        expect(toolbar.locator("[data-jp-item-name=refresh]")).to_be_visible()
        for name in ("new-launcher", "new-directory", "uploader"):
            expect(toolbar.locator(f"[data-jp-item-name={name}]")).to_be_hidden()
        # The File menu's New items are disabled.
        page.locator(".lm-MenuBar-itemLabel", has_text="File").click()
        page.locator(".lm-Menu-item", has_text="New").first.hover()
        for label in ("Notebook", "Terminal"):
            item = page.locator(".lm-Menu-item:visible").filter(
                has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{label}$"))
            )
            expect(item).to_have_attribute("aria-disabled", "true")
        page.keyboard.press("Escape")
        page.keyboard.press("Escape")
        page.screenshot(path=SHOTS / "viewer-launcher.png")

        # A notebook: its cells do not take typing, and saving says why, in role words.
        page.locator("#filebrowser").get_by_text(NB, exact=True).dblclick()
        panel = page.locator(".jp-NotebookPanel:visible")
        editor = panel.locator(".jp-Cell").first.locator(".cm-content")
        expect(editor).to_contain_text(ORIGINAL, timeout=30_000)
        expect(editor).to_have_attribute("aria-readonly", "true")
        editor.click()
        page.keyboard.type("# typed by the viewer")
        expect(editor).to_have_text(ORIGINAL)
        toast = page.locator(".Toastify__toast").filter(has_text=VIEWER_WORDS)
        expect(toast).to_have_count(1)
        expect(toast.get_by_role("button", name="Save a copy")).to_be_visible()
        toast.locator(".jp-Notification-Toast-Close").click()
        expect(toast).to_have_count(0)
        page.keyboard.press("Control+s")
        expect(toast).to_have_count(1)
        expect(page.get_by_text("Saving failed")).to_have_count(0)
        page.wait_for_timeout(500)
        page.screenshot(path=SHOTS / "viewer-notebook-read-only.png")

        # Where the server still refuses (a request JupyterLab would make), the same words.
        answer = page.evaluate(
            """async url => {
                const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
                const r = await fetch(url, {method: 'PUT', body: JSON.stringify(
                    {type: 'file', format: 'text', content: 'x'}),
                    headers: {'X-XSRFToken': decodeURIComponent(xsrf)}});
                return [r.status, (await r.json()).message];
            }""",
            f"{SERVER}/api/contents/uploaded.txt",
        )
        assert answer == [403, VIEWER_WORDS]
        assert source_on_disk(people[OWNER]) == ORIGINAL
    finally:
        page.context.close()


def project_container(docker_engine) -> str:
    from conftest import PREFIX

    labels = [f"gpulab.instance={PREFIX}", f"gpulab.owner={OWNER}", f"gpulab.project={PROJECT}"]
    found = docker_engine.call("containers", filters={"label": labels})
    assert len(found) == 1, found
    return found[0]["Id"]


def login_shell(docker_engine, shell: str, command: str) -> str:
    """``command`` in a login shell of the project's container, as `docker exec` or SSH
    would start one (the notebook user, the image's environment)."""
    cid = project_container(docker_engine)
    run = docker_engine.call("exec_create", cid, [shell, "-lc", command], user="1000:100")
    return docker_engine.call("exec_start", run["Id"]).decode(errors="replace")


def test_login_shells_get_the_projects_python(docker_engine, project):
    out = login_shell(docker_engine, "sh", "command -v python; command -v pip; echo $VIRTUAL_ENV")
    assert out.split() == ["/opt/gpulab/venv/bin/python", "/opt/gpulab/venv/bin/pip",
                           "/opt/gpulab/venv"]  # fmt: skip
    out = login_shell(docker_engine, "bash", 'python -c "import gpulab_jupyter, sys; '
                      'print(sys.prefix)"; echo $SHELL')  # fmt: skip
    assert out.split() == ["/opt/gpulab/venv", "/bin/bash"]


@pytest.mark.browser
def test_owner_terminal_runs_the_projects_python(hub, people, project, browser):
    from playwright.sync_api import expect

    # Screen reader mode (a JupyterLab setting): the terminal's text is also in the page.
    r = people[OWNER].api(
        "PUT",
        f"{SERVER}/lab/api/settings/@jupyterlab/terminal-extension:plugin",
        json={"raw": '{"screenReaderMode": true}'},
    )
    assert r.status_code == 204, r.text
    page = lab_page(browser, hub, OWNER)
    try:
        open_launcher(page)
        page.locator(".jp-LauncherCard:visible").filter(has_text="Terminal").first.click()
        terminal = page.locator(".jp-Terminal:visible")
        text = terminal.locator(".xterm-accessibility-tree")
        expect(text).to_contain_text("$", timeout=30_000)  # the prompt
        terminal.click()
        # Each command, then its answer (typing ahead would mix them on the screen).
        answers = {
            'python -c "import sys; print(sys.prefix)"': "/opt/gpulab/venv",  # the notebook's
            "pip --version": re.compile(r"^pip \S+ from /opt/gpulab/venv/lib/python3"),
            "echo $0": "/bin/bash",  # bash, not sh
        }
        for command, answer in answers.items():
            prompts = len(re.findall(r"/workspace\$", text.inner_text()))
            page.keyboard.type(command)
            page.keyboard.press("Enter")
            page.wait_for_function(
                "([n, sel]) => (document.querySelector(sel).innerText.match(/workspace\\$/g)"
                " || []).length > n",
                arg=[prompts, ".jp-Terminal .xterm-accessibility-tree"],
                timeout=20_000,
            )
            rows = [r.strip() for r in text.inner_text().splitlines() if r.strip()]
            after = rows[[i for i, r in enumerate(rows) if r.endswith(command)][-1] + 1]
            if isinstance(answer, str):
                assert after == answer, rows
            else:
                assert answer.match(after), rows
        assert not [r for r in rows if "not found" in r], rows
        page.wait_for_timeout(300)
        page.screenshot(path=SHOTS / "owner-terminal.png")

        # On this host without a GPU, the GPU panel says so, and not "ask for a GPU".
        page.locator("[data-gpulab=status]").click()
        box = page.locator("[data-gpulab=panel] .jp-gpulab-NoGpu")
        expect(box).to_have_attribute("data-reason", "no_driver")
        expect(box.locator(".jp-gpulab-Reason")).to_have_text(
            re.compile(r"^This host has no NVIDIA driver: gpulab found no GPU on it")
        )
        expect(box).not_to_contain_text("GPUs for this project")
        page.screenshot(path=SHOTS / "owner-gpu-panel-no-driver.png")

        # The launcher's TensorBoard tile opens TensorBoard in a JupyterLab tab (issue 16),
        # with the loss curve a script in the project wrote.
        people[OWNER].execute(
            PROJECT,
            "from tensorboard.summary import Writer\n"
            "w = Writer('runs/first-try')\n"
            "for s in range(20): w.add_scalar('loss', 1 / (s + 1), step=s)\n"
            "w.close()",
        )
        gpu_tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(has_text="GPU")
        gpu_tab.locator(".lm-TabBar-tabCloseIcon").click()  # room for TensorBoard
        open_launcher(page)
        page.locator(".jp-LauncherCard:visible").filter(has_text="TensorBoard").first.click()
        board = page.frame_locator(".jp-ServerProxy iframe").first
        expect(board.locator("body")).to_contain_text("runs/first-try", timeout=90_000)
        expect(board.locator("body")).to_contain_text("loss")
        page.wait_for_timeout(1_500)
        page.screenshot(path=SHOTS / "owner-tensorboard-tab.png")
    finally:
        page.context.close()

"""Users' secrets against a real hub and a real project container (one project start for
every check here).

The owner adds HF_TOKEN on the Secrets page in Chromium and chooses it for their
project (test-output/secrets-page.png, docs/img/secrets-page.png); a kernel, a
terminal and a job the owner starts have it, and ``gpulab_jupyter.secrets.get``
returns it; a collaborator's kernel does not, until the owner lets collaborators'
processes have it; viewers, strangers and the project server's own token are
refused by the hub's API. Then the value is looked for, byte for byte, where it must
never be: every file of the hub's folder (its database, logs, build logs),
the container's settings and log, the images (``docker history`` and every layer),
and a copy a viewer saves of the project's notebook.
"""

from __future__ import annotations

import hashlib
import json
import secrets as pysecrets
import shutil
import time

import pytest
import requests
from browser_kit import DOCS_IMG, SHOTS
from conftest import PREFIX
from playwright.sync_api import expect
from security.people import (
    NB,
    execute,
    log_in_admin,
    make_user,
    open_ws,
    password,
    share_by_link,
    start_with_notebook,
)

pytestmark = [
    pytest.mark.docker,
    pytest.mark.browser,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

OWNER, PROJECT = "seowner", "se-proj"
COLLAB, VIEWER, STRANGER = "secollab", "seviewer", "sestranger"
SERVER = f"/user/{OWNER}/{PROJECT}"
API = f"/hub/api/gpulab/secrets/{OWNER}/{PROJECT}"
# A value of this run, as a token looks (40 characters after the prefix).
VALUE = "hf_" + pysecrets.token_urlsafe(30)[:40]
DIGEST = hashlib.sha256(VALUE.encode()).hexdigest()
READS = (
    "import os\n"
    "from gpulab_jupyter import secrets\n"
    "print(os.environ.get('HF_TOKEN', 'absent'))\n"
    "try:\n"
    "    print('get:', secrets.get('HF_TOKEN'))\n"
    "except secrets.MissingSecret as e:\n"
    "    print('missing:', e)\n"
    "print('names:', secrets.names())\n"
)


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {n: make_user(hub, admin, n) for n in (OWNER, COLLAB, VIEWER, STRANGER)}


@pytest.fixture(scope="module")
def project(people):
    owner = people[OWNER]
    start_with_notebook(owner, PROJECT)
    share_by_link(owner, PROJECT, people[COLLAB], "collaborator")
    share_by_link(owner, PROJECT, people[VIEWER], "viewer")
    yield PROJECT
    owner.stop_project(PROJECT)


@pytest.fixture(scope="module")
def chosen(hub, browser, people, project) -> dict:
    """The owner, in Chromium, adds HF_TOKEN and chooses it for the project: what the
    page said after each step, and its HTML."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(20_000)
    page = context.new_page()
    said = {}
    try:
        page.goto(f"{hub.url}/hub/login")
        page.get_by_label("Username").fill(OWNER)
        page.get_by_label("Password").fill(password(OWNER))
        page.get_by_role("button", name="Sign In").click()
        expect(page).to_have_url(f"{hub.url}/hub/home")
        page.locator('[data-gpulab="nav-secrets"]').click()
        expect(page).to_have_url(f"{hub.url}/hub/gpulab/secrets")
        said["empty"] = page.locator("#gpulab-secrets").inner_text()
        page.get_by_placeholder("NAME, e.g. HF_TOKEN").fill("HF_TOKEN")
        page.get_by_placeholder("value", exact=True).fill(VALUE)
        page.get_by_role("button", name="Add", exact=True).click()
        said["added"] = page.locator("#secrets-message").inner_text()
        said["added_html"] = page.content()
        card = page.locator(f'form.choose-form[data-project="{PROJECT}"]')
        card.get_by_label("HF_TOKEN").check()
        card.get_by_role("button", name=f"Save for {PROJECT}").click()
        said["chosen"] = page.locator("#secrets-message").inner_text()
        said["chosen_html"] = page.content()
        said["row"] = page.locator('tr.secret[data-name="HF_TOKEN"]').inner_text()
        page.screenshot(path=SHOTS / "secrets-page.png", full_page=True)
    finally:
        context.close()
    return said


def test_the_owner_adds_a_secret_and_chooses_it_for_a_project(chosen):
    assert "You have no secrets yet." in chosen["empty"]
    assert chosen["added"] == "Added HF_TOKEN. Choose below which of your projects get it."
    assert chosen["chosen"] == (
        f"New kernels, terminals and jobs in {PROJECT} get: HF_TOKEN. "
        "Restart running kernels to use them."
    )
    assert chosen["row"].startswith("HF_TOKEN") and "set " in chosen["row"]
    for html in (chosen["added_html"], chosen["chosen_html"]):
        assert VALUE not in html  # never shown again, not even in a field
    shutil.copyfile(SHOTS / "secrets-page.png", DOCS_IMG / "secrets-page.png")


def test_the_owners_kernel_terminal_and_job_have_it(hub, people, chosen):
    owner = people[OWNER]
    out = execute(owner.base, SERVER, owner.token, READS).splitlines()
    assert out == [VALUE, f"get: {VALUE}", "names: ['HF_TOKEN']"]

    r = owner.api("POST", f"{SERVER}/api/terminals")
    assert r.status_code == 200, r.text
    name = r.json()["name"]
    ws = open_ws(owner.base, SERVER, f"/terminals/websocket/{name}", token=owner.token)
    try:
        ws.send(json.dumps(["stdin", "echo TOKEN=${HF_TOKEN}=END\r"]))
        seen, deadline = "", time.monotonic() + 30
        while f"TOKEN={VALUE}=END" not in seen and time.monotonic() < deadline:
            kind, *rest = json.loads(ws.recv())
            if kind == "stdout":
                seen += rest[0]
        assert f"TOKEN={VALUE}=END" in seen, seen[-500:]
    finally:
        ws.close()
        owner.api("DELETE", f"{SERVER}/api/terminals/{name}")

    script = "import hashlib as h, os\nprint(h.sha256(os.environ['HF_TOKEN'].encode()).hexdigest())"
    body = {"type": "file", "format": "text", "content": script}
    assert owner.api("PUT", f"{SERVER}/api/contents/show.py", json=body).status_code == 201
    r = owner.api("POST", f"{SERVER}/api/gpulab/v1/jobs", json={"target": "show.py"})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        got = owner.api("GET", f"{SERVER}/api/gpulab/v1/jobs/{job}").json()
        if got["state"] not in ("starting", "running") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got["state"] == "succeeded", got
    assert DIGEST in got["log_tail"]


def test_a_collaborators_kernel_gets_it_only_once_the_owner_allows_it(people, chosen):
    owner, collab = people[OWNER], people[COLLAB]
    out = execute(collab.base, SERVER, collab.token, READS).splitlines()
    assert out[0] == "absent" and out[-1] == "names: []"
    assert out[1].startswith("missing: HF_TOKEN is not one of the secrets this kernel got")
    assert f"get {OWNER}'s secrets only where {OWNER} allows it" in out[1]

    xsrf = owner.http.cookies.get("_xsrf", path="/hub/")
    form = {"_xsrf": xsrf, "action": "choose", "project": PROJECT, "names": "HF_TOKEN"}
    r = owner.http.post(
        f"{owner.base}/hub/gpulab/secrets", data={**form, "collaborators": "1"}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert "Collaborators&#39; kernels, terminals and jobs get them too." in r.text
    time.sleep(3.5)  # a project server keeps a person's answer 3 s at most
    out = execute(collab.base, SERVER, collab.token, READS).splitlines()
    assert out == [VALUE, f"get: {VALUE}", "names: ['HF_TOKEN']"]


def test_the_hubs_api_refuses_viewers_strangers_and_the_servers_own_token(hub, people, chosen):
    owner, viewer, stranger = people[OWNER], people[VIEWER], people[STRANGER]

    def ask(token: str, path: str = API, **params) -> requests.Response:
        headers = {"Authorization": f"token {token}"} if token else {}
        return requests.get(hub.url + path, headers=headers, params=params, timeout=30)

    mine = ask(owner.token)
    assert mine.status_code == 200 and mine.json() == {"env": {"HF_TOKEN": VALUE}}
    assert mine.headers["Cache-Control"] == "no-store"
    assert ask(viewer.token).status_code == 403
    assert ask(stranger.token).status_code == 403
    other = f"/hub/api/gpulab/secrets/{OWNER}/no-such-project"
    assert ask(stranger.token, other).status_code == 403  # no hint that it does not exist
    assert ask(owner.token, other).status_code == 404
    # Only gpulab's SSH gateway may ask for someone else.
    assert ask(owner.token, **{"for": VIEWER}).status_code == 403
    assert ask(viewer.token, **{"for": OWNER}).status_code == 403
    # The project server's own token belongs to the owner, and everyone who runs code in
    # the container can read it: it gets nothing.
    code = "import os; print(os.environ['JUPYTERHUB_API_TOKEN'])"
    server_token = execute(owner.base, SERVER, owner.token, code).strip()
    refused = ask(server_token)
    assert refused.status_code == 403 and VALUE not in refused.text
    # The owner's browser session (cookies, no token) gets nothing either.
    by_cookie = owner.http.get(hub.url + API, timeout=30)
    assert by_cookie.status_code == 403 and VALUE not in by_cookie.text
    # A viewer cannot start anything that would get them.
    kernel = viewer.api("POST", f"{SERVER}/api/kernels", json={"name": "python3"})
    assert kernel.status_code == 403


def _files_holding(root, needle: bytes) -> tuple[list[str], int]:
    """Files under ``root`` (links not followed) that hold ``needle``; how many were read."""
    import os

    found, read = [], 0
    for top, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(top, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                if needle in f.read():
                    found.append(path)
            read += 1
    return found, read


def test_the_value_is_in_no_file_image_log_or_copy(hub, people, chosen, docker_engine):
    needle = VALUE.encode()
    # The hub's folder: its database (names in clear, values encrypted), logs, build logs.
    hub_dir = hub.home / "hub"
    assert b"HF_TOKEN" in (hub_dir / "jupyterhub.sqlite").read_bytes()
    assert list((hub_dir / "projects" / OWNER / PROJECT).rglob("build-*.log"))
    found, read = _files_holding(hub_dir, needle)
    assert found == [] and read > 10
    assert f"{OWNER}/{PROJECT} gives {OWNER} (owner) the secrets HF_TOKEN" in hub.log

    # The container: its settings and its log (which names what it handed out).
    labels = [f"gpulab.instance={PREFIX}", f"gpulab.owner={OWNER}", f"gpulab.project={PROJECT}"]
    [found] = docker_engine.call("containers", filters={"label": labels})
    container = found["Id"]
    settings = docker_engine.call("inspect_container", container)
    assert needle not in json.dumps(settings).encode()
    log = docker_engine.call("logs", container)
    assert b"new process gets the secrets HF_TOKEN" in log and needle not in log

    # The images: their history and every byte of every layer.
    image = settings["Image"]
    history = docker_engine.call("history", image)
    assert history and needle not in json.dumps(history).encode()
    tail, size = b"", 0
    for chunk in docker_engine.call("get_image", image):
        assert needle not in tail + chunk
        tail = chunk[-len(needle) :]
        size += len(chunk)
    assert size > 10_000_000  # the whole image was read

    # A viewer's saved copy of the project's notebook, in a project of their own.
    viewer = people[VIEWER]
    xsrf = viewer.http.cookies.get("_xsrf", path="/hub/")
    r = viewer.http.post(
        f"{viewer.base}/hub/gpulab/copy",
        params={"owner": OWNER, "project": PROJECT, "path": NB},
        data={"_xsrf": xsrf, "target": "", "new_project": "se-copy"},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 302, r.text
    copy = hub.home / "projects" / VIEWER / "se-copy"
    assert (copy / "notes (copy).ipynb").is_file()
    found, read = _files_holding(copy, needle)
    assert found == [] and read >= 2

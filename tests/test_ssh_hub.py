"""SSH into projects, the hub's side on the real session hub: the SSH page and the
gateway's access API (the key store's own tests: test_ssh_keys.py).

- /hub/gpulab/ssh: a user adds the key Debian's ssh-keygen made, sees it with the
  fingerprint ``ssh-keygen -lf`` prints, deletes it; a POST without XSRF is refused;
  another user neither sees nor deletes it; the page gives the ssh command of each
  project the user may open a shell in, and Chromium shows it.
- /hub/api/gpulab/ssh/access/<user>/<owner>/<project> answers the gateway's token
  (made the way JupyterHub makes a service's tokens, in the hub's database) for the
  owner, a collaborator (own share or group's), a viewer, and refuses alike a stranger,
  a revoked share, an unapproved account and an unknown project; a user's, a
  collaborator's or an admin's token gets 403.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from browser_kit import DOCS_IMG, SHOTS
from security.people import log_in_admin, make_user, page_post, password
from test_ssh_keys import (  # the key store's tests make the keys these use
    COLLAB,
    GROUP,
    LAPSED,
    MEMBER,
    OWNER,
    PROJECT,
    REVOKED,
    STRANGER,
    VIEWER,
    keygen,
    keygen_fingerprint,
    make_keys,
)

from gpulab_hub import ssh
from gpulab_hub.ssh.keys import KeyStore


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, str]:
    return make_keys(tmp_path_factory.mktemp("keys"))


# --- on the session hub ----------------------------------------------------------------
@pytest.fixture(scope="module")
def admin(hub):
    return log_in_admin(hub)


@pytest.fixture(scope="module")
def people(hub, admin):
    """The owner's running project, shared by name with a collaborator, a viewer, a
    group (as collaborator), one revoked, and one whose account is then unapproved."""
    names = (OWNER, COLLAB, VIEWER, STRANGER, MEMBER, REVOKED, LAPSED)
    users = {n: make_user(hub, admin, n) for n in names}
    r = admin.api("POST", f"/hub/api/groups/{GROUP}", json={"users": [MEMBER]})
    assert r.status_code == 201, r.text
    owner = users[OWNER]
    owner.start_project(PROJECT)
    for name, kind, role in [
        (COLLAB, "user", "collaborator"),
        (VIEWER, "user", "viewer"),
        (GROUP, "group", "collaborator"),
        (REVOKED, "user", "collaborator"),
        (LAPSED, "user", "collaborator"),
    ]:
        r = page_post(owner, PROJECT, action=kind, name=name, role=role)
        assert r.status_code == 200 and f"Shared with {kind} {name}" in r.text, r.text
    r = page_post(owner, PROJECT, action="revoke-user", name=REVOKED)
    assert r.status_code == 200 and "Revoked" in r.text, r.text
    assert admin.authorize(LAPSED, "unauthorize").status_code == 200
    yield users
    owner.stop_project(PROJECT)


@pytest.fixture(scope="module")
def gateway_token(hub):
    """A token of the gateway service, made as JupyterHub makes a service's tokens
    (orm.Service.new_api_token) in the hub's own database: it carries the service's
    role, and nothing else."""
    from jupyterhub import orm

    url = f"sqlite:///{hub.home / 'hub' / 'jupyterhub.sqlite'}"
    db = orm.new_session_factory(url)()
    try:
        service = orm.Service.find(db, ssh.SERVICE)
        assert service is not None, "the hub has no SSH gateway service"
        token = service.new_api_token(note="gpulab tests: the gateway", expires_in=1800)
    finally:
        db.close()
    return token


def ask(hub, token: str | None, user: str, owner: str, project: str):
    import requests

    headers = {"Authorization": f"token {token}"} if token else {}
    url = ssh.access_url(hub.url + "/hub/api", user, owner, project)
    return requests.get(url, headers=headers, timeout=20)


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_the_gateway_learns_each_persons_role(hub, people, gateway_token, docker_engine):
    def answer(user, owner=OWNER, project=PROJECT):
        r = ask(hub, gateway_token, user, owner, project)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("application/json")
        return r.json()

    mine = answer(OWNER)
    assert mine["role"] == "owner" and mine["message"] == ""
    assert mine["exists"] and mine["running"] and mine["pending"] is None and mine["can_start"]
    # the container the gateway will exec into is the project's, running
    running = docker_engine.call("containers", filters={"name": mine["container"]})
    assert [c["Names"][0] for c in running] == ["/" + mine["container"]]
    info = docker_engine.call("inspect_container", mine["container"])
    assert info["Config"]["User"] == mine["exec_user"]
    assert info["Config"]["Labels"]["gpulab.owner"] == OWNER
    assert mine["workdir"] and mine["url"] == f"/user/{OWNER}/{PROJECT}/lab"
    assert mine["prefix"] == hub.env["GPULAB_CONTAINER_PREFIX"]

    for who in (COLLAB, MEMBER):  # own share, and the group's
        theirs = answer(who)
        assert theirs["role"] == "collaborator" and theirs["message"] == "", theirs
        assert theirs["container"] == mine["container"] and theirs["running"]
        assert theirs["can_start"] is False  # the owner has not allowed collaborators to

    viewer = answer(VIEWER)
    assert viewer["role"] == "viewer" and viewer["container"] == "" and viewer["exists"]
    assert viewer["message"] == (
        f"You are a viewer of {OWNER}'s project {PROJECT}: viewers cannot open a shell. "
        f"Ask {OWNER} to make you a collaborator."
    )

    # Nothing tells a stranger, a revoked share, an unapproved account and an unknown
    # project apart.
    nothing = {
        (STRANGER, OWNER, PROJECT),
        (REVOKED, OWNER, PROJECT),
        (LAPSED, OWNER, PROJECT),
        ("sknobody", OWNER, PROJECT),
        (COLLAB, OWNER, "nosuch"),
        (COLLAB, "sknoowner", PROJECT),
    }
    for user, owner, project in nothing:
        got = answer(user, owner, project)
        assert got["message"] == f"{owner} has no project {project} shared with you.", got
        assert got["role"] == "" and got["container"] == ""
        assert got["exists"] is False and got["running"] is False
        assert got["can_start"] is False and got["workdir"] == "" and got["url"] == ""
    own_none = answer(OWNER, OWNER, "nosuch")
    assert own_none["role"] == "" and own_none["message"] == "You have no project nosuch."


@pytest.mark.docker
def test_only_the_gateways_token_may_ask(hub, people, admin, gateway_token):
    for token in (people[OWNER].token, people[COLLAB].token, admin.token, None, "not-a-token"):
        r = ask(hub, token, OWNER, OWNER, PROJECT)
        assert r.status_code == 403, (token, r.text)
        assert "container" not in r.text
    # an owner's session in a browser gets no more
    r = people[OWNER].http.get(ssh.access_url(hub.url + "/hub/api", OWNER, OWNER, PROJECT))
    assert r.status_code == 403
    # names that no login name holds
    bad = [("a b", OWNER, PROJECT), (OWNER, OWNER, "Bad_Name"), ("x~y", OWNER, PROJECT)]
    for user, owner, project in bad:
        assert ask(hub, gateway_token, user, owner, project).status_code in (400, 404)


# --- the page ---------------------------------------------------------------------------
def xsrf(user) -> str:
    return user.http.cookies.get("_xsrf", path="/hub/")


def page(user):
    r = user.http.get(f"{user.base}/hub/gpulab/ssh", timeout=20)
    assert r.status_code == 200, r.text
    return r.text


def post(user, with_xsrf: bool = True, **form):
    data = {**form, **({"_xsrf": xsrf(user)} if with_xsrf else {})}
    return user.http.post(f"{user.base}/hub/gpulab/ssh", data=data, timeout=20)


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_a_user_adds_sees_and_deletes_a_key(hub, people, made, tmp_path):
    owner, other = people[OWNER], people[STRANGER]
    pub = keygen(tmp_path, "owner-laptop").with_suffix(".pub")
    fingerprint = keygen_fingerprint(pub)
    text = pub.read_text()

    assert post(owner, with_xsrf=False, action="add", key=text).status_code == 403
    assert fingerprint not in page(owner)

    r = post(owner, action="add", key=text)
    assert r.status_code == 200
    assert f"Added your ssh-ed25519 key (owner-laptop@laptop): {fingerprint}" in r.text
    listed = page(owner)
    assert f'data-fingerprint="{fingerprint}"' in listed and "owner-laptop@laptop" in listed
    # the gateway reads the same store
    store = KeyStore(ssh.paths(hub.home / "hub")["keys_dir"])
    assert [k.fingerprint for k in store.keys(OWNER)] == [fingerprint]

    # another user: does not see it, cannot delete it, cannot claim it
    assert fingerprint not in page(other)
    r = post(other, action="delete", fingerprint=fingerprint)
    assert r.status_code == 404 and "You have no key" in r.text
    r = post(other, action="add", key=text)
    assert r.status_code == 400 and "already on another gpulab account" in r.text
    assert fingerprint in page(owner) and store.keys(STRANGER) == []

    # a private key pasted by mistake is refused, and not shown back
    r = post(owner, action="add", key=made["ed25519_private"])
    assert r.status_code == 400 and "That is a private key: paste the .pub file" in r.text
    assert made["ed25519_private"].splitlines()[1] not in r.text

    assert post(owner, with_xsrf=False, action="delete", fingerprint=fingerprint).status_code == 403
    r = post(owner, action="delete", fingerprint=fingerprint)
    assert r.status_code == 200 and f"Deleted the key {fingerprint}" in r.text
    assert fingerprint not in page(owner) and store.keys(OWNER) == []


@pytest.mark.docker
def test_the_page_says_how_to_connect(hub, people):
    port = hub.env["GPULAB_SSH_PORT"]
    shown = r'class="form-control font-monospace ssh-command"[^>]*value="([^"]+)"'
    commands = {
        name: re.findall(shown, page(people[name]))
        for name in (OWNER, COLLAB, MEMBER, VIEWER, REVOKED)
    }
    assert commands[OWNER] == [f"ssh -p {port} {OWNER}+{PROJECT}@127.0.0.1"]
    assert commands[COLLAB] == [f"ssh -p {port} {COLLAB}+{OWNER}~{PROJECT}@127.0.0.1"]
    assert commands[MEMBER] == [f"ssh -p {port} {MEMBER}+{OWNER}~{PROJECT}@127.0.0.1"]
    assert commands[VIEWER] == [] and commands[REVOKED] == []
    viewer = page(people[VIEWER])
    # the project by its display name (none given here: its name), and whose it is
    assert f"{PROJECT} ({OWNER}'s): you are a viewer; viewers get no shell" in viewer
    owner = " ".join(page(people[OWNER]).split())  # the words, as a reader sees them
    assert 'href="/hub/token"' in owner
    assert "If your SSH client cannot use keys" in owner and "use a token from the" in owner
    # The host key fingerprint the page gives is the gateway's, or it says it has none yet.
    pub = Path(str(ssh.paths(hub.home / "hub")["host_key"]) + ".pub")
    if pub.exists():
        assert keygen_fingerprint(pub) in owner
    else:
        assert "The SSH gateway has not started yet" in owner


@pytest.mark.docker
def test_deleting_an_account_deletes_its_keys(hub, admin, made):
    user = make_user(hub, admin, "skgone")
    assert post(user, action="add", key=made["ecdsa521"]).status_code == 200
    store = KeyStore(ssh.paths(hub.home / "hub")["keys_dir"])
    assert len(store.keys("skgone")) == 1
    assert admin.api("DELETE", "/hub/api/users/skgone?confirm=skgone").status_code == 204
    assert store.keys("skgone") == []
    again = make_user(hub, admin, "skgone")  # a later account of that name
    assert "data-fingerprint" not in page(again)


@pytest.mark.browser
@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_the_ssh_page_in_chromium(hub, people, browser, tmp_path):
    from playwright.sync_api import expect

    pub = keygen(tmp_path, "work-laptop").with_suffix(".pub")
    fingerprint = keygen_fingerprint(pub)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=hub.url)
    context.set_default_timeout(20_000)
    try:
        page_ = context.new_page()
        page_.goto(f"{hub.url}/hub/login")
        page_.get_by_label("Username").fill(OWNER)
        page_.get_by_label("Password").fill(password(OWNER))
        page_.get_by_role("button", name="Sign In").click()
        page_.locator('[data-gpulab="nav-ssh"]').click()
        expect(page_).to_have_url(f"{hub.url}/hub/gpulab/ssh")
        page_.locator("#ssh-key-text").fill(pub.read_text())
        page_.get_by_role("button", name="Add key").click()
        expect(page_.locator("#ssh-message")).to_contain_text(fingerprint)
        row = page_.locator(f'tr.ssh-key[data-fingerprint="{fingerprint}"]')
        expect(row.locator(".fingerprint")).to_have_text(fingerprint)
        expect(row.locator(".comment")).to_have_text("work-laptop@laptop")
        command = f"ssh -p {hub.env['GPULAB_SSH_PORT']} {OWNER}+{PROJECT}@127.0.0.1"
        expect(page_.locator("#ssh-command-own-1")).to_have_value(command)
        page_.locator("#ssh-copy-own-1").click()
        expect(page_.locator("#ssh-copy-own-1")).to_have_text("Copied")
        assert page_.evaluate("navigator.clipboard.readText()") == command
        shot = SHOTS / "ssh-page.png"
        page_.screenshot(path=shot, full_page=True)
        # delete it again with the row's button
        row.get_by_role("button", name="Delete").click()
        expect(page_.locator("#ssh-message")).to_contain_text(f"Deleted the key {fingerprint}")
        expect(page_.locator(f'tr.ssh-key[data-fingerprint="{fingerprint}"]')).to_have_count(0)
        DOCS_IMG.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / "ssh-page.png")
    finally:
        context.close()

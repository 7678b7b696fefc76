"""Four smaller holes (issue 23), each attacked on the session hub and shown closed.

1. A plain cross-site link (``GET /hub/spawn/<me>/<name>?opt-gpus=N``) made and
   started a project: a GET now only shows (home/spawn.py); a start needs a POST with
   JupyterHub's XSRF token.
2. A project server's own token (in the container's environment, readable by
   collaborators) could report activity for every project of the owner, keeping them
   from the idle culler: now only for its own server (sharing/activity.py).
3. One account could claim another's SSH public key: adding it is refused without
   naming the account, and the gateway lets a key in only to the account that added it
   first, whatever the key files hold (ssh/keys.py).
4. A login's time told whether the name has an account (no bcrypt for unknown names):
   every failed login now costs one bcrypt check (accounts/auth.py).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests
from hubclient import HubUser
from people import log_in_admin, make_user, password

from gpulab_hub import ssh
from gpulab_hub.ssh import keys as sshkeys

OWNER, SQUATTER, VICTIM = "showner", "shsquat", "shvictim"
KNOWN, PENDING = "shknown", "shpending"
RUNS, IDLE = "shruns", "shidle"  # the owner's projects: one started, one never started


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin(hub):
    return log_in_admin(hub)


@pytest.fixture(scope="module")
def owner(hub, admin):
    user = make_user(hub, admin, OWNER)
    for project in (RUNS, IDLE):  # made, not started (as the home page's "Create" does)
        r = user.api("PUT", f"/hub/api/users/{OWNER}/servers/{project}", json={})
        assert r.status_code in (200, 201), r.text
    yield user
    for project in (RUNS, IDLE):
        if project in servers(user):
            user.stop_project(project)


def servers(user: HubUser, stopped: bool = False) -> dict:
    query = "?include_stopped_servers" if stopped else ""
    r = user.api("GET", f"/hub/api/users/{user.name}{query}")
    assert r.status_code == 200, r.text
    return r.json()["servers"]


def containers(docker_engine, user: str, project: str) -> list:
    labels = [f"gpulab.owner={user}", f"gpulab.project={project}"]
    return docker_engine.call("containers", all=True, filters={"label": labels})


def xsrf(user: HubUser) -> str:
    return user.http.cookies.get("_xsrf", path="/hub/") or ""


# --- 1. a GET never makes or starts a project --------------------------------------------


@pytest.mark.docker
def test_a_link_to_the_spawn_page_makes_and_starts_nothing(hub, owner, docker_engine):
    spawn = f"{hub.url}/hub/spawn/{OWNER}"
    # A name with no project, with and without spawn options in the query: sent home,
    # nothing made.
    for query in ("?opt-gpus=1", "?gpus=1&display_name=Evil", ""):
        r = owner.http.get(f"{spawn}/shlinked{query}", allow_redirects=False, timeout=30)
        assert r.status_code == 302, r.status_code
        assert r.headers["Location"].endswith("/hub/home?missing=shlinked"), r.headers
    page = owner.http.get(f"{hub.url}/hub/home?missing=shlinked", timeout=30)
    assert "You have no project named \u201cshlinked\u201d" in page.content.decode()
    # Another user's name: JupyterHub's 404, nothing made for them either.
    r = owner.http.get(f"{hub.url}/hub/spawn/{KNOWN}x/new?opt-gpus=1", timeout=30)
    assert r.status_code in (403, 404), r.status_code

    # A stopped project, with options in the query: its form, and nothing starts.
    for query in ("?opt-gpus=1", "?opt-use_last_good=1", ""):
        r = owner.http.get(f"{spawn}/{RUNS}{query}", allow_redirects=False, timeout=30)
        assert r.status_code == 200, r.status_code
        assert f"Start project {RUNS}" in r.text and 'method="post"' in r.text
    # A cross-site form (no XSRF token) is refused.
    r = owner.http.post(f"{spawn}/{RUNS}", data={"gpus": "1"}, allow_redirects=False, timeout=30)
    assert r.status_code == 403, r.status_code
    time.sleep(2)  # a start that was set off would be pending by now
    assert "shlinked" not in servers(owner, stopped=True)
    assert RUNS not in servers(owner) and IDLE not in servers(owner)  # neither started
    for project in ("shlinked", RUNS, IDLE):
        assert not (hub.home / "projects" / OWNER / project).exists(), project
        assert containers(docker_engine, OWNER, project) == [], project

    # The form's own POST (the page's XSRF token in its action) starts it.
    page = owner.http.get(f"{spawn}/{RUNS}?opt-gpus=1", timeout=30)
    action = re.search(r'id="spawn_form"\s+action="([^"]+)"', page.text)
    assert action, page.text
    assert "opt-gpus" not in action.group(1)  # the query's options are not carried on
    r = owner.http.post(
        hub.url + action.group(1).replace("&amp;", "&"), allow_redirects=False, timeout=60
    )
    assert r.status_code == 302 and "/spawn-pending/" in r.headers["Location"], r.status_code
    owner.wait_ready(RUNS)
    # Running: the spawn page leads on to it.
    r = owner.http.get(f"{spawn}/{RUNS}", allow_redirects=False, timeout=30)
    assert r.status_code == 302 and f"/user/{OWNER}/{RUNS}" in r.headers["Location"]


# --- 2. a project server's token reports its own activity only ----------------------------


def stamp(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def last_activity(user: HubUser, project: str) -> str | None:
    return servers(user, stopped=True)[project]["last_activity"]


@pytest.mark.docker
def test_a_project_servers_token_reports_activity_for_its_own_server_only(hub, owner):
    if RUNS not in servers(owner):  # the first test started it; alone, start it here
        owner.start_project(RUNS)
    owner.wait_ready(RUNS)
    # What a collaborator's code reads in the container.
    token = owner.execute(RUNS, "import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
    assert re.fullmatch(r"[A-Za-z0-9_]{20,}", token), "no token in the project's environment"
    url = f"{hub.url}/hub/api/users/{OWNER}/activity"
    head = {"Authorization": f"token {token}"}
    scopes = requests.get(f"{hub.url}/hub/api/user", headers=head, timeout=30).json()["scopes"]
    assert f"users:activity!server={OWNER}/{RUNS}" in scopes, scopes
    assert not [s for s in scopes if s.startswith("users:activity!user")], scopes
    before = last_activity(owner, IDLE)
    now = stamp(datetime.now(UTC) + timedelta(minutes=30))  # what the culler would see
    for body in (
        {"servers": {IDLE: {"last_activity": now}}},
        {"servers": {RUNS: {"last_activity": now}, IDLE: {"last_activity": now}}},
        {"servers": {IDLE: {"last_activity": now}}, "last_activity": now},
        {"last_activity": now},  # the user as a whole
    ):
        r = requests.post(url, headers=head, json=body, timeout=30)
        assert r.status_code == 403, (body, r.status_code, r.text)
    assert last_activity(owner, IDLE) == before
    # Another user's activity: JupyterHub's 404, as for every token without access.
    r = requests.post(
        f"{hub.url}/hub/api/users/{KNOWN}/activity",
        headers=head,
        json={"last_activity": now},
        timeout=30,
    )
    assert r.status_code in (403, 404), r.status_code

    # Its own server: accepted, as jupyterhub-singleuser sends it.
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=2)  # newer than any
    mine = stamp(when)
    body = {"servers": {RUNS: {"last_activity": mine}}, "last_activity": mine}
    r = requests.post(url, headers=head, json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert datetime.fromisoformat(last_activity(owner, RUNS).replace("Z", "+00:00")) == when
    # The owner's own token may still report any of their projects (JupyterHub's rule).
    r = owner.api("POST", f"/hub/api/users/{OWNER}/activity", json={"last_activity": mine})
    assert r.status_code == 200, r.text


# --- 3. a key names one person --------------------------------------------------------------


def add_key(user: HubUser, text: str) -> requests.Response:
    return user.http.post(
        f"{user.base}/hub/gpulab/ssh",
        data={"_xsrf": xsrf(user), "action": "add", "key": text},
        timeout=30,
    )


def ssh_status(hub, login: str, key) -> subprocess.CompletedProcess:
    """``ssh login@gateway true`` with only ``key``; the gateway's host key is not what
    this test checks (test_ssh_gateway.py pins it)."""
    cmd = [
        "ssh", "-p", hub.env["GPULAB_SSH_PORT"], "-F", "/dev/null",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR",
        "-i", str(key), f"{login}@127.0.0.1", "true",
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.docker
def test_a_key_another_account_added_is_refused_and_never_logs_it_in(hub, admin, tmp_path):
    victim, squatter = make_user(hub, admin, VICTIM), make_user(hub, admin, SQUATTER)
    key = tmp_path / "victim"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "v@laptop", "-f", key], check=True
    )
    public = key.with_suffix(".pub").read_text()
    assert add_key(victim, public).status_code == 200
    # The squatter adds the victim's key (public keys are public), under another comment.
    page = add_key(squatter, public.replace("v@laptop", "mine"))
    assert page.status_code == 400
    assert "already on another gpulab account" in page.text
    assert VICTIM not in page.text  # nothing says whose
    blob = public.split()[1]
    assert blob not in squatter.http.get(f"{hub.url}/hub/gpulab/ssh", timeout=30).text
    folder = ssh.paths(hub.home / "hub")["keys_dir"]
    assert not (folder / f"{SQUATTER}.json").exists()

    # The squatter's key file holds it anyway, added after the victim's (a file from
    # before the rule, a restored backup): the gateway lets the key in for the victim
    # only.
    (folder / f"{SQUATTER}.json").write_text(
        json.dumps({"version": 1, "keys": [{"openssh": public.strip(), "added": time.time()}]})
    )
    assert [k.openssh.split()[1] for k in sshkeys.KeyStore(folder).keys(SQUATTER)] == [blob]
    stolen = ssh_status(hub, f"{SQUATTER}+nosuch", key)
    assert stolen.returncode == 255 and "Permission denied" in stolen.stderr, stolen.stderr
    own = ssh_status(hub, f"{VICTIM}+nosuch", key)  # logged in; then: no such project
    assert own.returncode != 255 and "Permission denied" not in own.stderr, own.stderr
    assert "nosuch" in own.stderr


def test_the_store_gives_a_key_to_the_account_that_added_it_first(tmp_path):
    folder = tmp_path / "keys"
    store = sshkeys.KeyStore(folder)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "a@b", "-f", tmp_path / "k"],
        check=True,
    )
    text = (tmp_path / "k.pub").read_text()
    first = store.add("alice", text)
    assert store.login_keys("alice") == [first]

    def plant(user: str, added: float) -> None:
        line = text.replace("a@b", f"{user}'s").strip()
        (folder / f"{user}.json").write_text(
            json.dumps({"version": 1, "keys": [{"openssh": line, "added": added}]})
        )

    plant("bob", first.added + 5)  # later: bob's copy opens nothing
    assert len(store.keys("bob")) == 1 and store.login_keys("bob") == []
    assert store.login_keys("alice") == [first]
    plant("carol", first.added)  # the same moment: neither is first, neither logs in
    assert store.login_keys("alice") == [] and store.login_keys("carol") == []


# --- 4. a login takes as long whether or not the name exists ---------------------------------


def login_seconds(http: requests.Session, base: str, name: str) -> float:
    token = http.cookies.get("_xsrf", path="/hub/") or ""
    started = time.perf_counter()
    r = http.post(
        f"{base}/hub/login?next=",
        data={"_xsrf": token, "username": name, "password": "not-the-Passw0rd-at-all"},
        allow_redirects=False,
        timeout=60,
    )
    took = time.perf_counter() - started
    assert r.status_code == 403, r.status_code  # refused, whoever it is
    return took


@pytest.mark.docker
def test_a_failed_login_takes_as_long_for_a_name_with_no_account(hub, admin):
    make_user(hub, admin, KNOWN)
    pending = HubUser(hub.url, PENDING, password(PENDING))  # signed up, not approved
    assert pending.signup().status_code == 200
    refused = pending.login()  # the right password: told why, from the one check
    assert refused.status_code == 403 and "approved by an administrator" in refused.text
    http = requests.Session()
    http.get(f"{hub.url}/hub/login", timeout=30)
    login_seconds(http, hub.url, "shnobody0")  # the hub's first such check makes its hash
    times: dict[str, list[float]] = {"unknown": [], KNOWN: [], PENDING: []}
    for i in range(5):  # 5: the account locks after 5 wrong passwords (still one check)
        times["unknown"].append(login_seconds(http, hub.url, f"shnobody{i + 1}"))
        times[KNOWN].append(login_seconds(http, hub.url, KNOWN))
        times[PENDING].append(login_seconds(http, hub.url, PENDING))
    median = {who: statistics.median(t) for who, t in times.items()}
    print("\nmedian seconds of a failed login:", {k: round(v, 4) for k, v in median.items()})
    for who in (KNOWN, PENDING):
        ratio = median["unknown"] / median[who]
        assert 0.5 <= ratio <= 2.0, f"unknown name vs {who}: {median}"

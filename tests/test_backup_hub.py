"""gpulab backup of the running session hub, gpulab restore onto a fresh GPULAB_HOME, and
a hub started there (one extra hub start): the owner logs in with the same password and
an old browser session still holds, sees the project and its files, the share still lets
the collaborator in (and not a stranger), the secret still decrypts when the project
starts, and the SSH key and the gateway's host key are the same.
"""

from __future__ import annotations

import re
import secrets as pysecrets
import subprocess
import tarfile

import pytest
import requests
from conftest import GPULAB, PREFIX, hub_env, start_hub
from hubclient import HubUser
from security.people import (
    NB,
    execute,
    log_in_admin,
    make_user,
    password,
    share_by_link,
    start_with_notebook,
)
from test_ssh_keys import keygen, keygen_fingerprint

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, FRIEND, STRANGER, PROJECT = "bkowner", "bkfriend", "bkstranger", "bk-proj"
SERVER = f"/user/{OWNER}/{PROJECT}"
VALUE = "bk_" + pysecrets.token_urlsafe(24)
WROTE = "print('written before the backup')"
HOST_KEY = re.compile(r'<code class="fingerprint">([^<]+)</code>')


def form(user: HubUser, page: str, **data) -> requests.Response:
    data["_xsrf"] = user.http.cookies.get("_xsrf", path="/hub/")
    r = user.http.post(f"{user.base}{page}", data=data, timeout=30)
    assert r.status_code == 200, r.text[-2000:]
    return r


@pytest.fixture(scope="module")
def before(hub, tmp_path_factory) -> dict:
    """On the session hub: three users, the owner's project with a notebook, shared with
    a collaborator, a secret chosen for it, an SSH key; the project stopped; a backup."""
    admin = log_in_admin(hub)
    people = {n: make_user(hub, admin, n) for n in (OWNER, FRIEND, STRANGER)}
    owner = people[OWNER]
    start_with_notebook(owner, PROJECT, source=WROTE)
    share_by_link(owner, PROJECT, people[FRIEND], "collaborator")
    form(owner, "/hub/gpulab/secrets", action="add", name="BK_TOKEN", value=VALUE)
    form(owner, "/hub/gpulab/secrets", action="choose", project=PROJECT, names="BK_TOKEN")
    pub = keygen(tmp_path_factory.mktemp("bkkeys"), "bkowner-laptop").with_suffix(".pub")
    form(owner, "/hub/gpulab/ssh", action="add", key=pub.read_text())
    ssh_page = owner.http.get(f"{hub.url}/hub/gpulab/ssh", timeout=20).text
    owner.stop_project(PROJECT)
    out = tmp_path_factory.mktemp("bkarchive") / "hub.tar.gz"
    made = hub.gpulab("backup", "--projects", "-o", str(out))
    assert made.returncode == 0, made.stderr
    return {
        "archive": out, "said": made.stdout, "owner": owner, "key": keygen_fingerprint(pub),
        "host_key": HOST_KEY.search(ssh_page).group(1),
    }  # fmt: skip


@pytest.fixture(scope="module")
def restored(before, docker_engine, tmp_path_factory):
    """`gpulab restore` onto a fresh GPULAB_HOME, then `gpulab up` there (containers of
    their own prefix); `gpulab down` at the end."""
    home = tmp_path_factory.mktemp("gpulab-restored-home")
    env = hub_env(home, GPULAB_CONTAINER_PREFIX=PREFIX + "bak")
    done = subprocess.run(
        [GPULAB, "restore", str(before["archive"])], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    hub = start_hub(home, env)
    yield {"hub": hub, "said": done.stdout}
    down = hub.gpulab("down")
    assert down.returncode == 0, down.stderr


def test_the_backup_says_what_it_wrote_and_holds_no_log(before):
    assert "SQLite's online backup: the hub keeps running" in before["said"]
    assert f"Wrote {before['archive']} (" in before["said"]
    assert before["archive"].stat().st_mode & 0o777 == 0o600
    with tarfile.open(before["archive"]) as tar:
        names = set(tar.getnames())
    want = {
        "hub/jupyterhub.sqlite",
        "hub/crypt-key",
        "hub/jupyterhub_cookie_secret",
        f"hub/ssh/keys/{OWNER}.json",
        "hub/ssh/host_ed25519_key",
        f"projects/{OWNER}/{PROJECT}/Dockerfile",
        f"projects/{OWNER}/{PROJECT}/{NB}",
    }
    assert want <= names
    assert "hub/hub.log" not in names
    # the secret is in the database (its value encrypted there), no longer in a file
    assert not [n for n in names if n.startswith("hub/secrets")]


def test_the_owner_logs_in_with_the_same_password_and_sees_the_project(before, restored):
    hub = restored["hub"]
    assert "Checked the archive:" in restored["said"]
    wrong = HubUser(hub.url, OWNER, "not-the-password-at-all")
    assert wrong.login().status_code != 302
    owner = HubUser(hub.url, OWNER, password(OWNER))
    assert owner.login().status_code == 302
    home = owner.http.get(f"{hub.url}/hub/home", timeout=20)
    assert home.status_code == 200 and PROJECT in home.text
    # the old hub's browser session still holds: the same cookie secret and database
    old = requests.Session()
    old.cookies.update(before["owner"].http.cookies)
    r = old.get(f"{hub.url}/hub/home", allow_redirects=False, timeout=20)
    assert r.status_code == 200 and PROJECT in r.text


def test_the_project_starts_with_its_files_its_secret_and_its_share(before, restored):
    hub = restored["hub"]
    owner, friend, stranger = (HubUser(hub.url, n, password(n)) for n in (OWNER, FRIEND, STRANGER))
    for user in (owner, friend, stranger):
        assert user.login().status_code == 302
        user.new_token()
    owner.start_project(PROJECT, timeout=300)
    try:
        code = "import os, json\nprint(os.environ.get('BK_TOKEN', 'absent'))\n"
        code += f"print(''.join(json.load(open({NB!r}))['cells'][0]['source']))"
        assert execute(owner.base, SERVER, owner.token, code).splitlines() == [VALUE, WROTE]
        r = friend.api("GET", f"{SERVER}/api/contents/{NB}")
        assert r.status_code == 200, r.text
        assert "".join(r.json()["content"]["cells"][0]["source"]) == WROTE
        assert stranger.api("GET", f"{SERVER}/api/contents/{NB}").status_code in (403, 404)
    finally:
        owner.stop_project(PROJECT)


def test_the_ssh_key_and_the_gateways_host_key_are_the_same(before, restored):
    hub = restored["hub"]
    owner = HubUser(hub.url, OWNER, password(OWNER))
    assert owner.login().status_code == 302
    page = owner.http.get(f"{hub.url}/hub/gpulab/ssh", timeout=20).text
    assert f'data-fingerprint="{before["key"]}"' in page
    assert HOST_KEY.search(page).group(1) == before["host_key"]  # known_hosts stay right

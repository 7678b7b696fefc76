"""GPULAB_AUTHENTICATOR=oidc against a real OpenID Connect provider: npm's certified
``oidc-provider`` (tests/oidc/provider.mjs), started here on a 127.0.0.1 port with one
confidential client (the hub) and a few people. A hub started with the ``oidc``
authenticator sends people to the provider's sign-in form; alice lands on gpulab's home
page with her provider groups as JupyterHub groups, which follow the provider at each
login; bob (in no allowed group) is refused with a page that says so; a wrong password
stays at the provider. Other people of the provider whose names fold to an account's
(``Carol``, ``\u212aaren``) or who call themselves by it (another ``carol``) never get
into it, nor become the admin; the admin, too, must be in an allowed group. Keycloak's
full group paths stay distinct groups. Behind a TLS proxy, the redirect URI gpulab
sends (OpenID Connect and GitHub) is the hub's public https one."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from html import unescape
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote, urljoin, urlsplit

import pytest
import requests

REPO = Path(__file__).resolve().parents[1]
PROVIDER = REPO / "tests" / "oidc" / "provider.mjs"
NODE_MODULES = REPO / ".venv" / "node" / "node_modules"
# GPULAB_ALLOWED_GROUPS, a Keycloak group by its full path among them
ALLOWED = ("gpu-team", "vision", "/staff/gpu-team")
KELVIN = "\u212aaren"  # KELVIN SIGN, then "aren": JupyterHub's lower() makes it "karen"
ACCOUNTS = {
    "alice": {"password": "alice's provider password", "groups": ["gpu-team"]},
    "bob": {"password": "bob's provider password", "groups": ["other"]},
    # the first admin (GPULAB_ADMIN), in an allowed group like everyone else
    "carol": {"password": "carol's provider password", "groups": ["vision"]},
    # other people of the provider (each its own sub and password) named like carol
    "Carol": {"password": "mallory's own password", "groups": []},
    "carol.twin": {
        "password": "the twin's own password",
        "groups": ["gpu-team"],
        "username": "carol",
    },
    "karen": {"password": "karen's provider password", "groups": ["gpu-team"]},
    KELVIN: {"password": "the kelvin sign's own password", "groups": ["gpu-team"]},
    # Keycloak's group mapper with "Full group path" on: two teams of one name
    "dana": {"password": "dana's provider password", "groups": ["/staff/gpu-team"]},
    "erin": {"password": "erin's provider password", "groups": ["/students/gpu-team"]},
}

PROVIDER_MISSING = shutil.which("node") is None or not (NODE_MODULES / "oidc-provider").is_dir()
PUBLIC = "https://gpulab.lab.example.org"


class Provider:
    """The running provider: its issuer URL, and who its people are (rewritable)."""

    def __init__(self, issuer: str, accounts_file: Path):
        self.issuer = issuer
        self.accounts_file = accounts_file
        self.accounts = json.loads(json.dumps(ACCOUNTS))

    def set_groups(self, name: str, groups: list[str]) -> None:
        """Change someone's groups at the provider (read again at each login)."""
        self.accounts[name]["groups"] = groups
        self.write()

    def write(self) -> None:
        tmp = self.accounts_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.accounts))
        os.replace(tmp, self.accounts_file)  # the provider never reads half a file


@pytest.fixture(scope="module")
def oidc_env(tmp_path_factory):
    """The hub's home and environment (its URL is the provider's redirect URI)."""
    from conftest import free_port, hub_env

    home = tmp_path_factory.mktemp("gpulab-oidc-home")
    issuer = f"http://127.0.0.1:{free_port()}"
    env = hub_env(
        home,
        GPULAB_AUTHENTICATOR="oidc",
        GPULAB_OIDC_ISSUER=issuer,
        GPULAB_OIDC_CLIENT_ID="gpulab",
        GPULAB_OIDC_CLIENT_SECRET=secrets.token_urlsafe(24),
        GPULAB_OIDC_SCOPES="openid,profile,email,groups",
        GPULAB_ALLOWED_GROUPS=",".join(ALLOWED),
        GPULAB_ADMIN="carol",
    )
    return home, env


@pytest.fixture(scope="module")
def provider(request, oidc_env, tmp_path_factory):
    """A running oidc-provider; stopped at the end (its output printed if a test failed)."""
    if PROVIDER_MISSING:
        pytest.skip("npm's oidc-provider is not installed (scripts/setup.sh test)")
    _, env = oidc_env
    root = tmp_path_factory.mktemp("oidc-provider")
    issuer = env["GPULAB_OIDC_ISSUER"]
    p = Provider(issuer, root / "accounts.json")
    p.write()
    out = (root / "provider.log").open("w+")
    proc = subprocess.Popen(
        ["node", str(PROVIDER), str(urlsplit(issuer).port), str(p.accounts_file)],
        env={
            **os.environ,
            "GPULAB_NODE_MODULES": str(NODE_MODULES),
            "OIDC_CLIENT_ID": env["GPULAB_OIDC_CLIENT_ID"],
            "OIDC_CLIENT_SECRET": env["GPULAB_OIDC_CLIENT_SECRET"],
            "OIDC_REDIRECT_URI": env["GPULAB_BIND_URL"] + "/hub/oauth_callback",
        },
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    failed_before = request.session.testsfailed
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(issuer + "/.well-known/openid-configuration", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out.seek(0)
            raise RuntimeError(f"oidc-provider did not start:\n{out.read()[-3000:]}")
        time.sleep(0.2)
    yield p
    proc.terminate()
    proc.wait(timeout=10)
    if request.session.testsfailed > failed_before:
        out.seek(0)
        print(f"\n----- oidc-provider output -----\n{out.read()[-4000:]}")
    out.close()


@pytest.fixture(scope="module")
def oidc_hub(docker_engine, oidc_env, provider):
    from conftest import GPULAB, start_hub

    home, env = oidc_env
    hub = start_hub(home, env)
    yield hub
    down = subprocess.run([GPULAB, "down"], env=env, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr


# A request as the hub reads it behind gpulab's Caddy (or the admin's TLS proxy): the
# proxy says X-Forwarded-Proto https, the JupyterHub proxy adds its own http after it,
# and tornado keeps the last one.
BEHIND_TLS_PROXY = SimpleNamespace(
    request=SimpleNamespace(protocol="http", host="gpulab.lab.example.org"),
    hub=SimpleNamespace(server=SimpleNamespace(base_url="/hub/")),
)
LIBRARY = {
    "oidc": "oauthenticator.generic.GenericOAuthenticator",
    "github": "oauthenticator.github.GitHubOAuthenticator",
}


@pytest.mark.parametrize("authenticator", ["oidc", "github"])
@pytest.mark.parametrize(
    ("site", "redirect_uri"),
    [
        ({"GPULAB_PUBLIC_URL": PUBLIC}, PUBLIC + "/hub/oauth_callback"),
        ({"GPULAB_SUBDOMAIN_HOST": PUBLIC + "/"}, PUBLIC + "/hub/oauth_callback"),
        # reached directly (no TLS proxy): the address the browser used
        ({}, "http://gpulab.lab.example.org/hub/oauth_callback"),
    ],
)
def test_behind_https_the_provider_gets_the_hubs_https_redirect_uri(
    authenticator, site, redirect_uri
):
    # an http:// redirect URI is refused by a provider that registered the https one
    from traitlets import import_item
    from traitlets.config import Config

    from gpulab_hub import hubconfig

    env = {
        "GPULAB_HOME": "/nonexistent",
        "GPULAB_HUB_IP": "127.0.0.1",
        "GPULAB_AUTHENTICATOR": authenticator,
        "GPULAB_OIDC_ISSUER": "https://sso.lab.example.org/realms/lab",
        "GPULAB_OIDC_CLIENT_ID": "gpulab",
        "GPULAB_GITHUB_CLIENT_ID": "gpulab",
        **site,
    }
    c = Config()
    hubconfig.apply(c, env, images_dir="/nonexistent")
    hubconfig.finish(c)
    a = import_item(LIBRARY[authenticator])(config=c)
    assert a.get_callback_url(BEHIND_TLS_PROXY) == redirect_uri


def _form(page: requests.Response) -> str:
    """The URL the provider's sign-in form posts to."""
    m = re.search(r'<form method="post" action="([^"]+)"', page.text)
    assert m, (page.status_code, page.url, page.text[:2000])
    return urljoin(page.url, unescape(m.group(1)))


def login_button(page: requests.Response) -> str:
    """Where the hub's login page's "Sign in with ..." button leads."""
    button = re.search(r"""href=["']([^"']*/oauth_login[^"']*)["']""", page.text)
    assert button, page.text[-2000:]
    return urljoin(page.url, unescape(button.group(1)))


def login(hub, name: str, password: str):
    """What a person does in a browser: the hub's login page, its button, the provider's
    form. The page they end on, and the HubUser whose cookies are theirs."""
    from hubclient import HubUser

    user = HubUser(hub.url, name, password)
    page = user.http.get(hub.url + "/hub/login", timeout=10)
    assert page.status_code == 200, page.status_code
    # the hub's login page is a button to the organisation's sign-in, with no password
    # field and no sign-up link of its own
    assert "Sign in with your organisation's login" in words(page), words(page)
    assert 'type="password"' not in page.text and "/hub/signup" not in page.text
    form = user.http.get(login_button(page), timeout=10)
    assert form.url.startswith(hub_issuer(hub)), form.url
    assert "Lab sign-in" in form.text
    landed = user.http.post(_form(form), data={"username": name, "password": password}, timeout=30)
    return landed, user


def words(page: requests.Response) -> str:
    """What a person reads on the page: its text without tags, entities or extra spaces.
    Read as UTF-8, as a browser does from the page's <meta charset> (JupyterHub's error
    pages send no charset in their Content-Type)."""
    text = page.content.decode("utf-8", "replace")
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", text)))


def signed_in(hub, user) -> bool:
    """Whether the person's browser is signed in to the hub: the home page opens, or
    sends them to the login page."""
    home = user.http.get(hub.url + "/hub/home", allow_redirects=False, timeout=10)
    assert home.status_code in (200, 302), home.status_code
    return home.status_code == 200 and "Your projects" in home.text


def hub_issuer(hub) -> str:
    return hub.env["GPULAB_OIDC_ISSUER"]


def groups_seen_by_admin(hub, name: str) -> list[str]:
    landed, carol = login(hub, "carol", ACCOUNTS["carol"]["password"])
    assert landed.status_code == 200, (landed.status_code, landed.url, hub.log[-3000:])
    carol.new_token()
    model = carol.api("GET", f"/hub/api/users/{name}")
    assert model.ok, model.text
    return model.json()["groups"]


def test_alice_logs_in_at_the_provider_and_lands_on_gpulabs_home_page(oidc_hub):
    landed, alice = login(oidc_hub, "alice", ACCOUNTS["alice"]["password"])
    assert landed.status_code == 200, (landed.status_code, landed.url, oidc_hub.log[-3000:])
    assert urlsplit(landed.url).path == "/hub/home", landed.url
    # gpulab's home page, in the words a person reads, not JupyterHub's own
    assert "Create and start" in landed.text and "Your projects" in landed.text
    # no sign-up or approval pages: the provider decides who has an account
    assert "Sign-ups waiting" not in landed.text
    assert alice.http.get(oidc_hub.url + "/hub/signup", timeout=10).status_code == 404
    assert signed_in(oidc_hub, alice)

    # a project made from the home page's form (its REST call) is listed there
    alice.new_token()
    alice.make_project("oidc-demo", "OIDC demo")

    # her provider group is her JupyterHub group (what sharing and GPU budgets read)
    me = alice.api("GET", "/hub/api/user").json()
    assert me["name"] == "alice" and me["groups"] == ["gpu-team"], me
    assert me["admin"] is False
    assert groups_seen_by_admin(oidc_hub, "alice") == ["gpu-team"]


def test_her_groups_follow_the_provider_at_each_login(oidc_hub, provider):
    try:
        provider.set_groups("alice", ["vision", "gpu-team"])
        landed, alice = login(oidc_hub, "alice", ACCOUNTS["alice"]["password"])
        assert landed.status_code == 200 and urlsplit(landed.url).path == "/hub/home"
        assert groups_seen_by_admin(oidc_hub, "alice") == ["gpu-team", "vision"]

        provider.set_groups("alice", ["vision"])
        landed, alice = login(oidc_hub, "alice", ACCOUNTS["alice"]["password"])
        assert landed.status_code == 200
        assert groups_seen_by_admin(oidc_hub, "alice") == ["vision"]

        # out of every allowed group at the provider: refused at her next login
        provider.set_groups("alice", ["other"])
        landed, alice = login(oidc_hub, "alice", ACCOUNTS["alice"]["password"])
        assert landed.status_code == 403, (landed.status_code, landed.url)
        assert not signed_in(oidc_hub, alice)
    finally:
        provider.set_groups("alice", ACCOUNTS["alice"]["groups"])


def test_someone_in_no_allowed_group_is_refused_with_a_page_that_says_so(oidc_hub):
    # bob's password is right at the provider, but his group is not GPULAB_ALLOWED_GROUPS
    landed, bob = login(oidc_hub, "bob", ACCOUNTS["bob"]["password"])
    assert landed.status_code == 403, (landed.status_code, landed.url)
    assert landed.url.startswith(oidc_hub.url + "/hub/oauth_callback"), landed.url
    text = words(landed)
    assert "this gpulab does not let your account in" in text, text[:2000]
    assert "You must be in one of these groups: /staff/gpu-team, gpu-team, vision." in text
    # no session at the hub, and no JupyterHub user made for him
    assert not signed_in(oidc_hub, bob)
    landed, carol = login(oidc_hub, "carol", ACCOUNTS["carol"]["password"])
    carol.new_token()
    assert carol.api("GET", "/hub/api/users/bob").status_code == 404


def test_a_wrong_password_stays_at_the_provider(oidc_hub):
    landed, alice = login(oidc_hub, "alice", "not her password")
    assert landed.status_code == 401, (landed.status_code, landed.url)
    assert landed.url.startswith(hub_issuer(oidc_hub) + "/interaction/"), landed.url
    assert "Wrong username or password." in landed.text
    assert "Lab sign-in" in landed.text  # the provider's form again, to try once more
    assert not signed_in(oidc_hub, alice)


def test_logging_out_of_gpulab_leaves_her_signed_in_at_the_provider(oidc_hub):
    # what docs/authentication.md tells admins: the provider's own session stays, so the
    # login button lets her in again without asking her password
    landed, alice = login(oidc_hub, "alice", ACCOUNTS["alice"]["password"])
    assert landed.status_code == 200 and signed_in(oidc_hub, alice)
    alice.http.get(oidc_hub.url + "/hub/logout", timeout=10)
    assert not signed_in(oidc_hub, alice)
    page = alice.http.get(oidc_hub.url + "/hub/login", timeout=10)
    again = alice.http.get(login_button(page), timeout=30)
    assert urlsplit(again.url).path == "/hub/home", again.url  # no password asked
    assert signed_in(oidc_hub, alice)


def test_sharing_ssh_keys_secrets_and_deletion_work_for_provider_logins(oidc_hub, tmp_path):
    """gpulab's own pages do not lean on the authenticator: people who log in at the
    provider share a project, add an SSH key and a secret, and the admin deletes one."""
    from test_ssh_keys import keygen

    _, alice = login(oidc_hub, "alice", ACCOUNTS["alice"]["password"])
    _, carol = login(oidc_hub, "carol", ACCOUNTS["carol"]["password"])
    for person in (alice, carol):
        assert signed_in(oidc_hub, person)
        person.new_token()
    alice.make_project("oidc-shared", "Shared at the provider")

    def post(user, path: str, **form) -> requests.Response:
        xsrf = user.http.cookies.get("_xsrf", path="/hub/")
        return user.http.post(f"{oidc_hub.url}{path}", data={"_xsrf": xsrf, **form}, timeout=30)

    # sharing by name (gpulab's share page), read back as the one shared with
    r = post(alice, "/hub/gpulab/share/oidc-shared", action="user", name="carol", role="viewer")
    assert r.status_code == 200 and "Shared with user carol as viewer." in r.text, r.text[-2000:]
    shared = carol.api("GET", "/hub/api/users/carol/shared").json()["items"]
    assert [(s["server"]["user"]["name"], s["server"]["name"]) for s in shared] == [
        ("alice", "oidc-shared")
    ]
    # an SSH key (gpulab's SSH page)
    pub = keygen(tmp_path, "alice-laptop").with_suffix(".pub").read_text().strip()
    r = post(alice, "/hub/gpulab/ssh", action="add", key=pub)
    assert r.status_code == 200 and "Added your ssh-ed25519 key (alice-laptop@laptop)" in r.text
    # a secret (gpulab's secrets page), stored encrypted
    r = post(alice, "/hub/gpulab/secrets", action="add", name="LAB_API_KEY", value="k" * 32)
    assert r.status_code == 200 and "Added LAB_API_KEY." in r.text, r.text[-2000:]

    keys = alice.http.get(f"{oidc_hub.url}/hub/gpulab/ssh", timeout=20).text
    assert "alice-laptop@laptop" in keys
    assert "LAB_API_KEY" in alice.http.get(f"{oidc_hub.url}/hub/gpulab/secrets", timeout=20).text

    # the admin (carol) deletes alice: her projects, shares, key and secret go with her
    r = carol.api("DELETE", "/hub/api/users/alice", params={"confirm": "alice"})
    assert r.status_code == 204, r.text
    assert carol.api("GET", "/hub/api/users/alice").status_code == 404
    assert carol.api("GET", "/hub/api/users/carol/shared").json()["items"] == []
    # she can log in at the provider again: a new account with nothing of the old one
    _, again = login(oidc_hub, "alice", ACCOUNTS["alice"]["password"])
    again.new_token()
    assert again.api("GET", "/hub/api/users/alice").json()["servers"] == {}
    assert "alice-laptop@laptop" not in again.http.get(f"{oidc_hub.url}/hub/gpulab/ssh").text
    assert "LAB_API_KEY" not in again.http.get(f"{oidc_hub.url}/hub/gpulab/secrets").text


# --- one provider account, one gpulab account ------------------------------------------


def is_admin(hub, user) -> bool:
    """Whether the person's browser session is gpulab's admin: JupyterHub's Admin page."""
    page = user.http.get(hub.url + "/hub/admin", allow_redirects=False, timeout=10)
    return page.status_code == 200


def test_a_provider_account_named_Carol_never_becomes_carol_the_admin(oidc_hub):
    # another person at the provider, "Carol": own sub, own password, in no allowed group.
    # Before, JupyterHub lower-cased her name and let the admin's name in whatever its
    # groups: she was signed in as carol, admin=True, the admin page 200.
    landed, mallory = login(oidc_hub, "Carol", ACCOUNTS["Carol"]["password"])
    assert landed.status_code == 403, (landed.status_code, landed.url)
    text = words(landed)
    assert "as 'Carol', but gpulab takes a user name only as it is written in lower case" in (
        text
    ), text[:2000]
    assert "Ask a gpulab admin" in text
    assert not signed_in(oidc_hub, mallory) and not is_admin(oidc_hub, mallory)
    # carol herself still signs in, and is the admin
    landed, carol = login(oidc_hub, "carol", ACCOUNTS["carol"]["password"])
    assert landed.status_code == 200 and is_admin(oidc_hub, carol)


def test_another_account_calling_itself_carol_cannot_take_her_account(oidc_hub):
    # carol signs in (her first login bound the account to her sub), then another account
    # of the provider whose preferred_username is "carol" too, in an allowed group
    landed, carol = login(oidc_hub, "carol", ACCOUNTS["carol"]["password"])
    assert landed.status_code == 200
    landed, twin = login(oidc_hub, "carol.twin", ACCOUNTS["carol.twin"]["password"])
    assert landed.status_code == 403, (landed.status_code, landed.url)
    text = words(landed)
    assert (
        "Another account of your organisation's login already signed in to gpulab as 'carol'"
    ) in text, text[:2000]
    assert not signed_in(oidc_hub, twin) and not is_admin(oidc_hub, twin)
    # the real carol still signs in and is the admin, her account unchanged
    landed, carol = login(oidc_hub, "carol", ACCOUNTS["carol"]["password"])
    assert landed.status_code == 200 and is_admin(oidc_hub, carol)
    carol.new_token()
    me = carol.api("GET", "/hub/api/user").json()
    assert me["name"] == "carol" and me["admin"] is True and me["groups"] == ["vision"], me


def test_a_kelvin_sign_karen_cannot_sign_in_to_karens_account(oidc_hub):
    landed, karen = login(oidc_hub, "karen", ACCOUNTS["karen"]["password"])
    assert landed.status_code == 200
    karen.new_token()
    karen.make_project("karens-notes", "Notes of karen")
    # before: "\u212aaren".lower() == "karen", and this browser was in karen's account
    landed, other = login(oidc_hub, KELVIN, ACCOUNTS[KELVIN]["password"])
    assert landed.status_code == 403, (landed.status_code, landed.url)
    assert f"as '{KELVIN}', but gpulab takes a user name only as" in words(landed)
    assert not signed_in(oidc_hub, other)
    assert other.http.get(oidc_hub.url + "/hub/api/user", timeout=10).status_code == 403
    # karen's account is hers alone, her project in it
    assert karen.api("GET", "/hub/api/user").json()["name"] == "karen"
    assert "Notes of karen" in karen.http.get(oidc_hub.url + "/hub/home", timeout=10).text


def test_the_admin_must_be_in_an_allowed_group_too(oidc_hub, provider):
    # before: the admin's name was let in whatever its groups
    try:
        provider.set_groups("carol", [])
        landed, carol = login(oidc_hub, "carol", ACCOUNTS["carol"]["password"])
        assert landed.status_code == 403, (landed.status_code, landed.url)
        assert "You must be in one of these groups" in words(landed)
        assert not signed_in(oidc_hub, carol) and not is_admin(oidc_hub, carol)
    finally:
        provider.set_groups("carol", ACCOUNTS["carol"]["groups"])


def test_keycloak_full_group_paths_stay_two_groups(oidc_hub):
    # /staff/gpu-team may log in; /students/gpu-team, another group of the same last
    # name, may not (with "Full group path" off, both were "gpu-team": one group, its
    # shares, budgets and data folder)
    landed, dana = login(oidc_hub, "dana", ACCOUNTS["dana"]["password"])
    assert landed.status_code == 200, (landed.status_code, landed.url)
    dana.new_token()
    assert dana.api("GET", "/hub/api/user").json()["groups"] == ["/staff/gpu-team"]
    landed, erin = login(oidc_hub, "erin", ACCOUNTS["erin"]["password"])
    assert landed.status_code == 403 and not signed_in(oidc_hub, erin)
    # the group by its path, as GPU budgets read it ("group:/staff/gpu-team")
    _, carol = login(oidc_hub, "carol", ACCOUNTS["carol"]["password"])
    carol.new_token()
    group = carol.api("GET", "/hub/api/groups/" + quote("/staff/gpu-team", safe=""))
    assert group.status_code == 200 and group.json()["users"] == ["dana"], group.text

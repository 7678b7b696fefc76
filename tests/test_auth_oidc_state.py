"""OAuth login CSRF (issue 32): with users' projects on https subdomains, the OAuth
state cookie is a ``__Host-`` cookie, so a page on a user's subdomain cannot plant its
author's state and send a visitor to the hub's callback with her own provider code.

gpulab's hub in-process (tests/fast/pagehub.py: its real configuration, with
``GPULAB_AUTHENTICATOR=oidc`` and an https ``GPULAB_SUBDOMAIN_HOST``, so the login
cookies are host-only) against the real OpenID Connect provider of test_auth_oidc.py
(npm's ``oidc-provider``), with oauthenticator's own login and callback handlers as the
hub serves them. The browser's part is played by hand: each request carries the cookies
a browser would send. Plain-http logins (the prefix off) are test_auth_oidc.py's.
"""

from __future__ import annotations

import asyncio
import secrets
from http.cookies import SimpleCookie
from urllib.parse import urljoin, urlsplit

import pytest
import pytest_asyncio
import requests
from conftest import free_port
from fast.pagehub import page_hub
from jupyterhub import orm
from test_auth_oidc import _form, provider  # noqa: F401 (a fixture)
from tornado.httpclient import AsyncHTTPClient
from tornado.web import create_signed_value, decode_signed_value

from gpulab_hub.accounts import crosssite

PUBLIC = f"https://lab.localhost:{free_port()}"  # the hub's name; never connected to
CALLBACK = PUBLIC + "/hub/oauth_callback"
pytestmark = pytest.mark.asyncio(loop_scope="module")
MALLORY, VICTIM = "statemallory", "statevictim"
GROUP = "gpu-team"  # both are in it at the provider, and gpulab lets it in
PEOPLE = {
    MALLORY: {"password": "mallory's provider password", "groups": [GROUP]},
    VICTIM: {"password": "the victim's provider password", "groups": [GROUP]},
}


@pytest.fixture(scope="module")
def oidc_env(tmp_path_factory):
    """What test_auth_oidc's ``provider`` reads: the client, and the redirect URI it
    registers (``GPULAB_BIND_URL`` + /hub/oauth_callback: the hub's public https one)."""
    home = tmp_path_factory.mktemp("gpulab-oidc-state")
    env = {
        "GPULAB_BIND_URL": PUBLIC,
        "GPULAB_OIDC_ISSUER": f"http://127.0.0.1:{free_port()}",
        "GPULAB_OIDC_CLIENT_ID": "gpulab",
        "GPULAB_OIDC_CLIENT_SECRET": secrets.token_urlsafe(24),
    }
    return home, env


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def state_hub(oidc_env, provider, tmp_path_factory):  # noqa: F811 (the fixture)
    """One in-process hub for the module (each test signs in people of its own)."""
    _, env = oidc_env
    provider.accounts.update(PEOPLE)
    provider.write()
    hub = await page_hub(
        tmp_path_factory.mktemp("gpulab-state-hub"),
        GPULAB_AUTHENTICATOR="oidc",
        GPULAB_SUBDOMAIN_HOST=PUBLIC,
        GPULAB_OIDC_ISSUER=env["GPULAB_OIDC_ISSUER"],
        GPULAB_OIDC_CLIENT_ID=env["GPULAB_OIDC_CLIENT_ID"],
        GPULAB_OIDC_CLIENT_SECRET=env["GPULAB_OIDC_CLIENT_SECRET"],
        GPULAB_OIDC_SCOPES="openid,profile,email,groups",
        GPULAB_ALLOWED_GROUPS=GROUP,
    )
    assert hub.app.cookie_host_prefix_enabled  # https subdomains: host-only login cookies
    yield hub
    await hub.stop()


async def ask(hub, path: str, cookies: dict[str, str] | None = None):
    """One request to the hub, as a browser sends it: its status, where it leads, and
    the cookies it sets (name -> morsel)."""
    headers = {"Host": urlsplit(PUBLIC).netloc}
    if cookies:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    r = await AsyncHTTPClient().fetch(
        hub.url + path,
        headers=headers,
        follow_redirects=False,
        raise_error=False,
        request_timeout=30,
    )
    set_cookies = {}
    for line in r.headers.get_list("Set-Cookie"):
        set_cookies.update(SimpleCookie(line))
    body = r.body.decode(errors="replace") if r.body else ""
    return r.code, r.headers.get("Location", ""), set_cookies, body


def at_the_provider(authorize_url: str, name: str) -> str:
    """Sign in at the provider as ``name``; the query of the hub's callback URL it sends
    the browser to (with the code and the state), not followed."""
    http = requests.Session()
    form = http.get(authorize_url, timeout=10)
    password = PEOPLE[name]["password"]
    r = http.post(_form(form), data={"username": name, "password": password},
                  allow_redirects=False, timeout=30)  # fmt: skip
    for _ in range(10):
        where = urljoin(r.url, r.headers.get("Location", ""))
        assert r.status_code in (302, 303), (r.status_code, r.url, r.text[:1000])
        if where.startswith(CALLBACK + "?"):
            return urlsplit(where).query
        r = http.get(where, allow_redirects=False, timeout=30)
    raise AssertionError(f"the provider never sent the browser back to the hub: {r.url}")


async def begin_login(hub, name: str):
    """The hub's login button, then the provider's form: the state cookie the hub set
    (name, value) and the callback's query."""
    code, location, cookies, _ = await ask(hub, "/hub/oauth_login")
    assert code == 302, code
    state = [m for n, m in cookies.items() if n.endswith(crosssite.STATE_COOKIE)]
    assert len(state) == 1, cookies
    query = await asyncio.to_thread(at_the_provider, location, name)
    return state[0], query


def signed_in_as(cookies) -> str:
    login = [n for n in cookies if n.endswith("jupyterhub-hub-login") and cookies[n].value]
    return login[0] if login else ""


async def test_a_planted_state_cookie_without_the_prefix_signs_nobody_in(state_hub):
    """The attack: Mallory begins a login, signs in at the provider, and keeps the hub's
    callback URL (her code and state) and the state cookie the hub gave her. Her page on
    ``mallory.<hub name>`` can set only cookies without the ``__Host-`` prefix for the
    hub's name: it plants her state there and sends the visitor to that URL."""
    hers, query = await begin_login(state_hub, MALLORY)
    # the cookie's value signed for the unprefixed name (what oauthenticator's own handler
    # gave her before; a value signed for the prefixed name is void under another name)
    secret = state_hub.app.tornado_settings["cookie_secret"]
    state = decode_signed_value(secret, hers.key, hers.value)
    assert state, hers
    planted = create_signed_value(secret, crosssite.STATE_COOKIE, state).decode()
    code, location, cookies, body = await ask(
        state_hub, f"/hub/oauth_callback?{query}", {crosssite.STATE_COOKIE: planted}
    )
    assert not signed_in_as(cookies), (code, location, cookies)
    assert code == 400 and "OAuth state missing from cookies" in body, (code, location)
    assert orm.User.find(state_hub.db, MALLORY) is None  # her code was never taken


async def test_the_provider_login_works_with_the_host_only_state_cookie(state_hub):
    state, query = await begin_login(state_hub, VICTIM)
    # a __Host- cookie: the hub's own host only (no Domain), Path=/, Secure
    assert state.key == crosssite.HOST_ONLY_STATE_COOKIE, state.key
    assert state["path"] == "/" and state["secure"] and not state["domain"], state.output()
    code, location, cookies, _ = await ask(
        state_hub, f"/hub/oauth_callback?{query}", {state.key: state.value}
    )
    assert code == 302 and location.endswith("/hub/home"), (code, location)
    login = signed_in_as(cookies)
    assert login == "__Host-jupyterhub-hub-login", cookies
    assert cookies[state.key].value == "", cookies  # the state cookie is spent
    status, _, _, body = await ask(state_hub, "/hub/api/user", {login: cookies[login].value})
    assert status == 200 and f'"name":"{VICTIM}"' in body.replace(" ", ""), (status, body)
    # logging out clears the host-only state cookie too
    _, _, cookies, _ = await ask(state_hub, "/hub/logout", {login: cookies[login].value})
    assert cookies[crosssite.HOST_ONLY_STATE_COOKIE].value == "", cookies

"""Origins are isolated (issue 13, item 2), on a hub started with subdomains.

``GPULAB_SUBDOMAIN_HOST=http://hub.localhost:<port>``: the hub answers at
hub.localhost, each user's servers at <user>.hub.localhost (Chromium resolves every
``*.localhost`` name to 127.0.0.1; this module makes Python do the same). Shown:
where JupyterHub serves each server, the hub pages' Content-Security-Policy, and, in
Chromium, a page from one user's project that tries to act on the hub with the hub
session of another user who opens it (read /hub/api/user, make an API token) and
fails.
"""

from __future__ import annotations

import json
from urllib.parse import urlparse

import pytest
import requests
from browser_kit import CHROMIUM, CHROMIUM_ARGS
from conftest import free_port, hub_env, start_hub
from people import log_in_admin, make_user, password, share_by_link
from playwright.sync_api import expect, sync_playwright

from gpulab_hub.sharing import origins

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
]

ATTACKER, VICTIM, PROJECT = "orevil", "orvictim", "site"
PAGE = "innocent.html"

# What the attacker's page does with the visitor's browser: each step's outcome.
ATTACK = """<!doctype html><html><head><title>loading</title></head><body>
<script>
const HUB = "HUB_URL";
const VICTIM = "VICTIM_NAME";
window.attack = async () => {
  const out = {origin: location.origin, cookies: ""};
  try { out.cookies = document.cookie; } catch (e) { out.cookies = "unreadable: " + e; }
  async function attempt(name, url, init) {
    try {
      const r = await fetch(url, Object.assign({credentials: "include"}, init));
      out[name] = r.type === "opaque" ? "opaque" : r.status + " " + (await r.text()).slice(0, 300);
    } catch (e) { out[name] = "blocked: " + e; }
  }
  await attempt("read_user", HUB + "/hub/api/user", {});
  await attempt("mint_token", HUB + "/hub/api/users/" + VICTIM + "/tokens", {
    method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({note: "stolen"})});
  await attempt("mint_token_simple", HUB + "/hub/api/users/" + VICTIM + "/tokens", {
    method: "POST", mode: "no-cors", body: JSON.stringify({note: "stolen"})});
  await attempt("read_home", HUB + "/hub/home", {});
  document.body.setAttribute("data-result", JSON.stringify(out));
  document.title = "done";
  return out;
};
window.attack();
</script></body></html>
"""


def html_of(sub_hub) -> str:
    return ATTACK.replace("HUB_URL", sub_hub.url).replace("VICTIM_NAME", VICTIM)


@pytest.fixture(scope="module")
def sub_hub(docker_engine, tmp_path_factory, localhost_names):
    """A second hub, with each user's servers on their own subdomain."""
    home = tmp_path_factory.mktemp("gpulab-subdomains")
    port = free_port()
    subdomain_host = f"http://hub.localhost:{port}"
    env = hub_env(
        home, GPULAB_BIND_URL=f"http://127.0.0.1:{port}", GPULAB_SUBDOMAIN_HOST=subdomain_host
    )
    hub = start_hub(home, env)
    hub.url = subdomain_host
    yield hub
    down = hub.gpulab("down")
    assert down.returncode == 0, down.stderr


@pytest.fixture(scope="module")
def people(sub_hub):
    admin = log_in_admin(sub_hub)
    return {"admin": admin, **{n: make_user(sub_hub, admin, n) for n in (ATTACKER, VICTIM)}}


@pytest.fixture(scope="module")
def planted(people, sub_hub):
    """The attacker's project, running, with an HTML page in it, shared with the victim."""
    evil = people[ATTACKER]
    server = evil.start_project(PROJECT)
    body = {"type": "file", "format": "text", "content": html_of(sub_hub)}
    # On its own host now: the hub's host would only redirect there.
    r = requests.put(
        f"{server['url']}api/contents/{PAGE}",
        headers={"Authorization": f"token {evil.token}"},
        json=body,
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    share_by_link(evil, PROJECT, people[VICTIM], "viewer")
    yield server
    evil.stop_project(PROJECT)


def test_each_users_servers_have_their_own_origin(people, planted, sub_hub):
    hub_host = urlparse(sub_hub.url).netloc
    url = urlparse(planted["url"])
    print(f"\nhub at {sub_hub.url}/hub/, {ATTACKER}'s project at {planted['url']}")
    assert url.netloc == f"{ATTACKER}.{hub_host}"
    assert url.path == f"/user/{ATTACKER}/{PROJECT}/"


@pytest.mark.parametrize("path", ["/hub/login", "/hub/home", "/hub/token", "/hub/nothing"])
def test_hub_pages_carry_a_strict_csp(people, sub_hub, path):
    victim = people[VICTIM]
    r = victim.http.get(sub_hub.url + path, timeout=30)
    csp = r.headers.get("Content-Security-Policy", "")
    assert csp == origins.hub_csp(sub_hub.url), (r.status_code, csp)
    for directive in ("default-src 'self'", "object-src 'none'", "frame-ancestors 'none'"):
        assert directive in csp


def test_a_page_from_one_users_server_cannot_use_anothers_hub_session(people, planted, sub_hub):
    admin, victim = people["admin"], people[VICTIM]
    before = admin.api("GET", f"/hub/api/users/{VICTIM}/tokens").json()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{sub_hub.url}/hub/login")
            page.get_by_label("Username").fill(VICTIM)
            page.get_by_label("Password").fill(password(VICTIM))
            page.get_by_role("button", name="Sign In").click()
            expect(page).to_have_url(f"{sub_hub.url}/hub/home")
            # The victim opens a file of a project shared with them.
            page.goto(f"{planted['url']}files/{PAGE}")
            if "/oauth2/authorize" in page.url:
                page.get_by_role("button", name="Authorize").click()
            expect(page).to_have_title("done", timeout=60_000)
            in_file = json.loads(page.locator("body").get_attribute("data-result"))
            # jupyter_server sandboxes /files/ (CSP sandbox); script on the server's
            # own origin (a notebook's HTML output, an extension in the owner's image)
            # is what subdomains keep from the hub: run the same attack from JupyterLab.
            page.goto(f"{planted['url']}lab")
            page.wait_for_load_state("domcontentloaded")
            script = html_of(sub_hub).split("<script>", 1)[1].split("window.attack();", 1)[0]
            on_origin = page.evaluate(f"async () => {{ {script}; return await window.attack(); }}")
        finally:
            browser.close()
    server_origin = f"http://{ATTACKER}.{urlparse(sub_hub.url).netloc}"
    for result in (in_file, on_origin):
        print(f"\nthe attack ran at {result['origin']}: {json.dumps(result, indent=1)}")
        assert result["origin"] == server_origin
        assert "jupyterhub-hub-login" not in result["cookies"]
        # Reading the victim's identity and the hub's pages: refused by the browser.
        assert result["read_user"].startswith("blocked"), result["read_user"]
        assert result["read_home"].startswith("blocked"), result["read_home"]
        assert result["mint_token"].startswith("blocked"), result["mint_token"]
    # The hub made no token for the victim (a no-cors POST reaches it and is refused).
    after = admin.api("GET", f"/hub/api/users/{VICTIM}/tokens").json()
    # (authorizing the attacker's server made one OAuth token, as any visit does)
    stolen = [t for t in after.get("api_tokens", []) if t.get("note") == "stolen"]
    assert not stolen, stolen
    made = {t["id"] for t in after.get("api_tokens", [])} - {
        t["id"] for t in before.get("api_tokens", [])
    }
    new = [t for t in after["api_tokens"] if t["id"] in made]
    assert all(t.get("oauth_client") for t in new), new
    assert victim.api("GET", "/hub/api/user").json()["name"] == VICTIM

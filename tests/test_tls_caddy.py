"""HTTPS by default: with GPULAB_PUBLIC_URL=https://<name>, `gpulab up` runs Debian's
Caddy in front of the hub (gpulab_hub/tls/), with its internal CA for names only this
machine or a LAN knows, and each user's servers on <user>.<name>. Real parts: Caddy on
``*.localhost`` names, Python's requests and Debian's Chromium trusting its CA."""

from __future__ import annotations

import base64
import json
import os
import time
from urllib.parse import urlsplit

import pytest
import requests
from browser_kit import CHROMIUM, CHROMIUM_ARGS
from conftest import free_port
from playwright.sync_api import expect, sync_playwright
from security.people import share_by_link
from tls_kit import TlsUser, ca_of, https_hub, nss_home
from traitlets.config import Config

from gpulab_hub import hubconfig, settings, tls
from gpulab_hub.settingvalues import SettingError
from gpulab_hub.tls import web

PROJECT = "tlsproj"


# --- the Caddyfile: which names, which CA ---------------------------------------------


@pytest.mark.parametrize(
    "url, host, port, internal",
    [
        ("https://lab.localhost:8443", "lab.localhost", 8443, True),
        ("https://localhost/", "localhost", 443, True),
        ("https://gpu.lan", "gpu.lan", 443, True),
        ("https://box.home.arpa", "box.home.arpa", 443, True),
        ("https://lab.corp.internal", "lab.corp.internal", 443, True),
        ("https://192.168.1.20:8443", "192.168.1.20", 8443, True),
        ("https://[fd7a:115c::1]", "fd7a:115c::1", 443, True),
        ("https://Lab.Example.org", "lab.example.org", 443, False),
    ],
)
def test_names_only_a_lan_knows_get_the_internal_ca(url, host, port, internal):
    assert tls.site_of(url) == tls.Site(host, port, internal)


@pytest.mark.parametrize(
    "url",
    [
        "http://lab.example.org",
        "https://lab.example.org/hub/",
        "https://user:pw@lab.example.org",
        "https://lab.example.org?x=1",
        "https://lab.example.org:99999",
        "https://lab_example.org",
        "https://lab.example.org\n}\nimport /etc/passwd",
        "https://lab.example.org {\n\trespond hi\n}",
        "https://*.example.org",
        "https://-lab.example.org",
    ],
)
def test_a_public_url_that_is_not_one_name_is_refused(url):
    with pytest.raises(SettingError, match="GPULAB_PUBLIC_URL must be https://<name>"):
        tls.site_of(url)


def rendered(public_url: str, bind_url: str = "http://127.0.0.1:8000") -> str:
    s = settings.parse({"GPULAB_PUBLIC_URL": public_url, "GPULAB_BIND_URL": bind_url})
    return tls.render(s)


def test_a_public_name_gets_acme_and_redirects_and_listens_for_everyone():
    text = rendered("https://lab.example.org")
    assert "https://lab.example.org:443, https://*.lab.example.org:443 {" in text
    assert "issuer internal" not in text and "disable_redirects" not in text
    assert "bind " not in text
    assert "reverse_proxy 127.0.0.1:8000" in text
    assert "skip_install_trust" in text


def test_a_localhost_name_gets_the_internal_ca_on_loopback_only():
    text = rendered("https://lab.localhost:8443", "http://0.0.0.0:9000")
    assert "https://lab.localhost:8443, https://*.lab.localhost:8443 {" in text
    assert "issuer internal" in text and "auto_https disable_redirects" in text
    assert "bind 127.0.0.1 [::1]" in text
    assert "reverse_proxy 127.0.0.1:9000" in text


def test_the_public_url_turns_on_caddy_and_subdomains():
    c = Config()
    s = hubconfig.apply(c, {"GPULAB_PUBLIC_URL": "https://lab.example.org/"}, images_dir="/x")
    assert c.JupyterHub.subdomain_host == "https://lab.example.org"
    assert urlsplit(c.JupyterHub.bind_url).hostname == "127.0.0.1"
    hubconfig.finish(c)
    names = [e["name"] for e in c.JupyterHub.services]
    assert tls.SERVICE in names
    assert tls.wanted(s)
    # the admin's own TLS proxy in front (GPULAB_SUBDOMAIN_HOST): no Caddy
    c = Config()
    hubconfig.apply(c, {"GPULAB_SUBDOMAIN_HOST": "https://lab.example.org"}, images_dir="/x")
    hubconfig.finish(c)
    assert tls.SERVICE not in [e["name"] for e in c.JupyterHub.services]
    assert c.JupyterHub.subdomain_host == "https://lab.example.org"


@pytest.mark.parametrize(
    "env, host_only",
    [
        ({"GPULAB_PUBLIC_URL": "https://lab.example.org"}, True),  # Caddy, subdomains
        ({"GPULAB_SUBDOMAIN_HOST": "https://lab.example.org"}, True),  # the admin's proxy
        ({"GPULAB_PUBLIC_URL": "https://192.168.1.20:8443"}, False),  # one origin
        ({"GPULAB_SUBDOMAIN_HOST": "http://hub.localhost:8000"}, False),  # no Secure
        ({}, False),  # make up: 127.0.0.1, one origin
    ],
)
def test_the_login_cookies_are_host_only_where_users_have_subdomains_over_https(env, host_only):
    """``__Host-`` cookies (JupyterHub's cookie_host_prefix_enabled): a page on
    <user>.<name> cannot set them for the hub (the Chromium test below)."""
    c = Config()
    hubconfig.apply(c, env, images_dir="/x")
    assert c.JupyterHub.cookie_host_prefix_enabled is host_only


# --- a hub behind Caddy, opened over HTTPS --------------------------------------------


@pytest.fixture(scope="module")
def tls_hub(docker_engine, tmp_path_factory, localhost_names):
    home = tmp_path_factory.mktemp("gpulab-tls")
    yield from https_hub(home, f"https://lab.localhost:{free_port()}")


@pytest.fixture(scope="module")
def admin(tls_hub):
    user = TlsUser(tls_hub.url, "admin", tls_hub.admin_password, ca_of(tls_hub))
    assert user.login().status_code == 302
    user.new_token()
    return user


def test_up_says_where_to_open_it_and_the_ca(tls_hub):
    assert f"gpulab is running: open {tls_hub.url}/" in tls_hub.up_output
    assert "This hub listens on" not in tls_hub.up_output
    ca_of(tls_hub)


def test_https_login_with_the_ca_and_not_without(tls_hub, admin):
    r = admin.http.get(tls_hub.url + "/hub/api/user", timeout=10)
    assert r.status_code == 200 and r.json()["name"] == "admin"
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(tls_hub.url + "/hub/login", timeout=10)
    # Caddy gets a certificate for an existing user's name only
    ask = f"{tls_hub.env['GPULAB_BIND_URL']}/hub{tls.ASK}"
    host = urlsplit(tls_hub.url).hostname
    for domain, status in [(host, 200), (f"admin.{host}", 200), (f"nobody.{host}", 404)]:
        r = requests.get(ask, params={"domain": domain}, timeout=10)
        assert r.status_code == status, (domain, r.status_code)
    with pytest.raises(requests.exceptions.SSLError):
        admin.http.get(tls_hub.url.replace("lab.", "nobody.lab.") + "/", timeout=10)
    # the hub itself is on loopback: only Caddy is in front
    assert urlsplit(tls_hub.env["GPULAB_BIND_URL"]).hostname == "127.0.0.1"


def test_chromium_trusting_the_ca_logs_in_and_opens_a_project_on_its_own_origin(
    tls_hub, admin, tmp_path
):
    server = admin.start_project(PROJECT)
    hub_origin = tls_hub.url
    user_origin = f"https://admin.{urlsplit(tls_hub.url).netloc}"
    assert server["url"].startswith(user_origin + "/user/admin/"), server["url"]
    env = {**os.environ, "HOME": nss_home(tmp_path / "trusting", ca_of(tls_hub))}
    with sync_playwright() as p:
        # a browser without the CA is stopped at the certificate
        bare = {**os.environ, "HOME": str(tmp_path / "bare")}
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=bare)
        page = browser.new_page()
        with pytest.raises(Exception, match="ERR_CERT_AUTHORITY_INVALID"):
            page.goto(hub_origin + "/hub/login")
        browser.close()

        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env)
        page = browser.new_page()
        page.goto(hub_origin + "/hub/login")
        page.fill("#username_input", "admin")
        page.fill("#password_input", tls_hub.admin_password)
        page.click("#login_submit")
        page.wait_for_url(hub_origin + "/hub/**")
        page.goto(server["url"] + "lab")
        expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
        assert page.url.startswith(user_origin + "/user/admin/" + PROJECT), page.url
        origin = page.evaluate("window.location.origin")
        assert origin == user_origin != hub_origin
        # the project's page cannot read the hub's API as the user (another origin)
        status = page.evaluate(
            """async (hub) => { try { const r = await fetch(hub + '/hub/api/user',
                 {credentials: 'include'}); return String(r.status) }
                 catch (e) { return 'blocked' } }""",
            hub_origin,
        )
        assert status == "blocked"
        browser.close()
    admin.stop_project(PROJECT)


def test_a_hub_reached_by_ip_gets_https_but_no_subdomains():
    """An IP address has no subdomains: HTTPS with the internal CA, and every project on
    the hub's origin (safe for one person; docs/deployment.md "Reached by IP")."""
    s = settings.parse({"GPULAB_PUBLIC_URL": "https://100.101.102.103:8443"})
    assert s.subdomain_host == ""
    assert tls.site_of(s.public_url).internal
    text = tls.render(s)
    # no subdomains, and a certificate made as Caddy starts: a browser sends no name
    # (SNI) for an address, so an on-demand certificate could never be asked for
    assert "\nhttps://100.101.102.103:8443 {" in text and "*.100" not in text
    assert "issuer internal" in text and "bind " not in text
    assert "\t\ton_demand" not in text


def test_caddy_asks_for_certificates_of_existing_users_only():
    users = {"alice"}
    ok = lambda d: web.allowed(d, "lab.example.org", users.__contains__)  # noqa: E731
    assert ok("lab.example.org") and ok("alice.lab.example.org")
    made_up = ["bob.lab.example.org", "a.alice.lab.example.org", ".lab.example.org"]
    made_up += ["alice.lab.example.org.evil.net", "evil.net", "alicelab.example.org"]
    for domain in made_up:
        assert not ok(domain), domain
    assert "ask http://127.0.0.1:8000/hub/gpulab/tls-ask" in rendered("https://lab.example.org")


# --- cookie tossing: a page on a user's origin cannot sign a visitor in as its author --

MALLORY, VICTIM, SITE, PORT_IN_PROJECT = "tossmallory", "tossvictim", "site", 8765
# Every hub cookie of the attacker's, under its own name and the name without JupyterHub's
# __Host- prefix, set three ways: for the hub's whole name (Domain=<hub name>) on the
# hub's paths and on /, and for the page's own host.
TOSS = """<!doctype html><html><head><title>loading</title></head><body><script>
const cookies = COOKIES, hub = "HUB_NAME", out = {origin: location.origin, tried: []};
for (const [name, value] of Object.entries(cookies)) {
  for (const n of new Set([name, name.replace(/^__Host-/, "")])) {
    for (const where of [`Domain=${hub}; Path=/hub/`, `Domain=${hub}; Path=/`, "Path=/"]) {
      document.cookie = `${n}=${value}; ${where}; Secure; SameSite=Lax`;
      out.tried.push(`${n}; ${where}`);
    }
  }
}
document.body.setAttribute("data-result", JSON.stringify(out));
document.title = "tossed";
</script></body></html>
"""


def tls_user(hub, admin: TlsUser, name: str) -> TlsUser:
    user = TlsUser(hub.url, name, f"{name}-Passw0rd-long", ca_of(hub))
    assert user.signup().status_code == 200
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def in_container(docker_engine, owner: str, project: str, command: str, detach=False) -> str:
    """``command`` in the project's container as its notebook user (her terminal)."""
    from conftest import PREFIX

    labels = [f"gpulab.instance={PREFIX}", f"gpulab.owner={owner}", f"gpulab.project={project}"]
    found = docker_engine.call("containers", filters={"label": labels})
    assert len(found) == 1, found
    run = docker_engine.call("exec_create", found[0]["Id"], ["sh", "-c", command], user="1000:100")
    out = docker_engine.call("exec_start", run["Id"], detach=detach)
    return "" if detach else out.decode(errors="replace")


def whoami(page, hub_url: str) -> str:
    r = page.goto(hub_url + "/hub/api/user")
    return r.json()["name"] if r.ok else f"{r.status} {r.text()[:200]}"


@pytest.fixture(scope="module")
def mallorys_site(tls_hub, admin, docker_engine):
    """Mallory and her victim, approved and signed in; Mallory's project running, where
    she plants pages (:func:`plant`). Stopped when the module ends."""
    mallory, victim = (tls_user(tls_hub, admin, n) for n in (MALLORY, VICTIM))
    server = mallory.start_project(SITE)
    yield mallory, victim, server
    mallory.stop_project(SITE)


def plant(docker_engine, name: str, html: str) -> None:
    """What Mallory can do in her own container (a Dockerfile RUN line does it as well):
    a page ``name`` in jupyter_server's static files (served without login) and in
    /tmp/www, for a web server on a port of hers."""
    script = (
        "import base64, jupyter_server, pathlib, sys; "
        "page = base64.b64decode(sys.argv[1]); "
        "static = pathlib.Path(jupyter_server.__file__).parent / 'static'; "
        "www = pathlib.Path('/tmp/www'); www.mkdir(exist_ok=True); "
        f"[(d / '{name}').write_bytes(page) for d in (static, www)]; print('planted')"
    )
    page64 = base64.b64encode(html.encode()).decode()
    planted = in_container(docker_engine, MALLORY, SITE, f'python -c "{script}" {page64}')
    assert planted.strip().endswith("planted"), planted


def test_a_page_on_a_users_origin_cannot_sign_a_visitor_in_as_its_author(
    tls_hub, mallorys_site, docker_engine, tmp_path
):
    """The attack of issue 32: Mallory's project serves a page (from her image's
    jupyter_server static/, which needs no login, and from a web server in her project
    through the port proxy) whose script plants her hub cookies in the visitor's browser
    for the hub's name. The victim, signed in, opens it, then saves a secret."""
    mallory, victim, server = mallorys_site
    mine = {c.name: c.value for c in mallory.http.cookies if c.name.startswith(("jupyterhub-",
            "__Host-jupyterhub-hub"))}  # fmt: skip
    assert any("hub-login" in n for n in mine), mine
    html = TOSS.replace("COOKIES", json.dumps(mine)).replace("HUB_NAME", "lab.localhost")
    plant(docker_engine, "toss.html", html)
    serve = f"cd /tmp/www && exec python -m http.server {PORT_IN_PROJECT}"
    in_container(docker_engine, MALLORY, SITE, serve, detach=True)
    share_by_link(mallory, SITE, victim, "collaborator")  # the port proxy needs execute
    pages = [
        f"{server['url']}static/toss.html",
        f"{server['url']}proxy/{PORT_IN_PROJECT}/toss.html",
    ]
    env = {**os.environ, "HOME": nss_home(tmp_path / "victim", ca_of(tls_hub))}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env)
        try:
            context = browser.new_context()
            page = context.new_page()
            page.set_default_timeout(60_000)
            after = {}
            for url in pages:
                context.clear_cookies()  # each page tried on a fresh login of the victim's
                page.goto(tls_hub.url + "/hub/login")
                page.fill("#username_input", VICTIM)
                page.fill("#password_input", victim.password)
                page.click("#login_submit")
                page.wait_for_url(tls_hub.url + "/hub/**")
                assert whoami(page, tls_hub.url) == VICTIM
                for _ in range(30):  # the proxied web server may take a moment
                    page.goto(url)
                    if page.title() == "tossed":
                        break
                    time.sleep(1)
                expect(page).to_have_title("tossed")
                result = json.loads(page.locator("body").get_attribute("data-result"))
                print(f"\nthe page at {url} ran at {result['origin']}: {result}")
                assert result["origin"] == f"https://{MALLORY}.{urlsplit(tls_hub.url).netloc}"
                after[url] = whoami(page, tls_hub.url)
            print(f"\nsigned in as, after each page: {after}")
            assert after == dict.fromkeys(pages, VICTIM)
            page.goto(tls_hub.url + "/hub/gpulab/secrets")
            page.fill("#secret-name", "TOSSED_KEY")
            page.fill("#secret-value", "the-victims-own-value")
            page.locator("#add-secret").get_by_role("button", name="Add").click()
            expect(page.locator("#secrets-list")).to_contain_text("TOSSED_KEY")
        finally:
            browser.close()
    theirs = victim.http.get(tls_hub.url + "/hub/gpulab/secrets", timeout=30).text
    hers = mallory.http.get(tls_hub.url + "/hub/gpulab/secrets", timeout=30).text
    assert "TOSSED_KEY" in theirs and "TOSSED_KEY" not in hers


# Mallory's own login form, posted by her page at once, after it planted her XSRF cookie
# and a session id for the hub's name: JupyterHub 6.1 binds a signed-out visitor's XSRF
# token to those two cookies and to the address and User-Agent, which she shares or copies.
LOGIN_CSRF = """<!doctype html><html><head><title>posting</title></head><body>
<form id="f" method="post" action="HUB_URL/hub/login"><input name="username" value="USER">
<input name="password" value="PASSWORD"><input name="_xsrf" value="XSRF"></form><script>
for (const [name, value] of Object.entries(COOKIES)) {
  document.cookie = `${name}=${value}; Domain=HUB_NAME; Path=/hub/; Secure; SameSite=Lax`;
}
document.getElementById("f").submit();
</script></body></html>
"""
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/1.0"


def test_a_page_on_a_users_origin_cannot_post_its_authors_login_form(
    tls_hub, mallorys_site, docker_engine, tmp_path
):
    """Login CSRF (issue 32): a signed-out visitor opens Mallory's page, which plants
    her ``_xsrf`` and ``jupyterhub-session-id`` for the hub's name and posts the hub's
    login form with her name and password. The hub refuses the form (Chromium says
    ``Sec-Fetch-Site: same-site``) and the visitor is signed in as nobody."""
    from gpulab_hub.accounts import crosssite

    mallory, _, server = mallorys_site
    # her own login page, asked as the victim's browser would (same address, same
    # User-Agent): the XSRF cookie and token of a session id she chose
    session = base64.b16encode(os.urandom(16)).decode().lower()
    asked = requests.get(tls_hub.url + "/hub/login", verify=ca_of(tls_hub), timeout=30,
                         headers={"User-Agent": BROWSER},
                         cookies={"jupyterhub-session-id": session})  # fmt: skip
    xsrf = asked.cookies.get("_xsrf")
    assert xsrf and f'value="{xsrf}"' in asked.text, asked.text[-2000:]
    cookies = {"_xsrf": xsrf, "jupyterhub-session-id": session}
    html = LOGIN_CSRF.replace("HUB_URL", tls_hub.url).replace("HUB_NAME", "lab.localhost")
    html = html.replace("USER", MALLORY).replace("PASSWORD", mallory.password)
    html = html.replace("XSRF", xsrf).replace("COOKIES", json.dumps(cookies))
    plant(docker_engine, "login.html", html)
    env = {**os.environ, "HOME": nss_home(tmp_path / "visitor", ca_of(tls_hub))}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env)
        try:
            page = browser.new_context(user_agent=BROWSER).new_page()
            page.set_default_timeout(60_000)
            login = tls_hub.url + "/hub/login"
            with page.expect_response(lambda r: r.url.startswith(login)) as posted:
                page.goto(f"{server['url']}static/login.html")
            answer = posted.value
            sent = answer.request.all_headers()
            page.wait_for_load_state()
            words = " ".join(page.locator("body").inner_text().split())
            signed_in_as = whoami(page, tls_hub.url)
            print(f"\nthe form's POST: {answer.status}; now signed in as: {signed_in_as}")
            assert answer.request.method == "POST" and sent["sec-fetch-site"] == "same-site"
            assert signed_in_as != MALLORY
            assert answer.status == 403 and crosssite.REFUSED in words, (answer.status, words)
        finally:
            browser.close()

"""HTTPS by default: with GPULAB_PUBLIC_URL=https://<name>, `gpulab up` runs Debian's
Caddy in front of the hub (gpulab_hub/tls/), with its internal CA for names only this
machine or a LAN knows, and each user's servers on <user>.<name>. Real parts: Caddy on
``*.localhost`` names, Python's requests and Debian's Chromium trusting its CA."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest
import requests
from browser_kit import CHROMIUM, CHROMIUM_ARGS
from conftest import free_port
from playwright.sync_api import expect, sync_playwright
from tls_kit import TlsUser, ca_of, https_hub, nss_home
from traitlets.config import Config

from gpulab_hub import hubconfig, settings, tls
from gpulab_hub.settings import SettingError
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

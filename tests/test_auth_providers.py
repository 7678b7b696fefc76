"""Any authenticator: gpulab's routes come first whichever logs people in, the pages of
gpulab's own accounts only with them, and each provider's settings make the traits the
library reads (GPULAB_AUTHENTICATOR, accounts/providers.py). No hub, no network beyond
127.0.0.1."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from traitlets.config import Config

from gpulab_hub import hubconfig
from gpulab_hub.accounts import auth, providers
from gpulab_hub.settingvalues import SettingError

BASE = {"GPULAB_HOME": "/nonexistent", "GPULAB_HUB_IP": "127.0.0.1"}


def configured(**env) -> Config:
    c = Config()
    hubconfig.apply(c, {**BASE, **env}, images_dir="/nonexistent")
    return c


def routes(c: Config) -> dict[str, str]:
    """The hub's routes as JupyterHub builds them: pattern -> handler (first wins)."""
    from jupyterhub.app import JupyterHub
    from tornado.util import import_object

    hubconfig.finish(c)
    app = JupyterHub(config=c)
    app.log.setLevel(logging.ERROR)
    cls = app.authenticator_class
    app.authenticator = cls(parent=app) if "Dummy" in cls.__name__ else cls.__new__(cls)
    if not hasattr(app.authenticator, "_trait_values"):
        app.authenticator._trait_values = {}
    app.authenticator.config = c
    app.init_handlers()
    found: dict[str, str] = {}
    for rule in app.handlers:
        pattern, target = rule[0], rule[1]
        handler = import_object(target) if isinstance(target, str) else target
        found.setdefault(pattern.removeprefix("/hub"), f"{handler.__module__}.{handler.__name__}")
    return found


def test_local_accounts_stay_the_default():
    c = configured()
    assert c.JupyterHub.authenticator_class == "gpulab_hub.accounts.auth.GpulabAuthenticator"
    assert c.Authenticator.allow_all is True
    assert "manage_groups" not in c.Authenticator  # admins keep groups by hand
    found = routes(c)
    assert found["/home"] == "gpulab_hub.home.web.HomeHandler"
    assert found["/signup"] == "gpulab_hub.accounts.auth.SignUpHandler"
    assert found["/authorize"] == "gpulab_hub.accounts.AuthorizationAreaHandler"


@pytest.mark.parametrize("kind", ["ldap", "oidc", "github"])
def test_every_authenticator_keeps_gpulabs_home_page_and_no_signup(kind, oidc_discovery):
    env = {"GPULAB_AUTHENTICATOR": kind, "GPULAB_OIDC_ISSUER": oidc_discovery}
    c = configured(**env)
    cls = auth.__getattr__(providers.CLASSES[kind].rsplit(".", 1)[1])
    assert issubclass(cls, auth.GpulabHub)
    found = routes(c)
    # gpulab's page, not JupyterHub's own home page
    assert found["/home"] == "gpulab_hub.home.web.HomeHandler"
    assert found["/spawn/([^/]+)/([^/]+)"] == "gpulab_hub.home.spawn.SpawnPageHandler"
    # NativeAuthenticator's pages only with gpulab's own accounts
    assert "/signup" not in found and "/authorize" not in found
    # the provider's groups become JupyterHub groups
    assert c.Authenticator.manage_groups is True


def test_an_authenticator_the_admin_names_gets_gpulabs_pages():
    c = configured()
    # what a line in jupyterhub_config.d does
    c.JupyterHub.authenticator_class = "dummy"
    found = routes(c)
    assert found["/home"] == "gpulab_hub.home.web.HomeHandler"
    assert c.JupyterHub.authenticator_class.__name__ == "GpulabDummyAuthenticator"


def test_the_hub_imports_no_login_library_it_does_not_use():
    code = (
        "import sys, gpulab_hub.accounts.auth, gpulab_hub.hubconfig;"
        "print(sorted(m for m in ('ldapauthenticator', 'ldap3', 'oauthenticator')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ldap_settings_make_the_ldapauthenticator_traits():
    groups = "cn=gpu-team,ou=groups,dc=lab,dc=org; cn=vision,ou=groups,dc=lab,dc=org"
    c = configured(
        GPULAB_AUTHENTICATOR="ldap",
        GPULAB_LDAP_SERVER="ldap.lab.org",
        GPULAB_LDAP_BIND_DN_TEMPLATE="uid={username},ou=people,dc=lab,dc=org",
        GPULAB_LDAP_GROUPS=groups,
        GPULAB_ADMIN="alice",
    )
    ldap = c.LDAPAuthenticator
    assert c.JupyterHub.authenticator_class == providers.CLASSES["ldap"]
    assert (ldap.server_address, ldap.server_port, ldap.tls_strategy) == (
        "ldap.lab.org",
        636,
        "on_connect",
    )
    assert ldap.bind_dn_template == ["uid={username},ou=people,dc=lab,dc=org"]
    assert ldap.allowed_groups == [
        "cn=gpu-team,ou=groups,dc=lab,dc=org",
        "cn=vision,ou=groups,dc=lab,dc=org",
    ]
    assert c.Authenticator.admin_users == {"alice"}
    assert "allow_all" not in ldap  # only the groups' members


def test_oidc_settings_make_the_generic_oauthenticator_traits(oidc_discovery):
    c = configured(
        GPULAB_AUTHENTICATOR="oidc",
        GPULAB_OIDC_ISSUER=oidc_discovery,
        GPULAB_OIDC_CLIENT_ID="gpulab",
        GPULAB_OIDC_CLIENT_SECRET="s3cret",
        GPULAB_OIDC_GROUPS_CLAIM="roles",
        GPULAB_ALLOWED_GROUPS="gpu-team, vision",
    )
    # what the hub makes of it as it starts: the endpoints from the discovery document
    g = auth.GpulabGenericOAuthenticator(config=c)
    assert g.authorize_url == oidc_discovery + "/authorize"
    assert g.token_url == oidc_discovery + "/token"
    assert g.userdata_url == oidc_discovery + "/me"
    assert (g.client_id, g.client_secret) == ("gpulab", "s3cret")
    assert g.auth_state_groups_key == "oauth_user.roles"
    assert g.scope == ["openid", "profile", "email"]
    assert g.manage_groups is True
    assert g.allowed_groups == {"gpu-team", "vision"}
    # and the groups claim of a login becomes the user's JupyterHub groups
    import asyncio

    groups = asyncio.run(g.get_user_groups({"oauth_user": {"roles": ["gpu-team"]}}))
    assert set(groups) == {"gpu-team"}
    # the client secret is never handed to gpulab's services
    from gpulab_hub import settings

    s = settings.parse({**BASE, "GPULAB_OIDC_CLIENT_SECRET": "s3cret"})
    assert "s3cret" not in json.dumps(settings.service_env(s))


def test_an_unreachable_oidc_provider_stops_the_hub_with_a_sentence():
    c = configured(GPULAB_AUTHENTICATOR="oidc", GPULAB_OIDC_ISSUER="http://127.0.0.1:9")
    with pytest.raises(SettingError, match="could not read the OpenID Connect provider"):
        auth.GpulabGenericOAuthenticator(config=c)


def test_github_orgs_and_teams_become_allowed_organizations_and_groups():
    c = configured(GPULAB_AUTHENTICATOR="github", GPULAB_GITHUB_ORGS="my-lab, other:ml-team")
    g = c.GitHubOAuthenticator
    assert g.allowed_organizations == {"my-lab", "other:ml-team"}
    assert g.populate_teams_in_auth_state is True
    teams = [
        {"slug": "ml-team", "organization": {"login": "Other"}},
        {"slug": "x"},  # no organisation: ignored
    ]
    assert g.auth_state_groups_key({"teams": teams}) == ["other:ml-team"]


def test_ldap_group_dns_become_group_names():
    assert auth.group_name("cn=gpu-team,ou=groups,dc=lab,dc=org") == "gpu-team"
    assert auth.group_name("no-equals-sign") == ""


def test_an_unknown_authenticator_is_refused_with_a_sentence():
    with pytest.raises(SettingError, match="GPULAB_AUTHENTICATOR must be 'local' or"):
        configured(GPULAB_AUTHENTICATOR="kerberos")


@pytest.fixture(scope="module")
def oidc_discovery():
    """An issuer on 127.0.0.1 that serves its discovery document."""

    class Discovery(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            issuer = f"http://127.0.0.1:{self.server.server_port}"
            if self.path != "/.well-known/openid-configuration":
                self.send_error(404)
                return
            body = json.dumps(
                {
                    "issuer": issuer,
                    "authorization_endpoint": issuer + "/authorize",
                    "token_endpoint": issuer + "/token",
                    "userinfo_endpoint": issuer + "/me",
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Discovery)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()

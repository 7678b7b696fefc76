"""Which authenticator logs people in (GPULAB_AUTHENTICATOR), and its settings.

- ``local`` (the default): gpulab's own accounts (NativeAuthenticator: sign-up,
  admin approval, password rules and lockout; auth.py).
- ``ldap``: JupyterHub's ``ldapauthenticator`` against the lab's LDAP or Active
  Directory; the group DNs of GPULAB_LDAP_GROUPS may log in and become JupyterHub
  groups (their ``cn``).
- ``oidc``: ``oauthenticator``'s GenericOAuthenticator against an OpenID Connect
  provider (Keycloak, Google, Entra, Authentik); the groups claim becomes JupyterHub
  groups.
- ``github``: ``oauthenticator``'s GitHubOAuthenticator; members of
  GPULAB_GITHUB_ORGS (``org`` or ``org:team``) may log in, and their teams
  (``org:team``) become JupyterHub groups.

Everything here only sets traits; the admin's lines and ``jupyterhub_config.d`` may
set any other trait of the chosen class (docs/authentication.md). gpulab's pages work
with whichever authenticator (auth.GpulabHub); the pages of gpulab's own accounts
(sign-up, approval) only with ``local``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulab_hub.settings import Settings

AUTH = "gpulab_hub.accounts.auth."
CLASSES = {
    "local": AUTH + "GpulabAuthenticator",
    "ldap": AUTH + "GpulabLDAPAuthenticator",
    "oidc": AUTH + "GpulabGenericOAuthenticator",
    "github": AUTH + "GpulabGitHubOAuthenticator",
}
OIDC_LOGIN_SERVICE = "your organisation's login"  # the login button: "Sign in with ..."
LDAP_PORTS = {"on_connect": 636, "before_bind": 389, "insecure": 389}


def is_local(authenticator) -> bool:
    """Whether ``authenticator`` keeps gpulab's own accounts (NativeAuthenticator's
    table: sign-up, approval, discarding)."""
    from nativeauthenticator import NativeAuthenticator

    return isinstance(authenticator, NativeAuthenticator)


def github_teams(auth_state: dict) -> list[str]:
    """A GitHub user's teams as JupyterHub group names (``org:team``), from the
    auth state GitHubOAuthenticator keeps (``populate_teams_in_auth_state``)."""
    teams = auth_state.get("teams") or []
    return sorted(
        f"{t['organization']['login']}:{t['slug']}".lower()
        for t in teams
        if isinstance(t, dict) and isinstance(t.get("organization"), dict) and t.get("slug")
    )


def refused_words(login) -> str:
    """The page of someone who signed in at the provider but may not use gpulab."""
    github = login.authenticator == "github"
    where = "GitHub" if github else OIDC_LOGIN_SERVICE
    groups = ", ".join(sorted(login.github_orgs if github and login.github_orgs
                              else login.allowed_groups))  # fmt: skip
    member = f" You must be in one of these groups: {groups}." if groups else ""
    return (
        f"You signed in at {where}, but this gpulab does not let your account in.{member} "
        "Ask a gpulab admin to add you, then sign in again."
    )


def configure(c, s: Settings) -> None:
    """The authenticator class and its traits from the settings ``s``."""
    login = s.login
    c.JupyterHub.authenticator_class = CLASSES[login.authenticator]
    c.Authenticator.admin_users = {s.accounts.admin}
    # the lab's own logins: the admin's name is the admin's person's only (identities.py)
    c.BoundLogin.admin_identity = s.accounts.admin_identity
    # Each provider's traits, whichever is chosen (another class's are never read).
    _ldap(c, login)
    _oidc(c, login)
    _github(c, login)
    callback = oauth_callback_url(s)
    if callback:
        c.OAuthenticator.oauth_callback_url = callback
    if login.allowed_groups:
        # OpenID Connect and GitHub (LDAP's are the group DNs of GPULAB_LDAP_GROUPS)
        c.OAuthenticator.allowed_groups = set(login.allowed_groups)
    # what someone the provider knows, but gpulab does not let in, reads
    c.OAuthenticator.custom_403_message = refused_words(login)
    if login.authenticator == "local":
        # NativeAuthenticator lets in only accounts an admin approved.
        c.Authenticator.allow_all = True
        return
    # The provider's groups are the user's JupyterHub groups (sharing, GPU budgets,
    # data folders read them), replaced at each login.
    c.Authenticator.manage_groups = True


def oauth_callback_url(s: Settings) -> str:
    """The redirect URI OpenID Connect and GitHub send people back to, as their browsers
    reach the hub (``<GPULAB_PUBLIC_URL or GPULAB_SUBDOMAIN_HOST>/hub/oauth_callback``);
    "" where the hub is reached directly (oauthenticator takes the request's address).

    Behind a TLS proxy (gpulab's Caddy or the admin's own) the hub cannot guess it: the
    JupyterHub proxy adds its own ``X-Forwarded-Proto: http`` after the TLS proxy's
    ``https``, and the hub reads the last one, so the guess would be an http:// URI the
    provider refuses."""
    public = s.public_url or s.subdomain_host
    if not public:
        return ""
    if "://" not in public:  # as JupyterHub reads a subdomain_host without a scheme
        public = "https://" + public
    return public.rstrip("/") + "/hub/oauth_callback"


def _ldap(c, login) -> None:
    if login.ldap_server:
        c.LDAPAuthenticator.server_address = login.ldap_server
    c.LDAPAuthenticator.tls_strategy = login.ldap_tls
    c.LDAPAuthenticator.server_port = login.ldap_port or LDAP_PORTS[login.ldap_tls]
    if login.ldap_bind_dn:
        c.LDAPAuthenticator.bind_dn_template = [login.ldap_bind_dn]
    if login.ldap_groups:
        # Members of these groups may log in; the groups they are in become theirs.
        # (membership: ldapauthenticator's member, uniqueMember or memberUid search)
        c.LDAPAuthenticator.allowed_groups = list(login.ldap_groups)
    else:
        # Everyone the directory lets bind: it is the lab's own.
        c.LDAPAuthenticator.allow_all = True


def _oidc(c, login) -> None:
    g = c.GenericOAuthenticator
    # The endpoints are read from the issuer's discovery document as the hub makes
    # its authenticator (auth.GpulabOIDC).
    c.GpulabOIDC.oidc_issuer = login.oidc_issuer
    g.client_id = login.oidc_client_id
    g.client_secret = login.oidc_client_secret
    g.scope = list(login.oidc_scopes)
    g.username_claim = login.oidc_username_claim
    # The groups claim of the user info (or the ID token's claims) as JupyterHub groups.
    g.auth_state_groups_key = f"oauth_user.{login.oidc_groups_claim}"
    g.login_service = OIDC_LOGIN_SERVICE


def _github(c, login) -> None:
    g = c.GitHubOAuthenticator
    g.client_id = login.github_client_id
    g.client_secret = login.github_client_secret
    if login.github_orgs:
        g.allowed_organizations = set(login.github_orgs)
    # Teams (org:team) become JupyterHub groups.
    g.populate_teams_in_auth_state = True
    g.scope = ["read:org"]
    g.auth_state_groups_key = github_teams


DISCOVERY = "/.well-known/openid-configuration"
# GenericOAuthenticator's trait: the discovery document's key
OIDC_TRAITS = {
    "authorize_url": "authorization_endpoint",
    "token_url": "token_endpoint",
    "userdata_url": "userinfo_endpoint",
}
ENDPOINTS = tuple(OIDC_TRAITS.values())
MAX_DISCOVERY_BYTES = 1 << 20


def discover(issuer: str, timeout_s: float = 10) -> dict[str, str]:
    """The provider's endpoints, from its discovery document
    (``<issuer>/.well-known/openid-configuration``), read once as the hub starts (it
    makes its authenticator before it serves anyone)."""
    import json

    import requests

    from gpulab_hub import blocking

    url = issuer.rstrip("/") + DISCOVERY
    problem = ""
    try:
        # JupyterHub reads its configuration on its event loop, before it serves anyone
        with blocking.allowed("reading the OpenID Connect provider's endpoints as the hub starts"):
            with requests.get(url, timeout=timeout_s, stream=True) as r:
                r.raise_for_status()
                body = r.raw.read(MAX_DISCOVERY_BYTES + 1, decode_content=True)
        if len(body) > MAX_DISCOVERY_BYTES:
            problem = "its discovery document is too large"
        else:
            doc = json.loads(body)
            if not isinstance(doc, dict):
                problem = "its discovery document is not a JSON object"
    except (requests.RequestException, ValueError) as e:
        problem = str(e)
    if not problem:
        missing = [k for k in ENDPOINTS if not isinstance(doc.get(k), str) or not doc[k]]
        if missing:
            problem = f"its discovery document names no {', '.join(missing)}"
    if problem:
        from gpulab_hub.settingvalues import SettingError

        raise SettingError(
            f"gpulab could not read the OpenID Connect provider at GPULAB_OIDC_ISSUER "
            f"({url}): {problem}. Check the issuer URL and that the hub can reach it."
        )
    return {k: doc[k] for k in ENDPOINTS}

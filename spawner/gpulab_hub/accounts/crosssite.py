"""What a page on another origin of the hub's own site cannot do through the hub's login.

A page on a user's subdomain (``<user>.<hub name>``: a file in her image's
jupyter_server ``static/``, a web server behind ``/proxy/<port>/``) may set cookies with
``Domain=<hub name>``, which the browser sends to the hub, and its forms and links reach
the hub as *same-site* requests, which carry ``SameSite=Lax`` cookies. The login cookies
are ``__Host-`` cookies there (``accounts.host_only_cookies``); two ways to sign a
visitor in as the page's author remained, and are closed here:

- **The OAuth state cookie** (OpenID Connect, GitHub, any OAuthenticator). oauthenticator
  17.4 keeps the login's state in ``oauthenticator-state``, a name without the prefix: the
  author begins a login herself, keeps the state cookie the hub gave her and the
  provider's ``code`` and ``state``, plants that cookie for the hub's name and sends the
  visitor to ``/hub/oauth_callback?code=...&state=...``: the states match and the visitor
  is signed in as her. Wherever the login cookies are host-only, :class:`HostOnlyState`
  handlers set, read and clear ``__Host-oauthenticator-state`` instead and never read the
  unprefixed name (a browser keeps a ``__Host-`` cookie only from the hub's own host, and
  the signature names the cookie, so a value signed for one name is void under the other).
- **Forms posted from another origin** (gpulab's own login and sign-up, LDAP's login
  form). Before anyone signs in, JupyterHub 6.1's XSRF token is bound to the unprefixed
  ``jupyterhub-session-id`` and ``_xsrf`` cookies and to the client's address and browser
  (User-Agent), all of which the author can give herself and plant: her page posts the
  login form with her own name and password, and a signed-out visitor is signed in as her.
  Browsers say where a request comes from (``Sec-Fetch-Site``); :class:`FromHubPagesOnly`
  refuses, with a sentence, every POST, PUT, PATCH and DELETE to the authenticator's
  routes (and gpulab's own front routes) that a page of another origin sent: ``same-site``
  (a user's subdomain, another name of the hub's domain) and ``cross-site``. The hub's own
  pages send ``same-origin``; a request without the header (curl, the project servers,
  the hub's services) is no browser's and passes, as does ``none`` (the person's own act).

:func:`guarded` applies both to the routes an authenticator serves (``GpulabHub.get_handlers``,
mixed into every authenticator gpulab runs). Pages that need a signed-in session are not
the concern here: their XSRF token is bound to the session's own login, which no other
page can read or plant.
"""

from __future__ import annotations

import sys

from tornado import web

STATE_COOKIE = "oauthenticator-state"  # oauthenticator.oauth2.STATE_COOKIE_NAME
HOST_ONLY_STATE_COOKIE = "__Host-" + STATE_COOKIE
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OTHER_ORIGINS = frozenset({"same-site", "cross-site"})
REFUSED = (
    "gpulab refused this form: it was sent by a page that is not one of the hub's own "
    "(from another address, such as a page in someone's project), which could sign you in "
    "to another person's account. Open this hub's own page and send the form from there."
)


def state_cookie_name(handler) -> str:
    """The OAuth state cookie's name: host-only wherever the login cookies are
    (JupyterHub's ``cookie_host_prefix_enabled``, in the hub's tornado settings)."""
    if handler.settings.get("cookie_host_prefix_enabled"):
        return HOST_ONLY_STATE_COOKIE
    return STATE_COOKIE


def from_another_origin(request) -> bool:
    """Whether a browser says a page of another origin sent this changing request."""
    if request.method in SAFE_METHODS:
        return False
    return request.headers.get("Sec-Fetch-Site", "").strip().lower() in OTHER_ORIGINS


class FromHubPagesOnly:
    """A hub handler that refuses changing requests sent by pages of other origins
    (mixed in before the handler's class by :func:`guarded`)."""

    async def prepare(self):
        if from_another_origin(self.request):
            self.log.warning(
                "gpulab: refused a %s to %s sent by a page of another origin (Sec-Fetch-Site: %s)",
                self.request.method,
                self.request.path,
                self.request.headers.get("Sec-Fetch-Site"),
            )
            raise web.HTTPError(403, REFUSED)
        return await super().prepare()


class HostOnlyStateLogin:
    """oauthenticator's login handler, its state cookie under the host-only name."""

    def set_state_cookie(self, state_cookie_value):
        self._set_cookie(state_cookie_name(self), state_cookie_value, expires_days=1, httponly=True)


class HostOnlyStateCallback:
    """oauthenticator's callback handler: the state from the host-only cookie only."""

    def get_state_cookie(self):
        if self._state_cookie is None:
            name = state_cookie_name(self)
            self._state_cookie = (self.get_secure_cookie(name) or b"").decode("utf8", "replace")
            self.clear_cookie(name)
        return self._state_cookie


class HostOnlyStateLogout:
    """oauthenticator's logout handler, clearing the host-only state cookie."""

    async def handle_logout(self):
        self.clear_cookie(state_cookie_name(self))


def _oauth_mixins(handler: type) -> list[type]:
    oauth2 = sys.modules.get("oauthenticator.oauth2")  # loaded where an OAuthenticator runs
    if oauth2 is None:
        return []
    pairs = (
        (oauth2.OAuthLoginHandler, HostOnlyStateLogin),
        (oauth2.OAuthCallbackHandler, HostOnlyStateCallback),
        (oauth2.OAuthLogoutHandler, HostOnlyStateLogout),
    )
    return [mixin for base, mixin in pairs if issubclass(handler, base)]


def guard(handler):
    """``handler`` (a hub handler class) refusing other origins' changing requests, and,
    for oauthenticator's handlers, keeping the state cookie host-only. The class keeps
    its module and name (the hub's route tables name handlers by them)."""
    if not isinstance(handler, type) or issubclass(handler, FromHubPagesOnly):
        return handler
    bases = (FromHubPagesOnly, *_oauth_mixins(handler), handler)
    names = {"__module__": handler.__module__, "__qualname__": handler.__qualname__}
    return type(handler.__name__, bases, {**names, "__doc__": handler.__doc__})


def guarded(routes) -> list:
    """The routes (tornado rules: pattern, handler, ...) with every handler guarded."""
    return [(route[0], guard(route[1]), *route[2:]) for route in routes]

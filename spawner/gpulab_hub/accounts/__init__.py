"""The admin's account pages, with every change made by POST and JupyterHub's XSRF check.

NativeAuthenticator 1.3 approves (``/hub/authorize/<user>``) and discards
(``/hub/discard/<user>``) accounts on GET, so a link or an image on any page an
admin opens could approve an account. Here GET only shows (it sends the admin to
that account's row on ``/hub/authorize``); the page's buttons are small forms that
POST with the ``_xsrf`` token, which JupyterHub's BaseHandler checks on every POST.

Approving sets the state the button names (``action=authorize|unauthorize``)
instead of toggling it, so a repeated POST changes nothing. Discarding an account
that was never approved deletes it the way JupyterHub's user API does (servers
stopped, every project's and the account's data removed: deletion.py), not only
NativeAuthenticator's row.

An admin cannot unapprove their own account (they would lock themselves out): the
page offers no button on their row and the POST is refused with a sentence. Admins
see how many sign-ups wait for approval on every hub page (the nav bar's
"Sign-ups waiting (N)", :func:`signups_waiting`) and above JupyterHub's Admin page,
which lists approved users only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from jupyterhub.scopes import needs_scope
from jupyterhub.utils import maybe_future
from nativeauthenticator import handlers as native
from nativeauthenticator.orm import UserInfo
from tornado import web

if TYPE_CHECKING:
    from gpulab_hub.settings import Settings

TEMPLATES = Path(__file__).with_name("templates")
ACTIONS = {"authorize": True, "unauthorize": False}
USERNAME_PATTERN = r"[a-z0-9][a-z0-9._@+-]{0,63}\Z"
SELF_UNAPPROVE = (
    "You cannot unapprove your own account: you would be locked out of gpulab at once. "
    "Another administrator can, if it must be done."
)
# JupyterHub's Admin page (a React app) shows a "default server" row for every user,
# whose Start button always fails: gpulab has no default project (ProjectSpawner
# refuses it). The admin.html template hides that row where the user has projects,
# and its server buttons where they have none (the row stays: it holds Edit User).


class AuthorizationAreaHandler(native.AuthorizationAreaHandler):
    """/hub/authorize: every account, with Authorize / Unauthorize / Discard forms."""

    @needs_scope("admin:users")
    async def get(self):
        html = await self.render_template(
            "gpulab-authorize.html",
            ask_email=self.authenticator.ask_email_on_signup,
            # waiting for approval first, then the approved accounts, each by name
            users=self.db.query(UserInfo).order_by(UserInfo.is_authorized, UserInfo.username).all(),
            me=self.current_user.name,
        )
        self.finish(html)


class _AccountAction(native.LocalBase):
    def _back(self, name: str) -> None:
        # 303: the browser follows with a GET of the page, never repeating the POST.
        self.redirect(f"{self.hub.base_url}authorize#{quote(name)}", status=303)

    @needs_scope("admin:users")
    async def get(self, name: str):
        """Shows only: no GET changes an account."""
        self._back(name)


class ToggleAuthorizationHandler(_AccountAction):
    """POST /hub/authorize/<user> with ``action=authorize`` or ``action=unauthorize``."""

    @needs_scope("admin:users")
    async def post(self, name: str):
        wanted = ACTIONS.get(self.get_body_argument("action", ""))
        if wanted is None:
            raise web.HTTPError(400, "action must be 'authorize' or 'unauthorize'.")
        info = UserInfo.find(self.db, name)
        if info is None:
            raise web.HTTPError(404, f"No account named {name!r}.")
        if not wanted and info.username == self.current_user.name:
            raise web.HTTPError(400, SELF_UNAPPROVE)
        set_approval(self, info, wanted)
        if not wanted:
            await end_access(self, info.username)
        self._back(name)


def set_approval(handler, info: UserInfo, wanted: bool) -> None:
    """Approve (or unapprove) NativeAuthenticator's account ``info``, as an admin's
    page asked (this page and the admin overview, admin/web.py)."""
    if bool(info.is_authorized) != wanted:
        info.is_authorized = wanted
        handler.db.commit()
        done = "approved" if wanted else "unapproved"
        handler.log.info(
            "gpulab: %s %s the account %s", handler.current_user.name, done, info.username
        )
    if wanted:
        # A hub user from the moment of approval: others can share with them
        # before they ever log in.
        handler.user_from_username(info.username)


async def end_access(handler, name: str) -> None:
    """What an unapproved account had open ends at once: every login cookie (JupyterHub
    reads a login cookie as the user's ``cookie_id``, which is replaced), every token
    (API tokens, and the OAuth tokens of project servers, its own and those shared with
    it), then its running projects are stopped as the hub's stop API does (folders,
    images and shares kept: approving the account again gives it all back)."""
    from jupyterhub.orm import new_token

    user = handler.find_user(name)
    if user is None:
        return  # never logged in: nothing open
    user.orm_user.cookie_id = new_token()
    tokens = list(user.orm_user.api_tokens)
    for token in tokens:
        handler.db.delete(token)
    handler.db.commit()
    running = [n for n, sp in user.spawners.items() if sp.active]
    await handler.authenticator.stop_servers(user)  # auth.GpulabHub's: these routes are its
    handler.log.info(
        "gpulab: the unapproved account %s: its sessions and %d tokens ended, %d projects stopped",
        name,
        len(tokens),
        len(running),
    )


class DiscardHandler(_AccountAction):
    """POST /hub/discard/<user>: delete an account that was never approved."""

    @needs_scope("admin:users")
    async def post(self, name: str):
        info = self.authenticator.get_user(name)
        if info is None or info.is_authorized:
            raise web.HTTPError(400, "Only an account that is not approved can be discarded.")
        user = self.find_user(name)
        if user is None:
            # Never logged in: no JupyterHub user, but leftovers of an older
            # account of that name are removed all the same.
            await maybe_future(self.authenticator.delete_user(_Named(name)))
        else:
            await maybe_future(self.authenticator.delete_user(user))
            await user.delete_spawners()
            self.users.delete(user)
        self.log.info("gpulab: %s discarded the account %s", self.current_user.name, name)
        self.redirect(f"{self.hub.base_url}authorize", status=303)


def waiting_count(db) -> int:
    """How many accounts signed up and wait for an admin's approval."""
    return db.query(UserInfo).filter(UserInfo.is_authorized.is_(False)).count()


def signups_waiting(user):
    """JupyterHub template variable (``c.JupyterHub.template_vars``): for the page's
    user, a function giving the number of sign-ups waiting. Pages call it only for
    users who may approve accounts (``admin:users`` in the page's scopes), so no one
    else's page asks the database."""
    if user is None:
        return lambda: 0
    from gpulab_hub.accounts import providers

    if not providers.is_local(getattr(user, "authenticator", None)):
        return lambda: None  # the lab's own logins: no sign-ups, no approval
    return lambda: waiting_count(user.db)


def approved_hub_user(handler, name: str):
    """The hub's user (``orm.User``) of the approved account ``name``, made if the
    account was approved but never logged in (or approved before gpulab made hub
    users at approval); None where no approved account has that name."""
    from jupyterhub import orm

    user = orm.User.find(handler.db, name)
    if user is not None:
        return user
    from gpulab_hub.accounts import providers

    if not providers.is_local(handler.authenticator):
        return None  # the lab's own logins: a user exists once they logged in
    info = UserInfo.find(handler.db, name)
    if info is None or not info.is_authorized:
        return None
    return handler.user_from_username(info.username).orm_user


class _Named:
    """A user known by name only (what Authenticator.delete_user reads)."""

    def __init__(self, name: str):
        self.name = name


def cookie_options(public_url: str) -> dict:
    """Options of every cookie the hub and the project servers set.

    ``SameSite=Lax``: a page of another site cannot make the browser send them with
    its requests (forms, fetches, frames), while a link from another site (an email
    with a share link) still opens the page logged in. ``Strict`` would break that
    link: the project server's OAuth callback, at the end of a redirect chain that
    began on another site, would arrive without its state cookie and fail.
    ``Secure`` when people reach the hub over https.
    """
    options: dict = {"samesite": "Lax"}
    if public_url.lower().startswith("https://"):
        options["secure"] = True
    return options


def host_only_cookies(subdomain_host: str) -> bool:
    """Whether the hub's and the project servers' login cookies are ``__Host-`` cookies
    (JupyterHub's ``cookie_host_prefix_enabled``): wherever users' servers are on
    subdomains of the hub's name served over https.

    A page on ``<user>.<hub name>`` may set a cookie with ``Domain=<hub name>``, which
    the browser then sends to the hub (and every user's server): it could put its own
    ``jupyterhub-hub-login`` in a visitor's browser and sign them in as its author. A
    browser keeps a ``__Host-`` cookie only if the hub's own host set it (no
    ``Domain``, ``Path=/``, ``Secure``), and with the prefix JupyterHub reads the
    prefixed names only (the hub's login cookie; each project server's login and OAuth
    state cookies), so what a subdomain sets is never read. ``Secure`` needs https:
    on plain http a browser would refuse these cookies and nobody could log in. Without
    subdomains every project is on the hub's own origin, where its pages act with the
    visitor's session anyway, and ``Path=/`` would send the hub's cookie to every
    project server: JupyterHub's advice is the prefix with per-user domains only.
    """
    return subdomain_host.lower().startswith("https://")


def configure(c, s: Settings) -> None:
    """Account settings from the settings ``s`` (hubconfig.apply calls this)."""
    a = s.accounts
    # User names become folder, volume and label names: plain ASCII, checked whole
    # (JupyterHub matches this pattern from the start; \Z, not $, ends it).
    c.Authenticator.username_pattern = USERNAME_PATTERN
    # NativeAuthenticator's own password rules and failed-login lockout.
    c.NativeAuthenticator.minimum_password_length = a.password_min_length
    c.NativeAuthenticator.check_common_password = a.password_check_common
    c.NativeAuthenticator.allowed_failed_logins = a.login_attempts
    c.NativeAuthenticator.seconds_before_next_try = a.login_lockout_s
    # JupyterHub sets cookie_options on its own cookies (the _xsrf one too) and hands
    # them to each project server (JUPYTERHUB_COOKIE_OPTIONS) for its login cookies.
    if s.public_url:
        c.JupyterHub.public_url = s.public_url
    public = s.public_url or s.subdomain_host or s.bind_url
    c.JupyterHub.tornado_settings.update({"cookie_options": cookie_options(public)})
    # Pages on users' subdomains cannot set or shadow the login cookies (docs/security.md).
    c.JupyterHub.cookie_host_prefix_enabled = host_only_cookies(s.subdomain_host)
    # The authorization, sign-up, login and admin pages' templates (after the ones
    # hubconfig.apply set), and what the nav bar shows admins (templates/gpulab-nav.html).
    paths = c.JupyterHub.template_paths
    c.JupyterHub.template_paths = [*(paths if isinstance(paths, list) else []), str(TEMPLATES)]
    given = c.JupyterHub.template_vars if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {**dict(given), "gpulab_signups_waiting": signups_waiting}
    # Deleting a user or a project (deletion.py): archive or remove (settings checked it).
    c.GpulabDeletion.archive = a.deleted_files == "archive"

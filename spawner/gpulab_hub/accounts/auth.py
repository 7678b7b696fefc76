"""Authentication: NativeAuthenticator (bcrypt-hashed passwords, sign-up with
admin approval) plus a first admin account created on the hub's first start.

NativeAuthenticator's own password rules and failed-login lockout are on
(``minimum_password_length``, ``check_common_password``, ``allowed_failed_logins``,
``seconds_before_next_try``; hubconfig.py sets them from the settings), the
login page says when a locked account may try again, and account changes on the
admin's pages need POST + XSRF (accounts.py). Deleting a user stops their servers
first and removes what they had (deletion.py).

A failed login costs the same whether or not the name exists: a name with no account
(or a locked one) is checked against a stand-in bcrypt hash of the accounts' own cost,
so the time of an answer does not tell which names have accounts. The bcrypt work runs
on a worker thread, off the hub's event loop.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

from jupyterhub.auth import Authenticator
from jupyterhub.utils import maybe_future
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator import handlers as native
from nativeauthenticator.orm import UserInfo
from traitlets import List, Unicode, default

from gpulab_contract import files
from gpulab_hub import accounts
from gpulab_hub.accounts import crosssite, identities

# Sane defaults of NativeAuthenticator's own settings (its traits default to "off").
MIN_PASSWORD_LENGTH = 10
ALLOWED_FAILED_LOGINS = 5
SECONDS_BEFORE_NEXT_TRY = 300
BCRYPT_MAX = 72  # bytes of a password bcrypt reads (bcrypt 5 refuses longer ones)
PASSWORD_OK = "gpulab_password_ok"  # set on the login handler by authenticate()


class LoginHandler(native.LoginHandler):
    """NativeAuthenticator 1.3's login page, mended for JupyterHub 6.

    Its POST uses ``self.statsd`` (removed from JupyterHub) and its ``_render``
    rejects the ``sync`` argument JupyterHub passes when a POST's refusal (an expired
    form, one from another origin) is shown as the login page with its words: rendered
    at once then, as JupyterHub's error pages must be. The page and the password check
    are NativeAuthenticator's own.
    """

    _sync = False  # the page being rendered is an error page's (written at once)

    def _render(self, login_error=None, username=None, sync=False, **kwargs):
        self._sync = sync
        try:
            return super()._render(login_error=login_error, username=username)
        finally:
            self._sync = False

    def render_template(self, name, sync=False, **ns):
        return super().render_template(name, sync=sync or self._sync, **ns)

    async def post(self):
        data = {arg: self.get_argument(arg, strip=False) for arg in self.request.body_arguments}
        data.pop("_xsrf", None)
        data["username"] = data.get("username", "").strip()
        user = await self.login_user(data)
        if user:
            self._jupyterhub_user = user
            self.redirect(self.get_next_url(user))
            return
        error = "Invalid username or password."
        info = self.authenticator.get_user(data["username"])
        wait = self.authenticator.seconds_locked(data["username"])
        # whether the password was right, from the one bcrypt check of this login
        # (checking again here would make an unapproved account's login slower)
        password_ok = getattr(self, PASSWORD_OK, False)
        if wait:
            error = (
                f"Too many failed logins for {data['username']}: this account is locked for "
                f"{_duration(wait)} more (until {_clock(time.time() + wait)}). "
                "Try again after that."
            )
        elif info is not None and not info.is_authorized:
            if password_ok:
                error = f"User {data['username']} has not been approved by an administrator yet."
        self.set_status(403)
        self.finish(await self._render(login_error=error, username=data["username"]))


class SignUpHandler(native.SignUpHandler):
    """NativeAuthenticator's sign-up page; its template (accounts/templates/signup.html)
    says, before anyone submits, whether an administrator must approve the account and
    the password rules (from the authenticator's settings). A refused sign-up keeps the
    username and says which rule it broke: a taken name, a name gpulab does not accept,
    passwords that differ, a password too short, too long or too common.

    NativeAuthenticator's POST does the work (create_user checks the same rules again);
    this class only gives its refusals gpulab's words (:func:`signup_refusal`)."""

    _form: tuple[str, str, str] = ("", "", "")  # username, password, confirmation

    def render_template(self, name, sync=False, **ns):
        ns.setdefault("open_signup", self.authenticator.open_signup)
        ns.setdefault("password_rules", password_rules(self.authenticator))
        ns.setdefault("min_password_length", self.authenticator.minimum_password_length)
        if ns.get("alert") == "alert-danger":
            ns.setdefault("username", self._form[0])
        return super().render_template(name, sync=sync, **ns)

    async def post(self):
        self._form = (
            self.get_body_argument("username", "", strip=False),
            self.get_body_argument("signup_password", "", strip=False),
            self.get_body_argument("signup_password_confirmation", "", strip=False),
        )
        if self.authenticator.enable_signup and len(_utf8(self._form[1])) > BCRYPT_MAX:
            # bcrypt cannot hash it: create_user would fail with an error page
            a = self.authenticator
            html = await self.render_template(
                "signup.html",
                ask_email=a.ask_email_on_signup,
                result_message=signup_refusal(a, *self._form, taken=False, made=None),
                alert="alert-danger",
                two_factor_auth=a.allow_2fa,
                recaptcha_key=a.recaptcha_key,
                tos=a.tos,
            )
            self.finish(html)
            return
        await super().post()

    def get_result_message(self, user, human, taken, matches, user_is_admin):
        alert, message = super().get_result_message(user, human, taken, matches, user_is_admin)
        if alert == "alert-danger" and human:
            message = signup_refusal(self.authenticator, *self._form, taken=taken, made=user)
        return alert, message


def password_rules(authenticator) -> list[str]:
    """The sign-up page's password rules, in the user's words, from the settings."""
    rules = []
    if authenticator.minimum_password_length > 0:
        rules.append(f"at least {authenticator.minimum_password_length} characters")
    rules.append(f"at most {BCRYPT_MAX} bytes (72 plain letters and digits)")
    if authenticator.check_common_password:
        rules.append("not one of the 10,000 most common passwords (such as qwertyuiop)")
    return rules


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def signup_refusal(authenticator, username, password, confirmation, taken, made) -> str:
    """Why a sign-up was refused, in the user's words: the first rule it broke."""
    name = authenticator.normalize_username(username)
    if taken:
        return (
            f"The username {name} is already taken: choose another one. (If it is yours, "
            "log in instead; an account waiting for approval cannot log in yet.)"
        )
    if not name or not authenticator.validate_username(name):
        return (
            "That username is not accepted: use 1 to 64 lowercase letters, digits and "
            ". _ @ + -, starting with a letter or digit (no spaces)."
        )
    if password != confirmation:
        return "The two passwords differ: type the same password in both fields."
    if len(_utf8(password)) > BCRYPT_MAX:
        return f"That password is too long: gpulab reads at most {BCRYPT_MAX} bytes of it."
    if len(password) < authenticator.minimum_password_length:
        return (
            f"That password is too short ({len(password)} characters): it needs at least "
            f"{authenticator.minimum_password_length}."
        )
    if authenticator.check_common_password and authenticator.is_password_common(password):
        return (
            "That password is one of the most common passwords, which are tried first by "
            "anyone guessing: choose another one."
        )
    if made is None:
        return "The account could not be created: check each field and try again."
    return "The account could not be created."


def _duration(seconds: float) -> str:
    seconds = max(1, round(seconds))
    minutes, rest = divmod(seconds, 60)
    if not minutes:
        return f"{rest} seconds"
    return f"{minutes} min {rest} s" if rest else f"{minutes} minutes"


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(when))


class GpulabHub(Authenticator):
    """What gpulab needs of any authenticator, mixed into whichever one logs people in
    (local accounts, LDAP, OpenID Connect, GitHub, or one the admin names:
    ``hubconfig.finish`` mixes this class into it).

    - gpulab's routes that replace JupyterHub's own (the home page, the spawn page, the
      activity API): JupyterHub 6.1 puts only its authenticator's routes before its own,
      so the hub's wiring (hubconfig.py) lists them in :attr:`gpulab_routes` and they come
      first here, whatever the authenticator.
    - a project server's own token narrowed to its project (sharing/activity.py);
    - deleting a user stops their servers and removes what they had (deletion.py).
    """

    gpulab_routes = List(
        config=True,
        help="""gpulab's routes put before JupyterHub's own, whatever the authenticator:
        the home page, the spawn page, the project activity API. Set by gpulab's hub
        wiring (hubconfig.py), not by admins. Default: empty (hubconfig sets them).
        Example: ``c.GpulabAuthenticator.gpulab_routes = home.front_handlers()`` (every
        authenticator: ``c.GpulabHub.gpulab_routes``)""",
    )

    def get_handlers(self, app):
        # pages of other origins post none of them; OAuth state host-only (crosssite.py)
        return crosssite.guarded([*self.gpulab_routes, *super().get_handlers(app)])

    async def authenticate(self, handler, data):
        """The authenticator's answer; with ``manage_groups``, its groups are the
        user's JupyterHub groups (LDAP's group DNs become their first RDN's value)."""
        model = await maybe_future(super().authenticate(handler, data))
        if self.manage_groups and isinstance(model, dict) and "groups" not in model:
            dns = (model.get("auth_state") or {}).get("ldap_groups", [])
            model["groups"] = sorted({group_name(dn) for dn in dns} - {""})
        return model

    def pre_spawn_start(self, user, spawner):
        """The project server's own token reports activity for that project only
        (sharing/activity.py): JupyterHub made it with the whole user's a moment ago."""
        from gpulab_hub.sharing import activity

        super().pre_spawn_start(user, spawner)
        activity.narrow_server_token(user.db, spawner)

    async def delete_user(self, user):
        """Stop the user's servers and remove what they had, then what the
        authenticator keeps of the account (NativeAuthenticator's row).

        JupyterHub's DELETE /hub/api/users/<name> calls this first; then each of the
        user's spawners' ``delete_forever`` (which refuses a running server).
        """
        from gpulab_hub.workflows import deletion  # the spawner side (docker) only when deleting

        await deletion.delete_user(self, user)
        return await maybe_future(super().delete_user(user))

    async def stop_servers(self, user) -> None:
        """Stop every project of ``user`` (a JupyterHub User), as the hub's stop API
        does: an unapproved account's end (accounts.end_access)."""
        from gpulab_hub.workflows import deletion  # the spawner side only when stopping

        await deletion.stop_servers(user)


def group_name(dn: str) -> str:
    """The group's name in a DN (``cn=gpu-team,ou=groups,dc=lab`` -> ``gpu-team``);
    "" where the DN does not start with an attribute=value pair."""
    first = dn.split(",", 1)[0]
    _, eq, value = first.partition("=")
    return value.strip() if eq else ""


class GpulabOIDC(identities.OIDCIdentity, GpulabHub):
    """An OpenID Connect provider's endpoints from its discovery document, read once
    when the hub makes its authenticator (GPULAB_OIDC_ISSUER); an endpoint the admin
    set (``c.GenericOAuthenticator.token_url = ...``) stays theirs. Each account is
    bound to one issuer and ``sub`` (identities.py)."""

    oidc_issuer = Unicode(
        "",
        config=True,
        help="""The OpenID Connect provider's issuer URL: the authorize, token and user
        info URLs are read from ``<issuer>/.well-known/openid-configuration`` when the
        hub starts. Default: empty (set each URL yourself). Set by GPULAB_OIDC_ISSUER.
        Example: ``c.GpulabAuthenticator.oidc_issuer = "https://sso.lab.org/realms/lab"``
        (only the ``oidc`` authenticator reads it)""",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.oidc_issuer:
            from gpulab_hub.accounts import providers

            ends = providers.discover(self.oidc_issuer)
            for trait, key in providers.OIDC_TRAITS.items():
                if not getattr(self, trait):
                    setattr(self, trait, ends[key])


class GpulabLDAP(identities.LDAPIdentity, GpulabHub):
    """LDAP logins, each account bound to one directory entry (identities.py)."""


class GpulabGitHub(identities.GitHubIdentity, GpulabHub):
    """GitHub logins, each account bound to one GitHub user id (identities.py)."""


def with_gpulab(cls: type, mixin: type = GpulabHub) -> type:
    """``cls`` (any JupyterHub authenticator class) with :class:`GpulabHub` mixed in."""
    if issubclass(cls, mixin):
        return cls
    return type(f"Gpulab{cls.__name__}", (mixin, cls), {"__module__": __name__})


# The lab's own logins (GPULAB_AUTHENTICATOR, accounts/providers.py), made on first use
# so the hub imports ldapauthenticator and oauthenticator only where they are chosen.
_PROVIDERS = {
    "GpulabLDAPAuthenticator": ("ldapauthenticator.LDAPAuthenticator", GpulabLDAP),
    "GpulabGenericOAuthenticator": ("oauthenticator.generic.GenericOAuthenticator", GpulabOIDC),
    "GpulabGitHubOAuthenticator": ("oauthenticator.github.GitHubOAuthenticator", GpulabGitHub),
}


def __getattr__(name: str):
    if name not in _PROVIDERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from traitlets import import_item

    base, mixin = _PROVIDERS[name]
    cls = with_gpulab(import_item(base), mixin)
    globals()[name] = cls
    return cls


class FirstAdminError(RuntimeError):
    """The first admin could not be made safely; ``str()`` says why and what to do."""


class GpulabAuthenticator(GpulabHub, NativeAuthenticator):
    """Users sign up at /hub/signup; an admin approves them at /hub/authorize."""

    @default("minimum_password_length")
    def _default_min_length(self):
        return MIN_PASSWORD_LENGTH

    @default("check_common_password")
    def _default_check_common(self):
        return True

    @default("allowed_failed_logins")
    def _default_allowed_failed(self):
        return ALLOWED_FAILED_LOGINS

    @default("seconds_before_next_try")
    def _default_wait(self):
        return SECONDS_BEFORE_NEXT_TRY

    first_admin = Unicode(
        "admin",
        config=True,
        help="""Name of the admin account created on the hub's first start (also
        listed in ``Authenticator.admin_users``). Default: admin.
        Example: ``c.GpulabAuthenticator.first_admin = "root"``""",
    )
    first_admin_password = Unicode(
        "",
        config=True,
        help="""Password of the first admin. Default: empty, meaning a random one is
        generated and written to ``first_admin_password_file``.
        Example:
        ``c.GpulabAuthenticator.first_admin_password = os.environ["GPULAB_ADMIN_PASSWORD"]``
        """,
    )
    first_admin_password_file = Unicode(
        "",
        config=True,
        help="""Where a generated first-admin password is written (mode 0600) for
        ``gpulab up`` to print once and delete, before the admin is made. Default: empty
        (then a password must be configured: gpulab never logs one; gpulab's own
        configuration always names a file in the hub's folder).
        Example:
        ``c.GpulabAuthenticator.first_admin_password_file = "/srv/gpulab/hub/admin-pw"``
        """,
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stand_in: bytes | None = None
        self.ensure_first_admin()

    def stand_in_hash(self) -> bytes:
        """A bcrypt hash of a random password, made once, at the cost new accounts'
        hashes have: what a login for a name with no account is checked against."""
        if self._stand_in is None:
            self._stand_in = _hash(secrets.token_urlsafe(32))
        return self._stand_in

    def _password_matches(self, password, stored: bytes | None) -> bool:
        return password_matches(password, self.stand_in_hash() if stored is None else stored)

    async def authenticate(self, handler, data):
        """NativeAuthenticator's check (approved account, password, 2FA token, lockout),
        with one bcrypt check on every try: against the account's hash, or against
        :meth:`stand_in_hash` for a name with no account or a locked one, so that the
        answer takes as long either way."""
        username = self.normalize_username(str(data.get("username", "")))
        password = data.get("password", "")
        info = self.get_user(username)
        locked = bool(self.allowed_failed_logins) and self.is_blocked(username)
        known = info is not None and not locked
        stored = bytes(info.password) if known else None
        ok = await asyncio.get_running_loop().run_in_executor(
            None, self._password_matches, password, stored
        )
        if not known:
            return None
        if handler is not None:
            setattr(handler, PASSWORD_OK, ok)
        checks = [info.is_authorized, ok]
        if info.has_2fa:
            checks.append(info.is_valid_token(data.get("2fa")))
        if all(checks):
            self.successful_login(username)
            return username
        self.add_login_attempt(username)
        return None

    def get_handlers(self, app):
        """NativeAuthenticator's pages (some mended); gpulab's own routes come first
        (GpulabHub)."""
        mine = {
            r"/login": LoginHandler,
            r"/signup": SignUpHandler,
            r"/authorize": accounts.AuthorizationAreaHandler,
            r"/authorize/([^/]*)": accounts.ToggleAuthorizationHandler,
            r"/discard/([^/]*)": accounts.DiscardHandler,
        }
        routes = [(route, mine.get(route, handler)) for route, handler in super().get_handlers(app)]
        return crosssite.guarded(routes)

    def seconds_locked(self, username: str) -> float:
        """How long ``username`` must wait before the next login try (0: not locked)."""
        name = self.normalize_username(username)
        if not self.allowed_failed_logins or not self.is_blocked(name):
            return 0
        since = time.time() - self.login_attempts[name]["time"].timestamp()
        return max(0.0, self.seconds_before_next_try - since)

    def ensure_first_admin(self) -> str | None:
        """Create the first admin if it has no password yet; return the password.

        A generated password is written to ``first_admin_password_file`` before the
        admin's row is committed: when it cannot be written, no admin is made (the next
        start tries again) and the hub stops with a sentence saying why, so nobody is
        left with an admin whose password no one knows. A password never goes to the log.
        """
        name = self.normalize_username(self.first_admin)
        if UserInfo.find(self.db, name) is not None:
            return None
        password = self.first_admin_password or self._new_password()
        if not self.is_password_strong(password):
            raise ValueError(
                f"The first admin's configured password is too weak: it needs at least "
                f"{self.minimum_password_length} characters and must not be a common one "
                "(GPULAB_ADMIN_PASSWORD)."
            )
        if not self.first_admin_password:
            self._write_first_password(name, password)
        info = UserInfo(
            username=name,
            password=_hash(password),
            is_authorized=True,
        )
        self.db.add(info)
        self.db.commit()
        if self.first_admin_password:
            self.log.info("Created the first admin %r with the configured password", name)
        else:
            self.log.warning(
                "Created the first admin %r; its password is in %s",
                name, self.first_admin_password_file,
            )  # fmt: skip
        return password

    def _write_first_password(self, name: str, password: str) -> None:
        """``name`` and ``password`` in ``first_admin_password_file`` (mode 0600, written
        atomically: never through a link in its place); FirstAdminError if it cannot be."""
        if not self.first_admin_password_file:
            raise FirstAdminError(
                f"gpulab made no first admin {name!r}: no password is configured "
                "(GPULAB_ADMIN_PASSWORD, c.GpulabAuthenticator.first_admin_password) and no "
                "file to write a generated one to (c.GpulabAuthenticator."
                "first_admin_password_file), and gpulab never writes a password to the log."
            )
        path = Path(self.first_admin_password_file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(path, f"{name}\n{password}\n".encode(), mode=0o600)
        except OSError as e:
            raise FirstAdminError(
                f"gpulab made no first admin {name!r}: its generated password could not be "
                f"written to {path} ({e.strerror or e}). Give the hub's account write access "
                f"to {path.parent}, or set GPULAB_ADMIN_PASSWORD, then start the hub again."
            ) from e

    def _new_password(self) -> str:
        """A random password that meets the password rules."""
        while True:
            password = secrets.token_urlsafe(max(12, self.minimum_password_length))
            if self.is_password_strong(password):
                return password


def _hash(password: str) -> bytes:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt())


def password_matches(password, stored: bytes) -> bool:
    """Whether ``password`` hashes to ``stored`` (a bcrypt hash), in constant time.
    bcrypt reads the first BCRYPT_MAX bytes of a password (bcrypt 4 cut longer ones
    itself; bcrypt 5 refuses them, which made such a login fail with an error for a
    name that has an account only)."""
    import bcrypt

    if not isinstance(password, str):
        return False
    try:
        return bcrypt.checkpw(password.encode("utf-8", "surrogatepass")[:BCRYPT_MAX], stored)
    except ValueError:  # a damaged stored hash
        return False

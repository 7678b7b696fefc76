"""One provider account, one gpulab account, for good (docs/security.md, "Logins").

With the lab's own logins (LDAP, OpenID Connect, GitHub) the provider hands the hub a
name, and JupyterHub makes it a user name by lower-casing it. Two accounts of the
provider could then become one gpulab account: ``Carol`` and ``carol`` at a provider
that keeps case distinct (Authentik, Django, Keycloak's ``preferred_username`` where
an admin set it), ``\\u212Aaren`` (KELVIN SIGN) and ``karen``, or a name the provider
gave again to someone new. So:

- a name the provider sends must already be in its canonical form (Unicode
  compatibility form NFKC, case-folded: :func:`canonical`), or the login is refused
  with a sentence. GitHub logins are unique whatever their case (GitHub refuses a
  second ``octocat`` in any case), so there only the case is folded;
- each gpulab account is bound, at its first login, to the provider's stable identity
  of the person (:meth:`BoundLogin.login_identity`: OpenID Connect's issuer and
  ``sub``, the LDAP entry's ``entryUUID`` or ``objectGUID`` or else its DN, GitHub's
  numeric user id), kept in the hub's database (:class:`IdentityStore`); a later login
  of another identity under that name is refused with a sentence, and so is every
  login while the database cannot be read;
- the admin (GPULAB_ADMIN) is the admin only with the identity that first held the
  name, or the one the admin set (GPULAB_ADMIN_IDENTITY), and must be in an allowed
  group like everyone else (oauthenticator lets admin_users in whatever their
  groups); only the identity GPULAB_ADMIN_IDENTITY names is let in outside them.

Deleting an account forgets its binding (accounts/records.py): the name is free for a
new account, with nothing of the old one.
"""

from __future__ import annotations

import time
import unicodedata

import sqlalchemy as sa
from jupyterhub.auth import Authenticator
from jupyterhub.utils import maybe_future
from sqlalchemy.exc import IntegrityError
from tornado import web
from traitlets import Unicode

from gpulab_hub import blocking
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import tables

FILE_NAME = "login-identities.json"  # gpulab before its database: imported (identityfile.py)
STATE_KEY = "gpulab_identity"  # where the login's identity rides in its auth state
LDAP_IDS = ("entryUUID", "objectGUID")  # an entry's stable id, where the directory has one


def canonical(name: str) -> str:
    """``name`` as gpulab takes it: NFKC, then case-folded (``\\u212Aaren`` -> ``karen``)."""
    return unicodedata.normalize("NFKC", name).casefold()


def name_refusal(name: str, where: str, case_unique: bool = False) -> str | None:
    """Why gpulab does not take the provider's ``name`` (in the user's words), or None.
    ``case_unique``: the provider's names are unique whatever their case (GitHub)."""
    folded = canonical(name)
    if name == folded or (case_unique and name.isascii() and name.lower() == folded):
        return None
    return (
        f"You signed in at {where} as '{name}', but gpulab takes a user name only as it "
        f"is written in lower case and plain letters ('{folded}'), so that two accounts "
        f"of {where} never become one gpulab account. Ask a gpulab admin to have your "
        f"name at {where} written '{folded}' (if no one else has that name), then sign "
        "in again."
    )


def taken_words(name: str, where: str) -> str:
    """The page of a login whose name belongs to another identity of the provider."""
    return (
        f"Another account of {where} already signed in to gpulab as '{name}': that gpulab "
        f"account stays the one of its first account at {where}, so yours cannot use it. "
        f"Ask a gpulab admin to give your account another name at {where}, or, if "
        f"'{name}' is yours now, to delete the old gpulab account '{name}' first."
    )


def reserved_words(name: str, where: str) -> str:
    """The page of a login under the admin's name by another than the admin's person."""
    return (
        f"The gpulab account '{name}' is kept for another account of {where}, the one "
        "its admin named, so yours cannot use it. Ask a gpulab admin to give your account "
        f"another name at {where}, or, if '{name}' should be yours, to name your account "
        "in GPULAB_ADMIN_IDENTITY."
    )


def no_identity_words(where: str) -> str:
    return (
        f"You signed in at {where}, but it did not say which of its accounts you are "
        "(gpulab keeps each account for one of them), so this gpulab does not let you "
        "in. Ask a gpulab admin to check the login settings (docs/authentication.md)."
    )


def shown(identity: tuple[str, str]) -> str:
    """An identity as the hub's log names it: ``oidc <issuer> <sub>``."""
    return f"{identity[0]} {identity[1]}"


class IdentityUnavailable(Exception):
    """The hub's database cannot be used for login identities now (the log's words): a
    login is refused rather than let in unchecked."""


class IdentityStore:
    """Each account's provider identity, one row a bound account in the table
    ``gpulab_login_identities`` of the hub's database (db/tables.py). Blocking (the
    records pool). A database the hub cannot use raises :attr:`Error`, so a login is
    refused, never let in without its check."""

    Error = IdentityUnavailable

    def __init__(self, db_url: str, log=None):
        self.url = db_url
        self.log = log

    def _tx(self, writing: bool = False):
        return db_engine.guarded(self.url, "The login identities", IdentityUnavailable, writing)

    @staticmethod
    def _held(conn, name: str, lock: bool = False) -> tuple[str, str] | None:
        t = tables.login_identities
        q = sa.select(t.c.provider, t.c.subject).where(t.c.name == name)
        row = conn.execute(q.with_for_update() if lock else q).first()
        return (row[0], row[1]) if row else None

    def claim(self, name: str, identity: tuple[str, str], pinned: str = "") -> str:
        """Bind ``name`` to ``identity`` at its first login; what happened: "bound",
        "same", or "taken" (another identity holds the name: refuse the login).
        ``pinned``: the id the admin set for this name (GPULAB_ADMIN_IDENTITY), which
        wins over any recorded one. Two first logins of one name at once: one binds it,
        the other finds it bound (its insert refused by the primary key, it reads again)."""
        t = tables.login_identities
        for last in (False, True):
            try:
                with self._tx(writing=True) as conn:
                    held = self._held(conn, name, lock=True)
                    expected = (identity[0], pinned) if pinned else held
                    if expected is not None and expected != identity:
                        return "taken"
                    if held == identity:
                        return "same"
                    conn.execute(sa.delete(t).where(t.c.name == name))
                    conn.execute(
                        sa.insert(t).values(
                            name=name, provider=identity[0], subject=identity[1], since=time.time()
                        )
                    )
                    return "bound"
            except IdentityUnavailable as e:
                if last or not isinstance(e.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")

    def bound(self, name: str) -> tuple[str, str] | None:
        with self._tx() as conn:
            return self._held(conn, name)

    def forget(self, name: str) -> None:
        """Drop a deleted account's binding: its name is free for a new account."""
        t = tables.login_identities
        with self._tx(writing=True) as conn:
            conn.execute(sa.delete(t).where(t.c.name == name))


class BoundLogin(Authenticator):
    """The lab's own logins, each account bound to one identity of the provider (see
    the module). Mixed in before gpulab's own part of the authenticator (auth.py)."""

    identities_db_url = Unicode(
        "",
        config=True,
        help="""The database holding each account's provider identity (its first
        login's): the hub's own, ``JupyterHub.db_url``. Set by gpulab's hub wiring
        (hubconfig.py), not by admins. Default: empty (set by the wiring).
        Example: ``c.BoundLogin.identities_db_url = "sqlite:////srv/gpulab/hub/jupyterhub.sqlite"``""",
    )
    admin_identity = Unicode(
        "",
        config=True,
        help="""The provider's id of the person who is the admin (``admin_users``): the
        OpenID Connect ``sub``, the LDAP entry's ``entryUUID=...`` (or ``objectGUID=...``,
        ``dn=...``), the GitHub numeric user id. The admin's name is then that person's
        only, even before their first login. Default: empty (the name is bound to
        whoever first signs in with it, as every name). Set by GPULAB_ADMIN_IDENTITY.
        Example: ``c.BoundLogin.admin_identity = "0b9a54c2-6c1e-4d1c-9f5e-2d1f0e7c4a11"``""",
    )

    login_where = "your organisation's login"  # how refusals name the provider
    names_unique_ignoring_case = False  # GitHub: its logins are

    def login_identity(self, model: dict) -> tuple[str, str] | None:
        """The provider's stable identity of the person in the authenticator's ``model``
        (namespace, id); None where it sent none."""
        raise NotImplementedError

    def provider_name(self, model: dict) -> str:
        """The name as the provider sent it, before JupyterHub lower-cases it."""
        return str(model.get("name", ""))

    def refuse(self, words: str):
        return web.HTTPError(403, "%s", words)

    async def authenticate(self, handler, data):
        model = await maybe_future(super().authenticate(handler, data))
        if not isinstance(model, dict):
            return model
        raw = self.provider_name(model)
        words = name_refusal(raw, self.login_where, self.names_unique_ignoring_case)
        if words:
            self.log.warning("gpulab: refused the login of %r: not a canonical name", raw)
            raise self.refuse(words)
        identity = self.login_identity(model)
        if not identity or not all(identity):
            self.log.warning("gpulab: refused the login of %r: the provider sent no id", raw)
            raise self.refuse(no_identity_words(self.login_where))
        model["auth_state"] = {**(model.get("auth_state") or {}), STATE_KEY: list(identity)}
        return model

    async def check_allowed(self, username, auth_model):
        """The admin, too, must be allowed like everyone else (in an allowed group),
        unless this login is the person GPULAB_ADMIN_IDENTITY names: oauthenticator lets
        admin_users in whatever their groups, so whoever first signed in with the
        admin's name at a provider anyone can join would have been the admin."""
        if isinstance(auth_model, dict) and username in self.admin_users:
            identity = (auth_model.get("auth_state") or {}).get(STATE_KEY) or ()
            if self.admin_identity and len(identity) == 2 and identity[1] == self.admin_identity:
                return True
            auth_model = {**auth_model, "admin": None}
        return await maybe_future(super().check_allowed(username, auth_model))

    async def get_authenticated_user(self, handler, data):
        """JupyterHub's login; once it let the person in, their name is bound to their
        identity (first login) or refused if another identity holds it."""
        model = await super().get_authenticated_user(handler, data)
        if model is None:
            return None
        name = model["name"]
        identity = tuple((model.get("auth_state") or {}).get(STATE_KEY) or ())
        if len(identity) != 2:  # only authenticate() above makes a login model
            raise self.refuse(no_identity_words(self.login_where))
        pinned = self.admin_identity if name in self.admin_users else ""
        store = IdentityStore(self.identities_db_url, self.log)
        try:
            done = await blocking.run(blocking.RECORDS, store.claim, name, identity, pinned)
        except IdentityUnavailable as e:
            self.log.error("gpulab: refused the login of %r: %s", name, e)
            raise web.HTTPError(
                503, "The hub cannot check who you are right now; try again in a minute."
            ) from e
        if done == "taken":
            try:
                held = await blocking.run(blocking.RECORDS, store.bound, name)
            except IdentityUnavailable:
                held = None
            self.log.warning(
                "gpulab: refused the login of %s as %r: the account is %s's (%s)",
                shown(identity), name, "the admin identity" if pinned else "first login",
                shown((identity[0], pinned)) if pinned else shown(held or ("?", "?")),
            )  # fmt: skip
            words = reserved_words if pinned else taken_words
            raise self.refuse(words(name, self.login_where))
        if done == "bound":
            self.log.info("gpulab: the account %r is bound to %s", name, shown(identity))
        return model


class OIDCIdentity(BoundLogin):
    """OpenID Connect: the issuer and the ``sub`` claim (unique and never reassigned
    within the issuer, OpenID Connect Core 1.0 section 5.7)."""

    def login_identity(self, model):
        user = (model.get("auth_state") or {}).get(self.user_auth_state_key) or {}
        sub = user.get("sub")
        issuer = getattr(self, "oidc_issuer", "") or self.token_url
        return ("oidc " + issuer.rstrip("/"), str(sub)) if sub not in (None, "") else None

    def provider_name(self, model):
        user = (model.get("auth_state") or {}).get(self.user_auth_state_key) or {}
        return str(self.user_info_to_username(user))


class GitHubIdentity(OIDCIdentity):
    """GitHub: the numeric user id (a login can be renamed and taken by someone else)."""

    login_where = "GitHub"
    names_unique_ignoring_case = True

    def login_identity(self, model):
        user = (model.get("auth_state") or {}).get(self.user_auth_state_key) or {}
        uid = user.get("id")
        return ("github", str(uid)) if isinstance(uid, int) else None


class LDAPIdentity(BoundLogin):
    """LDAP: the entry's ``entryUUID`` (OpenLDAP, 389 DS, FreeIPA) or ``objectGUID``
    (Active Directory), or else its DN, read after the person's own bind."""

    login_where = "your lab's directory"

    def get_user_attributes(self, conn, userdn):
        import ldap3

        attrs = dict(super().get_user_attributes(conn, userdn))
        found = None
        # ldap3 refuses an attribute the server's schema (where it read one) lacks
        schema = getattr(conn.server, "schema", None)
        known = [a for a in LDAP_IDS if schema is None or a in schema.attribute_types]
        if conn.search(userdn, "(objectClass=*)", ldap3.BASE, attributes=known or ["1.1"]):
            entry = conn.entries[0] if len(conn.entries) == 1 else None
            raw = {k.lower(): v for k, v in (entry.entry_raw_attributes if entry else {}).items()}
            for attr in LDAP_IDS:
                value = (raw.get(attr.lower()) or [b""])[0]
                if value:
                    text = value.decode() if attr == "entryUUID" else value.hex()
                    found = f"{attr}={text}"
                    break
            if found is None and entry is not None:
                found = "dn=" + entry.entry_dn.lower()
        attrs[STATE_KEY] = found or "dn=" + userdn.lower()
        return attrs

    def login_identity(self, model):
        found = ((model.get("auth_state") or {}).get("user_attributes") or {}).get(STATE_KEY)
        return ("ldap", found) if found else None

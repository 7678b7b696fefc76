"""Accepting a share, in gpulab's words, and opening the project without a detour.

- JupyterHub's accept page (/hub/accept-share?code=…) is gpulab's template
  ``templates/accept-share.html``: who shares which project (its display name),
  as what and what that lets one do, how long the access lasts, who is signed in
  (with a logout link). :func:`share_terms` gives the template what it says.
- Accepting (``POST /hub/accept-share``) is :class:`AcceptShareHandler`'s, JupyterHub's
  handler with its one synchronous step awaited instead: the record of how long the
  access lasts (linkaccess.py) is written on the records pool, so a record held by
  another process never stops the hub's event loop.
- JupyterHub asks a person, the first time they open someone else's server, to
  let "an application" identify them (its OAuth confirm page). Project servers
  are the hub's own (it starts them, from gpulab's image, with gpulab's
  authorizer), and a person reaches that page only with access to the server
  (JupyterHub checks ``access:servers`` first), so gpulab skips it for project
  servers as JupyterHub does for one's own servers: :class:`HubServerClients` is
  the hub's ``oauth_no_confirm_list``. Services keep JupyterHub's rule (only
  those configured with ``oauth_no_confirm``).
"""

from __future__ import annotations

from pathlib import Path

from jupyterhub import orm
from jupyterhub.handlers.pages import AcceptShareHandler as HubAcceptShareHandler
from tornado import web

from gpulab_hub import blocking
from gpulab_hub.sharing import linkaccess, roles

ROUTE = r"/accept-share"  # JupyterHub's own, under the hub's prefix

# JupyterHub's OAuth client id of a user's server: jupyterhub-user-<name>[-<server>]
# (services' are service-<name>).
SERVER_CLIENT_PREFIX = "jupyterhub-user-"


class HubServerClients(set):
    """JupyterHub's ``oauth_no_confirm_list`` (a set it adds services to): every
    project server's OAuth client, and the services configured ``oauth_no_confirm``."""

    def __contains__(self, client_id) -> bool:
        if isinstance(client_id, str) and client_id.startswith(SERVER_CLIENT_PREFIX):
            return True
        return super().__contains__(client_id) or client_id in _configured_no_confirm()


def _configured_no_confirm() -> set[str]:
    """The services of the hub's configuration that skip the confirm page (JupyterHub
    builds this set itself; gpulab's replaces it)."""
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        return set()
    services = getattr(JupyterHub.instance(), "_service_map", {}) or {}
    return {s.oauth_client_id for s in services.values() if s.oauth_no_confirm}


def share_terms(user):
    """``c.JupyterHub.template_vars`` entry: for the page's user, a function of a share
    code giving what the accept page says of it (None: no such link, or expired).
    A coroutine (JupyterHub's templates await what they call): the record is read on
    the records pool, the database here."""

    async def terms(code: str) -> dict | None:
        from jupyterhub import orm

        if user is None or not isinstance(code, str) or not code:
            return None
        share_code = orm.ShareCode.find(user.db, code=code)
        if share_code is None:
            return None
        spawner = share_code.spawner
        role = roles.role_of(share_code.scopes)
        store = linkaccess.hub_store()
        if store is None:
            lasts = linkaccess.REVOKED
        else:
            key = linkaccess.code_key(share_code)
            records = await blocking.run(blocking.RECORDS, store.snapshot)
            lasts = linkaccess.lasts_in(records, key)
        return {
            "owner": share_code.owner.name,
            "project": spawner.name,
            "title": spawner.display_name or spawner.name,
            "role": role,
            "role_words": roles.ROLE_WORDS.get(role, ""),
            "lasts": lasts,
            "expires_at": linkaccess.iso(share_code.expires_at) + "Z",
        }

    return terms


class AcceptShareHandler(HubAcceptShareHandler):
    """JupyterHub 6.1's accept page (its GET as it is); the POST JupyterHub's, with the
    exchange and its record awaited (:func:`linkaccess.accept_async`)."""

    @web.authenticated
    async def post(self):
        code = self.get_argument("code")
        share_code = orm.ShareCode.find(self.db, code=code)
        if share_code is None:
            raise web.HTTPError(400, "Invalid share code: the link is unknown or has expired.")
        if share_code.owner == self.current_user.orm_user:
            raise web.HTTPError(400, "You can't share with yourself!")
        share = await linkaccess.accept_async(share_code, self.current_user.orm_user)
        owner = self._user_from_orm(share.owner)
        self.redirect(self._get_next_url(owner, share.spawner))


def hub_handlers() -> list[tuple[str, type]]:
    """The route, for the authenticator's list (before JupyterHub's own)."""
    return [(ROUTE, AcceptShareHandler)]


def configure(c, hub_dir: str | Path, revoke_within_s: int) -> None:
    """In the hub's configuration (settings.py): links' access ends with them
    (linkaccess.py), the accept page's words, no OAuth confirm page for projects."""
    linkaccess.install(hub_dir, revoke_within_s)
    c.JupyterHub.tornado_settings.update({"oauth_no_confirm_list": HubServerClients()})
    given = c.JupyterHub.template_vars if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {**dict(given), "gpulab_share_terms": share_terms}

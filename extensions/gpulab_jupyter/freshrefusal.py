"""A person refused with an old answer from the hub is asked about again.

A project server keeps the hub's answer on each token for ``HubOAuth.cache_max_age``
seconds (gpulab: 30), so a revoked share stops working within that time. The same
cache also kept a *refusal*: someone whose access was revoked and who then accepted a
new link (or was shared with again) was still told "alice stopped sharing this
project with you" until the old answer expired.

:class:`FreshRefusal` (mixed into JupyterHub's identity provider, where gpulab's
authorizer runs: app.py) asks the hub again, bypassing the cache, before it refuses
someone, at most once every ``ASK_AGAIN_S`` seconds per token, and keeps the fresh
answer in the cache. An access that was granted again works on the next request; a
revoked one stays refused (the fresh answer says so too). The request that asked is
answered with the fresh answer too: JupyterHub keeps its first answer on the request.

A page load (a browser's top-level navigation: the project opened after accepting a
link, from the home page, a reload) is asked about on its own allowance,
``NAVIGATION_AGAIN_S``: the requests a tab still open on the project keeps making
(JupyterLab's polls, refused since the revoke) used up the token's allowance, so the
page that followed the accept, within ``ASK_AGAIN_S`` of such a poll, was refused on
the answer from before the accept.
"""

from __future__ import annotations

import hashlib
import time

ASK_AGAIN_S = 2.0
# A page load's own allowance (a person's clicks and reloads, never a tab's polls).
NAVIGATION_AGAIN_S = 0.25
MAX_TOKENS_KEPT = 4096


def is_navigation(request) -> bool:
    """Whether ``request`` (a tornado request) is a browser's page load: a GET its
    browser says is a top-level navigation (``Sec-Fetch-Mode: navigate``, ``Sec-Fetch-Dest:
    document``). A browser that sends no Sec-Fetch headers never gets the page load's
    allowance: its requests keep the token's."""
    headers = getattr(request, "headers", None)
    if headers is None:
        return False
    return (
        getattr(request, "method", "") == "GET"
        and headers.get("Sec-Fetch-Mode", "") == "navigate"
        and headers.get("Sec-Fetch-Dest", "") == "document"
    )


def token_cache_key(session_id: str, token: str) -> str:
    """HubAuth.user_for_token's own cache key for ``token`` (JupyterHub 5)."""
    digest = hashlib.sha256(token.encode("utf8", "replace")).hexdigest()
    return f"token:{session_id}:{digest}"


class FreshRefusal:
    """Mixin for ``jupyterhub.singleuser.extension.JupyterHubIdentityProvider``."""

    _gpulab_asked: dict[str, float] | None = None

    async def get_user(self, handler):
        user = await super().get_user(handler)
        if user is not None or hasattr(handler, "_jupyterhub_user"):
            return user  # allowed, or not logged in at all (JupyterHub's login follows)
        hub_auth = self.hub_auth
        token = hub_auth.get_token(handler)
        session_id = hub_auth.get_session_id(handler)
        key = token_cache_key(session_id, token) if token else ""
        if is_navigation(handler.request):
            allowed = token and self._may_ask_again(f"{key}:page", NAVIGATION_AGAIN_S)
        else:
            allowed = token and self._may_ask_again(key, ASK_AGAIN_S)
        if not allowed:
            return None
        fresh = await hub_auth.user_for_token(
            token, use_cache=False, session_id=session_id, sync=False
        )
        hub_auth.cache[key] = fresh
        if not fresh or not hub_auth.check_scopes(hub_auth.access_scopes, fresh):
            return None
        # JupyterHub set a refusal on this request (handler.redirect raises 403) and
        # keeps its first answer on the request (HubAuth's ``_cached_hub_user``): the
        # fresh answer lets the person in, so ask again with it, this request included.
        # (Before, only the next request got in: the page opened by accepting a new
        # link said "alice stopped sharing this project with you".)
        handler.__dict__.pop("redirect", None)
        handler.__dict__.pop("_cached_hub_user", None)
        return await super().get_user(handler)

    def _may_ask_again(self, key: str, every_s: float) -> bool:
        if self._gpulab_asked is None:
            self._gpulab_asked = {}
        asked = self._gpulab_asked
        now = time.monotonic()
        if now - asked.get(key, -every_s) < every_s:
            return False
        if len(asked) >= MAX_TOKENS_KEPT:
            for old in [k for k, t in asked.items() if now - t >= ASK_AGAIN_S]:
                del asked[old]
            if len(asked) >= MAX_TOKENS_KEPT:
                return False
        asked[key] = now
        return True

"""The project server asks the hub again before it refuses someone on a cached answer
(gpulab_jupyter/freshrefusal.py), with the identity provider's real mixin over a stand-in
for JupyterHub's HubAuth: a tab still polling since a revoke does not make the page
load after accepting a new link refused on the answer from before the accept."""

from __future__ import annotations

import asyncio
import types

from gpulab_jupyter.freshrefusal import FreshRefusal, is_navigation, token_cache_key

TOKEN, SESSION = "tok", "sess"
NAVIGATE = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
POLL = {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}


class Hub:
    """HubAuth's part FreshRefusal uses: the token's cached answer and the hub's."""

    access_scopes = {"access:servers!server=alice/p"}

    def __init__(self):
        self.shared = False  # whether bob reaches alice's project now
        self.cache: dict = {}
        self.asked = 0

    def answer(self):
        return {"name": "bob", "scopes": sorted(self.access_scopes) if self.shared else []}

    def get_token(self, handler):
        return TOKEN

    def get_session_id(self, handler):
        return SESSION

    async def user_for_token(self, token, use_cache, session_id, sync):
        assert not use_cache
        self.asked += 1
        return self.answer()

    def check_scopes(self, needed, model):
        return set(needed) & set(model["scopes"])


class Provider:
    """JupyterHub's identity provider as FreshRefusal sees it: the cached answer, kept on
    the request once read (HubAuth's ``_cached_hub_user``)."""

    def __init__(self, hub):
        self.hub_auth = hub

    async def get_user(self, handler):
        if not hasattr(handler, "_cached_hub_user"):
            handler._cached_hub_user = self.hub_auth.cache.get(token_cache_key(SESSION, TOKEN))
        model = handler._cached_hub_user
        if model and self.hub_auth.check_scopes(self.hub_auth.access_scopes, model):
            return model["name"]
        return None


class Gpulab(FreshRefusal, Provider):
    pass


def request(headers, method="GET"):
    return types.SimpleNamespace(request=types.SimpleNamespace(method=method, headers=headers))


def test_the_page_after_accepting_gets_in_while_an_old_tab_polls():
    hub = Hub()
    provider = Gpulab(hub)
    hub.cache[token_cache_key(SESSION, TOKEN)] = hub.answer()  # refused since the revoke

    async def visit(headers):
        return await provider.get_user(request(headers))

    async def scenario():
        assert await visit(POLL) is None  # the old tab's poll: asked afresh, still refused
        asked = hub.asked
        hub.shared = True  # bob accepts the new link
        assert await visit(NAVIGATE) == "bob"  # the project opens, not "stopped sharing"
        assert hub.asked == asked + 1
        assert await visit(POLL) == "bob"  # the fresh answer is kept for the rest

    asyncio.run(scenario())


def test_refused_requests_still_ask_the_hub_at_most_so_often():
    hub = Hub()
    provider = Gpulab(hub)
    hub.cache[token_cache_key(SESSION, TOKEN)] = hub.answer()

    async def scenario():
        for _ in range(20):
            assert await provider.get_user(request(POLL)) is None
            assert await provider.get_user(request(NAVIGATE)) is None
        return hub.asked

    assert asyncio.run(scenario()) == 2  # one poll, one page load: within their allowances


def test_only_a_browsers_page_load_is_a_navigation():
    assert is_navigation(request(NAVIGATE).request)
    assert not is_navigation(request(NAVIGATE, "POST").request)
    assert not is_navigation(request(POLL).request)
    assert not is_navigation(request({}).request)  # no Sec-Fetch headers: a script
    assert not is_navigation(None)

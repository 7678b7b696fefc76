"""The project server's authorizer: its decision table, scope checks, share lookup,
the guard of routes that never ask it, and the read-only filter of RTC messages."""

from __future__ import annotations

import asyncio

import pycrdt
import pytest
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web

from gpulab_jupyter import authorizer, collab, freshrefusal
from gpulab_jupyter.authorizer import EXECUTE, READ, WRITE, grants, needed_scope

OWNER, PROJECT = "alice", "one"
SERVER = f"server={OWNER}/{PROJECT}"


@pytest.mark.parametrize(
    ("action", "resource", "needed"),
    [
        # what a viewer needs to open and read
        ("read", "contents", READ),
        ("read", "kernelspecs", READ),
        ("read", "kernels", READ),
        ("read", "sessions", READ),
        ("read", "terminals", READ),
        ("read", "api", READ),
        ("read", "nbconvert", READ),
        # file writes
        ("write", "contents", WRITE),
        ("write", "csp", WRITE),
        # running code, and everything else that is not a read
        ("write", "kernels", EXECUTE),  # POST /api/kernels starts a kernel
        ("write", "sessions", EXECUTE),
        ("write", "terminals", EXECUTE),
        ("write", "kernelspecs", EXECUTE),
        ("write", "nbconvert", EXECUTE),
        ("write", "config", EXECUTE),
        ("write", "server", EXECUTE),  # shutdown
        ("write", "unknown", EXECUTE),  # settings, workspaces, extension manager
        ("execute", "kernels", EXECUTE),  # the kernel websocket
        ("execute", "terminals", EXECUTE),
        ("execute", "events", EXECUTE),
        ("execute", "lsp", EXECUTE),
        ("execute", "contents", EXECUTE),
        # jupyter-server-proxy (TensorBoard, any port): running code, even to read
        ("read", "proxy", EXECUTE),
        ("write", "proxy", EXECUTE),
        ("execute", "proxy", EXECUTE),
        ("delete", "proxy", None),
        # default deny
        ("delete", "contents", None),
        ("", "contents", None),
    ],
)
def test_decision_table(action, resource, needed):
    assert needed_scope(action, resource) == needed


VIEWER = [f"access:servers!{SERVER}", f"{READ}!{SERVER}"]
COLLABORATOR = [f"access:servers!{SERVER}", f"{EXECUTE}!{SERVER}"]


def test_roles_grant_what_they_say():
    assert grants(VIEWER, READ, OWNER, PROJECT)
    assert not grants(VIEWER, WRITE, OWNER, PROJECT)
    assert not grants(VIEWER, EXECUTE, OWNER, PROJECT)
    # Share scopes come unexpanded: execute alone includes write and read.
    for needed in (READ, WRITE, EXECUTE):
        assert grants(COLLABORATOR, needed, OWNER, PROJECT)
    assert grants([f"{WRITE}!{SERVER}"], READ, OWNER, PROJECT)
    assert not grants([f"{WRITE}!{SERVER}"], EXECUTE, OWNER, PROJECT)


def test_scopes_of_other_servers_and_users_grant_nothing():
    assert not grants([f"{EXECUTE}!server={OWNER}/other"], READ, OWNER, PROJECT)
    assert not grants([f"{EXECUTE}!server=bob/{PROJECT}"], READ, OWNER, PROJECT)
    assert not grants([f"{EXECUTE}!user=bob"], READ, OWNER, PROJECT)
    assert not grants([f"access:servers!{SERVER}", "admin:servers"], READ, OWNER, PROJECT)
    # A share of the phase before roles: access, no gpulab scope.
    assert not grants([f"access:servers!{SERVER}"], READ, OWNER, PROJECT)
    # The owner's role (!user=owner) and an admin-granted unfiltered scope do grant.
    assert grants([f"{EXECUTE}!user={OWNER}"], EXECUTE, OWNER, PROJECT)
    assert grants([READ], READ, OWNER, PROJECT)
    assert not grants(COLLABORATOR, "custom:gpulab:admin", OWNER, PROJECT)


def test_share_lookup_by_user_and_group():
    shares = [
        {"user": {"name": "bob"}, "group": None, "scopes": VIEWER},
        {"user": None, "group": {"name": "team"}, "scopes": COLLABORATOR},
    ]
    assert authorizer.shared_scopes(shares, "bob", []) == frozenset(VIEWER)
    assert authorizer.shared_scopes(shares, "carol", ["team"]) == frozenset(COLLABORATOR)
    assert authorizer.shared_scopes(shares, "bob", ["team"]) == frozenset(VIEWER + COLLABORATOR)
    assert authorizer.shared_scopes(shares, "dave", ["other"]) == frozenset()
    assert authorizer.shared_scopes(shares, "dave", None) == frozenset()


class _DocSessionLike(APIHandler):
    pass


def test_only_jupyter_collaborations_document_session_put_counts_as_read():
    _DocSessionLike.__name__ = "DocSessionHandler"
    assert not authorizer.is_document_session(object.__new__(_DocSessionLike), "write")
    _DocSessionLike.__module__ = "jupyter_server_ydoc.handlers"
    handler = object.__new__(_DocSessionLike)
    assert authorizer.is_document_session(handler, "write")
    assert not authorizer.is_document_session(handler, "execute")


class _Unguarded(JupyterHandler):
    @web.authenticated
    def put(self):
        self.finish("saved")

    def delete(self):
        self.finish("gone")


class _Guarded(APIHandler):
    auth_resource = "contents"

    @web.authenticated
    @authorized
    def post(self):
        self.finish("made")


class _NotJupyter(web.RequestHandler):
    def post(self):
        self.finish("x")


def test_guard_routes_wraps_each_write_that_never_asks_the_authorizer():
    app = web.Application([(r"/a", _Unguarded), (r"/b", _Guarded), (r"/c", _NotJupyter)])
    app.add_handlers(r".*$", [(r"/d", _Unguarded)])
    rules = authorizer.all_rules(app)
    assert {rule.target for rule in rules} == {_Unguarded, _Guarded, _NotJupyter}
    original_post = _Guarded.post
    done = authorizer.guard_routes(rules)
    assert done == [
        f"{__name__}._Unguarded.delete",
        f"{__name__}._Unguarded.put",
    ]
    assert authorizer.asks_authorizer(_Unguarded.put)
    assert authorizer.asks_authorizer(_Unguarded.delete)
    assert _Guarded.post is original_post  # already asked: left alone
    assert not authorizer.asks_authorizer(_NotJupyter.post)
    # A second sweep finds nothing left to guard.
    assert authorizer.guard_routes(rules) == []


def _save_message(save_id: int) -> bytes:
    return bytes([collab.RAW, 4]) + b"save" + bytes([save_id])


def test_rtc_messages_a_viewer_may_send():
    doc = pycrdt.Doc()
    doc["source"] = text = pycrdt.Text()
    step1 = pycrdt.create_sync_message(doc)
    assert collab.reader_may_send(step1)
    updates = []
    doc.observe(lambda event: updates.append(event.update))
    text += "changed by a viewer"
    update = pycrdt.create_update_message(updates[-1])
    assert not collab.reader_may_send(update)
    step2 = bytes([collab.SYNC, 1]) + update[2:]
    assert not collab.reader_may_send(step2)
    assert collab.reader_may_send(bytes([collab.AWARENESS, 1, 0]))
    assert not collab.reader_may_send(_save_message(7))
    assert collab.is_save(_save_message(7)) == 7
    assert collab.is_save(step1) is None
    assert not collab.reader_may_send(b"")
    assert not collab.reader_may_send(bytes([125, 0]))  # chat and anything unknown
    assert collab.read_var_uint(bytes([0xAC, 0x02])) == (300, 2)


async def test_someone_who_just_accepted_a_share_gets_in_at_once():
    """The server's listing of its shares was read a moment before bob accepted his: his
    first refusal asks the hub again (not only every 2 s), so the page he lands on
    after accepting opens; his further refusals do not make the hub answer again."""
    auth = authorizer.ProjectAuthorizer()
    auth.owner, auth.server_name = "alice", "one"
    listings = [[], [{"user": {"name": "bob"}, "group": None, "scopes": VIEWER}]]
    asked = []

    async def fetch():
        asked.append(1)
        return listings[min(len(asked) - 1, 1)]

    auth._fetch_shares = fetch
    mallory = {"name": "mallory", "kind": "user", "scopes": []}
    assert not await auth.allows(mallory, "read", "contents")  # listing read: nothing shared
    assert len(asked) == 1
    bob = {"name": "bob", "kind": "user", "scopes": []}
    assert await auth.allows(bob, "read", "contents")  # within 2 s of that listing
    assert len(asked) == 2
    assert not await auth.allows(mallory, "read", "contents")
    assert not await auth.allows(mallory, "write", "contents")
    assert len(asked) == 2  # refused again within 2 s: the hub is not asked again


async def test_the_page_after_accepting_opens_while_an_old_tab_of_theirs_polls():
    """bob was revoked; a tab of his still polls the project, refused, so the listing of
    shares is never 2 s old and his own ask is recent. He accepts a new link: the page
    load that follows asks the hub again and opens (a poll would not)."""
    import types

    auth = authorizer.ProjectAuthorizer()
    auth.owner, auth.server_name = "alice", "one"
    shared = []
    asked = []

    async def fetch():
        asked.append(1)
        return [{"user": {"name": "bob"}, "group": None, "scopes": VIEWER}] if shared else []

    def handler(mode: str, dest: str):
        headers = {"Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest}
        return types.SimpleNamespace(request=types.SimpleNamespace(method="GET", headers=headers))

    auth._fetch_shares = fetch
    bob = {"name": "bob", "kind": "user", "scopes": []}
    poll, page = handler("cors", "empty"), handler("navigate", "document")
    assert not await auth.allows(bob, "read", "contents", poll)  # refused since the revoke
    shared.append(1)  # he accepts the new link
    assert not await auth.allows(bob, "read", "contents", poll)  # a poll: not asked again
    await asyncio.sleep(freshrefusal.NAVIGATION_AGAIN_S + 0.05)
    assert await auth.allows(bob, "read", "contents", page)  # the project opens
    assert len(asked) == 2


async def test_a_refusal_is_in_the_viewers_words_for_a_viewer_only():
    auth = authorizer.ProjectAuthorizer()
    auth.owner, auth.server_name = "alice", "one"

    async def no_shares():
        return []

    auth._fetch_shares = no_shares
    words = (
        "You are a viewer of alice's project one: you can read it, but not change or run "
        "anything here. Save a copy to work on it."
    )
    viewer = {"name": "bob", "kind": "user", "scopes": VIEWER}
    collaborator = {"name": "carol", "kind": "user", "scopes": COLLABORATOR}
    stranger = {"name": "mallory", "kind": "user", "scopes": []}
    assert await auth.refusal(viewer) == words
    assert await auth.refusal(collaborator) == ""
    assert await auth.refusal(stranger) == ""  # no role here: the plain refusal


def test_handlers_that_only_ask_are_never_refused_by_the_authorizer():
    from jupyter_server.services.api.handlers import IdentityHandler

    assert authorizer._asks_only(IdentityHandler.__new__(IdentityHandler))  # /api/me


    class Room(APIHandler):  # what collab.py's room handler says of itself
        gpulab_asks_only = True

    assert authorizer._asks_only(Room.__new__(Room))  # a viewer's room is read-only
    assert not authorizer._asks_only(APIHandler.__new__(APIHandler))


class _ProxyLike(JupyterHandler):
    """Like jupyter-server-proxy's handlers: ``prepare`` only asks for a login."""

    authorizer = None  # the instance's, below

    async def prepare(self):
        self.prepared = True

    def options(self):
        self.finish("proxied")


class _ProxySubclass(_ProxyLike):
    pass


class _Asking:
    def __init__(self, answer: bool):
        self.answer, self.asked = answer, []

    def is_authorized(self, handler, user, action, resource):
        self.asked.append((action, resource))
        return self.answer


async def test_every_request_to_the_proxy_needs_execute_options_included():
    _ProxyLike.__module__ = _ProxySubclass.__module__ = "jupyter_server_proxy.handlers"
    app = web.Application([(r"/tensorboard/(.*)", _ProxySubclass), (r"/proxy/(.*)", _ProxyLike)])
    done = authorizer.guard_routes(authorizer.all_rules(app))
    # prepare runs before every method (OPTIONS and websockets too): guarded once, in
    # the parent class; its subclass inherits it
    assert [n for n in done if n.endswith("prepare")] == [
        "jupyter_server_proxy.handlers._ProxyLike.prepare"
    ]
    assert _ProxySubclass.auth_resource == _ProxyLike.auth_resource == "proxy"
    assert authorizer.guard_routes(authorizer.all_rules(app)) == []
    for answer in (False, True):
        handler = object.__new__(_ProxySubclass)
        handler._finished, handler._current_user = False, {"name": "bob"}
        handler.authorizer = _Asking(answer)
        if answer:
            await handler.prepare()
            assert handler.prepared
        else:
            with pytest.raises(web.HTTPError) as refused:
                await handler.prepare()
            assert refused.value.status_code == 403
        assert handler.authorizer.asked == [("execute", "proxy")]

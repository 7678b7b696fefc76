"""Each visitor's own JupyterLab workspace in a shared project (gpulab_jupyter/workspaces.py):
the names it gives, for the hub's login names and for names it must never take."""

from __future__ import annotations

import re
import types

import pytest

from gpulab_jupyter.workspaces import workspace_of

# What JupyterLab's page route takes as a workspace name (jupyterlab_server/handlers.py).
LAB_ROUTE_NAME = re.compile(r"[a-zA-Z0-9\-\_]+")


def test_the_owner_keeps_the_default_workspace_and_a_visitor_gets_their_own():
    assert workspace_of("alice", "alice") is None
    assert workspace_of("bob", "alice") == "gpulab-bob"
    assert workspace_of("bob.smith@lab", "alice") == "gpulab-bob_2esmith_40lab"


def test_two_names_never_share_a_workspace():
    names = ["a.b", "a_2eb", "a_b", "a-b", "a+b", "a@b", "ab", "a_5f"]
    spaces = [workspace_of(n, "owner") for n in names]
    assert len(set(spaces)) == len(names), spaces
    assert all(LAB_ROUTE_NAME.fullmatch(s) for s in spaces), spaces


@pytest.mark.parametrize(
    "name", ["", "Bob", "../alice", "a/b", "bob\n", "x" * 65, ".bob", "bob smith", "böb"]
)
def test_a_name_outside_the_hubs_gets_no_workspace(name):
    assert workspace_of(name, "alice") is None


class Page:
    """What JupyterLab's page handler gives the redirect: who asks, for which address."""

    def __init__(self, who: str | None, path: str, query: str = ""):
        self.current_user = types.SimpleNamespace(username=who) if who else None
        self.base_url = "/user/alice/p/"
        self.request = types.SimpleNamespace(path=path, query=query)
        self.redirected: str | None = None

    def redirect(self, url: str) -> None:
        self.redirected = url


def lab_get(self, mode=None, workspace=None, tree=None):
    return ("page", mode, workspace, tree)


@pytest.mark.parametrize(
    "who, path, query, mode, workspace, tree, sent_to",
    [
        ("bob", "/user/alice/p/lab", "", "lab", None, None,
         "/user/alice/p/lab/workspaces/gpulab-bob"),
        ("bob", "/user/alice/p/lab/tree/a%20b/n.ipynb", "reset", "lab", None, "/tree/a b/n.ipynb",
         "/user/alice/p/lab/workspaces/gpulab-bob/tree/a%20b/n.ipynb?reset"),
        ("bob", "/user/alice/p/doc/tree/n.ipynb", "", "doc", None, "/tree/n.ipynb",
         "/user/alice/p/doc/workspaces/gpulab-bob/tree/n.ipynb"),
        ("bob", "/user/alice/p/lab/workspaces/mine", "", "lab", "/workspaces/mine", None, None),
        ("alice", "/user/alice/p/lab", "", "lab", None, None, None),
        (None, "/user/alice/p/lab", "", "lab", None, None, None),  # JupyterHub's login
    ],
)  # fmt: skip
def test_a_visitor_is_sent_to_their_own_workspace(who, path, query, mode, workspace, tree, sent_to):
    from gpulab_jupyter.workspaces import _own_layout

    page = Page(who, path, query)
    answer = _own_layout(lab_get, "alice")(page, mode=mode, workspace=workspace, tree=tree)
    assert page.redirected == sent_to
    assert (answer is None) == (sent_to is not None)

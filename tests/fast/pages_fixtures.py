"""Fixtures of the fast lane's page tests: gpulab's hub in-process (pagehub.py).

Test modules import them by name (tests/fast has no conftest.py of its own: the suite's
modules import ``conftest`` as tests/conftest.py)."""

from __future__ import annotations

import pytest
import pytest_asyncio
from pagehub import page_hub

# The people of the page tests, by role (tests/security/hub_routes.py's roles).
PEOPLE = {
    "anonymous": None,
    "other": "bob",
    "viewer": "carol",
    "collaborator": "dave",
    "owner": "alice",
    "admin": "admin",
}
OWNER, PROJECT, TITLE = "alice", "vision", "Vision lab"


@pytest.fixture
async def pages(tmp_path):
    """gpulab's hub as a MockHub of its own configuration, serving on 127.0.0.1:
    no project, no share, nobody logged in yet."""
    hub = await page_hub(tmp_path / "gpulab")
    yield hub
    await hub.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_pages(tmp_path_factory):
    """One in-process hub for a module whose tests only read: alice's stopped project
    "vision" (display name "Vision lab") shared with carol as a viewer and dave as a
    collaborator; bob another user; admin the hub's admin."""
    hub = await page_hub(tmp_path_factory.mktemp("gpulab-pages"))
    await hub.project(OWNER, PROJECT, TITLE)
    await hub.share(OWNER, PROJECT, PEOPLE["viewer"], "viewer")
    await hub.share(OWNER, PROJECT, PEOPLE["collaborator"], "collaborator")
    hub.user(PEOPLE["other"])
    yield hub
    await hub.stop()

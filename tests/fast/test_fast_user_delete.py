"""Deleting a user only when meant (admin/userdelete.py), on the hub in-process
(pagehub.py): JupyterHub's REST API (what its admin page's one-click Delete user sends)
refuses unless the request names the user again, and gpulab's admin overview asks for
the user's name and deletes nothing on a name typed wrong. The deletions themselves
(they need the Docker engine) and JupyterHub's own admin page in Chromium:
tests/test_browser_admin.py."""

from __future__ import annotations

import html
import json
import re

from pagehub import ADMIN
from pages_fixtures import OWNER, PROJECT, TITLE

pytest_plugins = ("pages_fixtures",)  # the in-process hub's fixtures

PAGE = "/hub/gpulab/admin"


def said(text: str) -> str:
    m = re.search(r'id="admin-said">([^<]*)<', text)
    return html.unescape(m.group(1)) if m else ""


async def test_the_api_deletes_a_user_only_when_the_request_names_them_again(pages):
    await pages.project("bob", "scratch")
    token = pages.user(ADMIN, admin=True).new_api_token()
    auth = {"Authorization": f"token {token}"}
    # JupyterHub's admin page sends this on one click of Delete user (with its cookie).
    clicked = await pages.fetch("/hub/api/users/bob", None, method="DELETE", headers=auth)
    assert clicked.code == 400, clicked.body
    message = json.loads(clicked.body)["message"]
    assert "removes the account and all of their projects" in message
    assert "/hub/gpulab/admin" in message and "?confirm=bob" in message
    assert (await pages.get("/hub/api/users/bob", None, headers=auth)).code == 200
    assert (pages.home / "projects" / "bob" / "scratch").is_dir()
    wrong = await pages.fetch(
        "/hub/api/users/bob?confirm=alice", None, method="DELETE", headers=auth
    )
    assert wrong.code == 400
    assert (await pages.get("/hub/api/users/bob", None, headers=auth)).code == 200
    # (with ?confirm=bob it deletes: that needs the Docker engine, test_browser_admin.py)


async def test_the_admin_overview_deletes_a_user_once_their_name_is_typed(pages):
    await pages.project(OWNER, PROJECT, TITLE)
    page = await pages.get(PAGE, ADMIN)
    row = re.search(rf'<tr class="admin-user" data-user="{OWNER}">.*?</tr>', page.body, re.S)
    assert row and 'data-action="delete-user"' in row.group(0)
    mine = re.search(rf'<tr class="admin-user" data-user="{ADMIN}">.*?</tr>', page.body, re.S)
    assert mine and 'data-action="delete-user"' not in mine.group(0)

    asked = await pages.post_form(PAGE, ADMIN, {"action": "delete-user", "name": OWNER})
    assert asked.code == 200
    assert f"Delete the user {OWNER} and all their projects?" in asked.text
    assert f"Their 1 project ({PROJECT})" in asked.text
    assert (pages.home / "projects" / OWNER / PROJECT).is_dir()  # nothing deleted yet
    fields = {"action": "delete-user", "name": OWNER}
    mistyped = await pages.post_form(PAGE, ADMIN, {**fields, "confirm_name": "alic"})
    assert "That is not the user's name: nothing was deleted." in mistyped.text
    assert (pages.home / "projects" / OWNER / PROJECT).is_dir()
    # (their name typed, the user is deleted: that needs the Docker engine,
    # test_browser_admin.py)
    mine = await pages.post_form(PAGE, ADMIN, {"action": "delete-user", "name": ADMIN})
    assert said(mine.body) == "You cannot delete your own account."

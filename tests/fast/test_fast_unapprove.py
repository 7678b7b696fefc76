"""Unapproving an account ends what it had open (issue 32), on the hub in-process
(pagehub.py): the admin presses Unauthorize on /hub/authorize; the person's browser
session (its login cookie), an API token they made and an OAuth token (what a project
server's login cookie holds) are refused at once, and a start with the token is
refused. Approved again, they log in and work as before. Running projects stopped,
folders kept: tests/security/test_accounts.py (a real project)."""

from __future__ import annotations

import html
import re

from jupyterhub import orm

pytest_plugins = ("pages_fixtures",)  # the in-process hub's fixtures

NAME, PASSWORD = "uriel", "a long passphrase for uriel 7"


async def press(pages, name: str, action: str):
    """The admin's Authorize / Unauthorize button on /hub/authorize (a POST with the
    page's XSRF token)."""
    page = await pages.get("/hub/authorize", "admin")
    assert page.code == 200, page.text[:300]
    xsrf = html.unescape(re.search(r'name="_xsrf" value="([^"]+)"', page.body).group(1))
    cookie = re.search(r"_xsrf=([^;]+)", page.headers.get("Set-Cookie", ""))
    jar = pages.cookies("admin") + (f"; _xsrf={cookie.group(1)}" if cookie else "")
    return await pages.fetch(
        f"/hub/authorize/{name}",
        None,
        method="POST",
        headers={"Cookie": jar},
        body=f"_xsrf={xsrf}&action={action}",
    )


def with_token(token: str) -> dict:
    return {"headers": {"Authorization": f"token {token}"}}


async def test_unapproving_an_account_ends_its_session_and_tokens_at_once(pages):
    assert pages.app.authenticator.create_user(NAME, PASSWORD) is not None
    assert (await press(pages, NAME, "authorize")).code == 303
    user = pages.user(NAME).orm_user
    token = user.new_api_token(note="laptop")
    client = pages.db.query(orm.OAuthClient).filter_by(identifier="jupyterhub").one()
    oauth = user.new_api_token(note="a project's login", oauth_client=client)
    pages.cookies(NAME)  # the browser logged in before the admin acts
    assert (await pages.get("/hub/home", NAME)).code == 200
    for t in (token, oauth):
        me = await pages.get("/hub/api/user", None, **with_token(t))
        assert me.code == 200 and f'"name": "{NAME}"' in me.body.replace('":"', '": "')

    assert (await press(pages, NAME, "unauthorize")).code == 303
    home = await pages.get("/hub/home", NAME)  # the same login cookie as before
    assert home.code == 302 and "/hub/login" in home.location, (home.code, home.location)
    for t in (token, oauth):
        assert (await pages.get("/hub/api/user", None, **with_token(t))).code == 403
    start = await pages.fetch(
        f"/hub/api/users/{NAME}/servers/work", None, method="POST", body="{}", **with_token(token)
    )
    assert start.code == 403, start.body[:300]
    assert pages.db.query(orm.APIToken).filter_by(user_id=user.id).count() == 0
    # The account and its hub user are kept: approved again, a new login works.
    assert (await press(pages, NAME, "authorize")).code == 303
    pages._cookies.pop(NAME)  # a new login: JupyterHub's cookie of the account's new id
    assert (await pages.get("/hub/home", NAME)).code == 200

"""The hub's login and sign-up forms are taken from the hub's own pages only (issue 32),
on the hub in-process (pagehub.py): a browser says a form came from a page of another
origin (``Sec-Fetch-Site: same-site``, a page on a user's subdomain; ``cross-site``)
and the hub refuses it with a sentence, even with a valid XSRF token and the right
password; its own pages (``same-origin``) and clients that are no browser (no header)
sign in as before. A page on a user's subdomain planting the cookies and posting the
form in Chromium: tests/test_tls_caddy.py."""

from __future__ import annotations

import html
import re
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from nativeauthenticator.orm import UserInfo
from pagehub import page_hub

from gpulab_hub.accounts import crosssite

pytestmark = pytest.mark.asyncio(loop_scope="module")
NAME, PASSWORD = "rhea", "a long passphrase for rhea 7"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pages(tmp_path_factory):
    """gpulab's hub in-process, its own accounts (one hub for the module)."""
    hub = await page_hub(tmp_path_factory.mktemp("gpulab-form-origin"))
    yield hub
    await hub.stop()


async def send(pages, path: str, fields: dict, site: str | None):
    """The form of ``path`` as a signed-out browser sends it: the page first (its XSRF
    cookie and token), then the form, saying ``Sec-Fetch-Site: site`` (None: no header)."""
    page = await pages.get(path)
    assert page.code == 200, page.text[:300]
    xsrf = html.unescape(re.search(r'name="_xsrf" value="([^"]+)"', page.body).group(1))
    cookie = SimpleCookie(page.headers.get("Set-Cookie", ""))["_xsrf"].value
    headers = {"Cookie": f"_xsrf={cookie}"}
    if site is not None:
        headers["Sec-Fetch-Site"] = site
    return await pages.fetch(
        path, None, method="POST", headers=headers, body=urlencode({**fields, "_xsrf": xsrf})
    )


def login_cookie(page) -> bool:
    return "jupyterhub-hub-login=" in page.headers.get("Set-Cookie", "")


async def test_a_login_form_from_another_origin_is_refused_with_a_sentence(pages):
    assert pages.app.authenticator.create_user(NAME, PASSWORD) is not None
    UserInfo.find(pages.db, NAME).is_authorized = True
    pages.db.commit()
    form = {"username": NAME, "password": PASSWORD}
    for site in ("same-site", "cross-site"):
        page = await send(pages, "/hub/login", form, site)
        assert page.code == 403 and not login_cookie(page), (site, page.code)
        assert crosssite.REFUSED in page.text, page.text[:1000]
    # the hub's own login page, and a client that is no browser: signed in
    for site in ("same-origin", None):
        page = await send(pages, "/hub/login", form, site)
        assert page.code == 302 and login_cookie(page), (site, page.code, page.text[:300])
    # a form whose XSRF token is not the cookie's is the login page with its words too
    page = await pages.fetch("/hub/login", None, method="POST", body=urlencode(form))
    assert page.code == 403 and "Login form invalid or expired. Try again." in page.text


async def test_a_signup_form_from_another_origin_makes_no_account(pages):
    form = {"username": "mallorysock", "signup_password": PASSWORD}
    form["signup_password_confirmation"] = PASSWORD
    page = await send(pages, "/hub/signup", form, "same-site")
    assert page.code == 403 and crosssite.REFUSED in page.text, page.text[:1000]
    assert UserInfo.find(pages.db, "mallorysock") is None
    page = await send(pages, "/hub/signup", form, "same-origin")
    assert page.code == 200 and UserInfo.find(pages.db, "mallorysock") is not None

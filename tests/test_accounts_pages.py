"""The account pages in Chromium, as new people and a new admin meet them (issue 24):

- sign-up shows the password rules before anyone submits; a refused sign-up keeps the
  username and says which rule it broke (a taken name, a weak password, passwords that
  differ), never "Something went wrong";
- an admin sees "Sign-ups waiting (N)" in the nav bar and on the Admin page, which lead
  to the approval page; the admin's own row offers no Unauthorize, and the hub refuses
  the POST with a sentence;
- the Admin page shows each user's projects, no "default server" row with a Start
  button that always fails;
- the login page speaks of gpulab, shows gpulab's logo, and over plain HTTP from
  another host warns in gpulab's words, pointing to the HTTPS docs.
"""

from __future__ import annotations

import re
import time

import pytest
from browser_kit import CHROMIUM, CHROMIUM_ARGS, SHOTS, jupyterhub_admin
from hubclient import HubUser
from playwright.sync_api import Page, expect
from security.people import log_in_admin, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

NEWBIE = "acctnewbie"
WAITING = "acctwaiting"
WITH_PROJECT, WITHOUT_PROJECT = "acctpwith", "acctpnone"
GOOD_PASSWORD = "three unrelated words-7"


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    p = context.new_page()
    yield p
    context.close()


def log_in(page: Page, base: str, name: str, password: str) -> None:
    page.goto(f"{base}/hub/login")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign In").click()
    expect(page).to_have_url(re.compile(r"/hub/home"))


def sign_up(page: Page, name: str, password: str, confirmation: str | None = None) -> None:
    page.get_by_label("Username").fill(name)
    page.locator("#password_input").fill(password)
    page.locator("#password_confirmation_input").fill(
        password if confirmation is None else confirmation
    )
    page.get_by_role("button", name="Create User").click()


def waiting_in_nav(page: Page) -> int:
    """The number the nav bar's "Sign-ups waiting (N)" shows; 0 where it says "Accounts"."""
    link = page.locator("[data-gpulab=nav-signups]")
    expect(link).to_be_visible()
    m = re.fullmatch(r"Sign-ups waiting \((\d+)\)", link.inner_text().strip())
    if m is None:
        expect(link).to_have_text("Accounts")
        return 0
    return int(m.group(1))


def test_sign_up_shows_the_rules_keeps_the_name_and_says_what_was_wrong(hub, page):
    base = hub.url
    page.goto(f"{base}/hub/signup")
    # The rules, from the hub's settings, before anyone submits.
    rules = page.locator("#password-rules")
    expect(rules).to_contain_text("at least 10 characters")
    expect(rules).to_contain_text("not one of the 10,000 most common passwords")
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / "accounts-signup-rules.png")

    # A common password: said so, the username kept, the rules still shown.
    sign_up(page, NEWBIE, "qwertyuiop")
    result = page.locator("#signup-result")
    expect(result).to_contain_text("one of the most common passwords")
    expect(page.get_by_label("Username")).to_have_value(NEWBIE)
    expect(page.locator("#password-rules")).to_contain_text("at least 10 characters")
    page.screenshot(path=SHOTS / "accounts-signup-common.png")

    # Passwords that differ.
    sign_up(page, NEWBIE, GOOD_PASSWORD, GOOD_PASSWORD + "x")
    expect(result).to_contain_text("The two passwords differ")
    expect(page.get_by_label("Username")).to_have_value(NEWBIE)

    # Too short: the browser itself stops it (the rule is on the field) ...
    page.get_by_label("Username").fill(NEWBIE)
    page.locator("#password_input").press_sequentially("short")
    page.locator("#password_confirmation_input").press_sequentially("short")
    page.get_by_role("button", name="Create User").click()
    assert page.locator("#password_input").evaluate("e => e.validity.tooShort")
    # ... and the hub says the same where the browser does not check.
    page.locator("#password_input").evaluate("e => e.removeAttribute('minlength')")
    sign_up(page, NEWBIE, "short")
    expect(result).to_contain_text("That password is too short (5 characters)")
    expect(result).to_contain_text("at least 10")

    # Right: the account waits for approval. The same name again: taken, said so.
    sign_up(page, NEWBIE, GOOD_PASSWORD)
    expect(result).to_contain_text("Your information has been sent to the admin")
    sign_up(page, NEWBIE, GOOD_PASSWORD)
    expect(result).to_contain_text(f"The username {NEWBIE} is already taken")
    expect(page.get_by_label("Username")).to_have_value(NEWBIE)
    expect(page.get_by_text("Something went wrong")).to_have_count(0)


def test_an_admin_finds_sign_ups_waiting_and_cannot_unapprove_themselves(hub, page):
    base = hub.url
    log_in(page, base, "admin", hub.admin_password)
    before = waiting_in_nav(page)

    HubUser(base, WAITING, GOOD_PASSWORD).signup()
    page.goto(f"{base}/hub/home")
    assert waiting_in_nav(page) == before + 1
    page.screenshot(path=SHOTS / "accounts-nav-signups.png")
    # The Admin page, which lists approved users only, says so and leads there too.
    page.goto(f"{base}/hub/admin")
    expect(page.locator("[data-gpulab=admin-signups]")).to_have_text(
        f"Sign-ups waiting ({before + 1})"
    )

    page.locator("[data-gpulab=nav-signups]").click()
    expect(page).to_have_url(re.compile(r"/hub/authorize$"))
    expect(page.locator("#signups-summary")).to_contain_text("waiting for approval")
    row = page.locator(f"tr[id='{WAITING}']")
    expect(row).to_contain_text("waiting for approval")
    # The admin's own row: marked, and no Unauthorize to lock themselves out with.
    mine = page.locator("tr[id='admin']")
    expect(mine).to_contain_text("admin (you)")
    expect(mine.get_by_role("button", name="Unauthorize")).to_have_count(0)
    page.screenshot(path=SHOTS / "accounts-authorize.png")

    row.get_by_role("button", name="Authorize", exact=True).click()
    expect(row.get_by_role("button", name="Unauthorize", exact=True)).to_be_visible()
    assert waiting_in_nav(page) == before

    # The POST the page no longer offers is refused with a sentence; the admin still
    # logs in.
    admin = log_in_admin(hub)
    r = admin.authorize("admin", action="unauthorize")
    assert r.status_code == 400, r.text
    assert "You cannot unapprove your own account" in r.text
    assert HubUser(base, "admin", hub.admin_password).login().status_code == 302

    # A user who may not approve accounts sees no such link.
    page.context.clear_cookies()
    log_in(page, base, WAITING, GOOD_PASSWORD)
    expect(page.locator("[data-gpulab=nav-signups]")).to_have_count(0)


def test_the_admin_page_shows_projects_not_a_default_server(hub, page):
    base = hub.url
    admin = log_in_admin(hub)
    with_project = make_user(hub, admin, WITH_PROJECT)
    make_user(hub, admin, WITHOUT_PROJECT)
    # A project that exists but is stopped (its start refused at once: bad options).
    r = with_project.api(
        "POST", f"/hub/api/users/{WITH_PROJECT}/servers/first", json={"gpus": "lots"}
    )
    assert r.status_code >= 400, r.text
    deadline = time.monotonic() + 30
    while True:
        servers = with_project.api("GET", f"/hub/api/users/{WITH_PROJECT}").json()["servers"]
        if not servers.get("first", {}).get("pending"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.3)

    log_in(page, base, "admin", hub.admin_password)
    jupyterhub_admin(page, base, "acctp")
    rows = page.locator("tr.user-row")
    expect(rows.filter(has_text=WITHOUT_PROJECT)).to_have_count(1)
    page.screenshot(path=SHOTS / "accounts-admin-page.png")
    # The user with a project: one row, the project's; no default server's.
    shown = rows.filter(has_text=WITH_PROJECT).locator("visible=true")
    expect(shown).to_have_count(1)
    expect(shown.locator("[data-testid=user-row-server]")).to_have_text("first")
    # The user with none: one row (Edit User is there), no server button that fails.
    none = rows.filter(has_text=WITHOUT_PROJECT)
    expect(none).to_be_visible()
    expect(none.get_by_role("button", name="Edit User")).to_be_visible()
    for label in ("Start Server", "Spawn Page"):
        expect(none.get_by_text(label).locator("visible=true")).to_have_count(0)
    said = none.locator("[data-testid=user-row-server] > p").evaluate(
        "p => getComputedStyle(p, '::before').content"
    )
    assert said == '"no project yet"'
    expect(page.locator(".start-all")).to_be_hidden()


def test_the_login_page_speaks_of_gpulab_and_warns_over_plain_http(hub, page):
    # From this machine (127.0.0.1): no warning; gpulab's name and logo.
    page.goto(f"{hub.url}/hub/login")
    expect(page).to_have_title("Sign in to gpulab")
    expect(page.get_by_role("heading", name="Sign in to gpulab")).to_be_visible()
    expect(page.locator("[data-gpulab=logo]")).to_contain_text("gpulab")
    expect(page.get_by_role("img", name="gpulab logo")).to_be_visible()
    expect(page.locator("img[src$='/logo']")).to_have_count(0)  # JupyterHub's logo
    expect(page.locator("#insecure-login-warning")).to_be_hidden()
    assert not any("JupyterHub" in t for t in page.locator("#login-main, nav").all_inner_texts())


def test_over_plain_http_from_another_host_the_login_page_warns(hub, playwright_http_host):
    page, url = playwright_http_host
    page.goto(f"{url}/hub/login")
    warning = page.locator("#insecure-login-warning")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text("plain HTTP: your password crosses the network unencrypted")
    expect(warning).to_contain_text("docs/deployment.md")
    expect(warning).not_to_contain_text("JupyterHub")
    page.screenshot(path=SHOTS / "accounts-login-http.png")
    page.goto(f"{url}/hub/signup")
    expect(page.locator("#insecure-login-warning")).to_contain_text("docs/deployment.md")


@pytest.fixture
def playwright_http_host(hub, browser):
    """A Chromium page that reaches the hub as http://gpulab.test:<port> (resolved to
    127.0.0.1 by Chromium itself), as a person on another machine reaches it."""
    port = hub.url.rsplit(":", 1)[1]
    rules = "--host-resolver-rules=MAP gpulab.test 127.0.0.1"
    b = browser.browser_type.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, rules])
    p = b.new_page()
    p.set_default_timeout(15_000)
    yield p, f"http://gpulab.test:{port}"
    b.close()

"""Public notebook links (/hub/gpulab/p/<code>): one notebook, read-only, for anyone
with the link, on a hub where the admin turned them on (GPULAB_PUBLIC_LINKS=1),
against real hubs and a real project container."""

from __future__ import annotations

import json
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from html import unescape
from html.parser import HTMLParser
from urllib.parse import quote

import pytest
import requests
from hubclient import HubUser
from requests.adapters import HTTPAdapter

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT = "plalice", "pl-one"
VISITOR = "plbob"
SHOWN = "Visible words of the shared notebook 4711"
SECRET = "Words of the other notebook 0815"
# An output that would run script if shown as it is.
EVIL = (
    "<b onclick=\"document.title='pwned'\">bold</b>"
    "<a href=\"javascript:document.title='pwned'\">x</a>"
    "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
)


def notebook(text: str, html_output: str = "") -> dict:
    cells = [{"cell_type": "markdown", "id": "m1", "metadata": {}, "source": f"# {text}"}]
    if html_output:
        cells.append(
            {
                "cell_type": "code",
                "id": "c1",
                "metadata": {},
                "execution_count": 1,
                "source": "show()",
                "outputs": [
                    {
                        "output_type": "display_data",
                        "metadata": {},
                        "data": {"text/html": html_output, "text/plain": "html"},
                    }
                ],
            }
        )
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


class Tags(HTMLParser):
    """The tags of a page, and any event-handler attributes (onerror=...) on them."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()
        self.handlers: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.names.add(tag)
        for name, value in attrs:
            if name.startswith("on") or (value or "").strip().lower().startswith("javascript:"):
                self.handlers.append((tag, name))


def make_user(hub, admin: HubUser, name: str) -> HubUser:
    user = HubUser(hub.url, name, f"{name}-Passw0rd-long")
    assert user.signup().status_code == 200
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def post(user: HubUser, url: str, **form):
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    return user.http.post(user.base + url, data={"_xsrf": xsrf, **form}, timeout=30)


def put(user: HubUser, path: str, model: dict) -> None:
    if model.get("type") == "notebook":
        model = {**model, "format": "json"}
    r = user.api("PUT", f"/user/{OWNER}/{PROJECT}/api/contents/{quote(path)}", json=model)
    assert r.status_code in (200, 201), r.text


def make_link(alice: HubUser, path: str, hours: str = "2") -> str:
    r = post(alice, f"/hub/gpulab/public-links/{PROJECT}", action="create", path=path, hours=hours)
    assert r.status_code == 200, r.text
    url = unescape(re.search(r'value="(http[^"]+/hub/gpulab/p/[^"]+)"', r.text).group(1))
    return url.removeprefix(alice.base)


def anonymous(base: str, path: str) -> requests.Response:
    """A view without login or cookie, from this module's own visitor address (the
    hub counts views per address: the tests below use others)."""
    return visitor("127.0.0.20").get(base + path, timeout=30, allow_redirects=False)


class FromAddress(HTTPAdapter):
    """Connections from one loopback address (127.0.0.0/8 is all this host's): views
    of a visitor of their own, counted apart by the hub's per-address rate limit
    (30 a minute by default)."""

    def __init__(self, source: str):
        self.source = source
        super().__init__(pool_maxsize=32)

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        return super().init_poolmanager(*args, **kwargs)


def visitor(source: str) -> requests.Session:
    session = requests.Session()
    session.mount("http://", FromAddress(source))
    return session


@pytest.fixture(scope="module")
def pubhub(second_hub):
    """A second hub, with public links on (and containers of its own prefix): the one
    security/test_accounts.py uses too (conftest.second_hub)."""
    return second_hub


@pytest.fixture(scope="module")
def people(pubhub):
    admin = HubUser(pubhub.url, "admin", pubhub.admin_password)
    assert admin.login().status_code == 302
    people = {n: make_user(pubhub, admin, n) for n in (OWNER, VISITOR)}
    alice = people[OWNER]
    alice.start_project(PROJECT)
    put(alice, "nb", {"type": "directory"})
    put(
        alice,
        "nb/shown.ipynb",
        {"type": "notebook", "content": notebook(SHOWN, EVIL)},
    )
    put(
        alice,
        "nb/secret.ipynb",
        {"type": "notebook", "content": notebook(SECRET)},
    )
    put(alice, "notes.txt", {"type": "file", "format": "text", "content": SECRET})
    yield people
    alice.stop_project(PROJECT)


def test_links_are_off_unless_the_admin_turns_them_on(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    assert admin.http.get(hub.url + "/hub/gpulab/public-links/any", timeout=30).status_code == 404
    r = anonymous(hub.url, "/hub/gpulab/p/" + "A" * 43)
    assert r.status_code == 404 and "turned off" in r.text


def test_anyone_with_the_link_reads_that_notebook_only(pubhub, people):
    alice = people[OWNER]
    link = make_link(alice, "nb/shown.ipynb")
    page = alice.http.get(alice.base + f"/hub/gpulab/public-links/{PROJECT}", timeout=30)
    assert "nb/shown.ipynb" in page.text and "expires" in page.text

    r = anonymous(pubhub.url, link)  # no login, no cookie
    assert r.status_code == 200, r.text
    assert SHOWN in r.text and SECRET not in r.text
    assert f"from {OWNER}'s project {PROJECT}" in r.text

    # Outputs are sanitized, and the page lets no script run at all.
    tags = Tags()
    tags.feed(r.text)
    assert "script" not in tags.names and not tags.handlers, (tags.names, tags.handlers)
    assert "document.title=" in unescape(r.text)  # the output is there, as inert text
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "sandbox" in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"

    # Nothing else is reachable from the code.
    code = link.rsplit("/", 1)[1]
    for path in (
        f"{link}/../../../secret.ipynb",
        f"{link}/nb/secret.ipynb",
        f"{link}%2F..%2Fsecret.ipynb",
        f"{link}?path=nb/secret.ipynb",
        f"/hub/gpulab/p/{code[:-1]}",
        "/hub/gpulab/p/..%2F..%2Fnotes.txt",
        "/hub/gpulab/p/" + "x" * 43,
        f"/user/{OWNER}/{PROJECT}/api/contents/nb/secret.ipynb",
        f"/user/{OWNER}/{PROJECT}/files/notes.txt",
    ):
        r = anonymous(pubhub.url, path)
        assert SECRET not in r.text, path
        if "?path=" in path:
            assert r.status_code == 200 and SHOWN in r.text  # the query is ignored
        else:
            assert r.status_code in (302, 403, 404), (path, r.status_code)


def test_path_is_fixed_and_links_are_not_followed(pubhub, people):
    alice = people[OWNER]
    link = make_link(alice, "nb/shown.ipynb")
    assert SHOWN in anonymous(pubhub.url, link).text
    # The owner's kernel swaps the notebook for a link to another one: not followed.
    code = (
        "import os\n"
        "os.rename('/workspace/nb/shown.ipynb', '/workspace/nb/moved.ipynb')\n"
        "os.symlink('/workspace/nb/secret.ipynb', '/workspace/nb/shown.ipynb')\n"
        "print('ok')\n"
    )
    guest = HubUser(alice.base, OWNER, "")
    guest.token = alice.token
    assert guest.execute(PROJECT, code) == "ok\n"
    r = anonymous(pubhub.url, link)
    assert r.status_code == 404 and SECRET not in r.text
    restore = (
        "import os\n"
        "os.unlink('/workspace/nb/shown.ipynb')\n"
        "os.rename('/workspace/nb/moved.ipynb', '/workspace/nb/shown.ipynb')\n"
        "print('ok')\n"
    )
    assert guest.execute(PROJECT, restore) == "ok\n"
    assert SHOWN in anonymous(pubhub.url, link).text

    # Only notebooks inside the project, by plain path, for at most the maximum time.
    for path, status in (
        ("../pl-one/nb/secret.ipynb", 400),
        ("/etc/passwd", 400),
        ("notes.txt", 400),
        ("nb/missing.ipynb", 404),
        ("nb", 400),
    ):
        r = post(alice, f"/hub/gpulab/public-links/{PROJECT}", action="create", path=path)
        assert r.status_code == status, (path, r.status_code)
    r = post(
        alice,
        f"/hub/gpulab/public-links/{PROJECT}",
        action="create",
        path="nb/shown.ipynb",
        hours="1000",
    )
    assert r.status_code == 400 and "from 1 to 168 hours" in r.text
    # Someone else's project has no such page.
    bob = people[VISITOR]
    assert bob.http.get(bob.base + f"/hub/gpulab/public-links/{PROJECT}").status_code == 404


def test_revoked_and_expired_links_show_nothing(pubhub, people):
    alice = people[OWNER]
    link = make_link(alice, "nb/shown.ipynb")
    page = alice.http.get(alice.base + f"/hub/gpulab/public-links/{PROJECT}", timeout=30)
    ids = re.findall(r'data-id="(pl_[0-9a-f]+)"', page.text)
    # The newest link is the last row; revoke it.
    r = post(alice, f"/hub/gpulab/public-links/{PROJECT}", action="revoke", id=ids[-1])
    assert r.status_code == 200 and "Public link revoked." in r.text
    r = anonymous(pubhub.url, link)
    assert r.status_code == 404 and SHOWN not in r.text

    # Expiry: no page makes a link shorter than an hour, so the test moves one's expiry
    # into the past in the hub's own store, which the hub reads on every view.
    link = make_link(alice, "nb/shown.ipynb", hours="1")
    assert anonymous(pubhub.url, link).status_code == 200
    store = pubhub.home / "hub" / "public-links.json"
    data = json.loads(store.read_text())
    for entry in data["links"]:
        entry["expires_at"] = min(entry["expires_at"], time.time() - 1)
    store.write_text(json.dumps(data))
    r = anonymous(pubhub.url, link)
    assert r.status_code == 404 and SHOWN not in r.text


def test_save_a_copy_asks_to_log_in_then_copies(pubhub, people):
    alice, bob = people[OWNER], people[VISITOR]
    link = make_link(alice, "nb/shown.ipynb")
    code = link.rsplit("/", 1)[1]
    page = anonymous(pubhub.url, link)
    save = unescape(re.search(r'id="public-save-copy" href="([^"]+)"', page.text).group(1))
    assert save.startswith("/hub/login?next=")
    # Not logged in: JupyterHub's login page. Logged in: on to the copy page.
    assert "login" in requests.get(pubhub.url + save, timeout=30).url
    offer = bob.http.get(bob.base + save, timeout=30)
    assert offer.status_code == 200 and "/hub/gpulab/copy" in offer.url
    assert "nb/shown.ipynb" in offer.text and "(a public link)" in offer.text

    xsrf = bob.http.cookies.get("_xsrf", path="/hub/")
    r = bob.http.post(
        bob.base + "/hub/gpulab/copy",
        params={"public": code},
        data={"_xsrf": xsrf, "new_project": "pl-mine"},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 302, r.text
    assert r.headers["Location"] == f"/hub/user/{VISITOR}/pl-mine/lab/tree/shown%20%28copy%29.ipynb"
    projects = pubhub.home / "projects"
    assert (projects / VISITOR / "pl-mine" / "shown (copy).ipynb").read_bytes() == (
        projects / OWNER / PROJECT / "nb" / "shown.ipynb"
    ).read_bytes()
    # The code grants reading that notebook only, and nothing once revoked.
    r = bob.http.get(
        bob.base + "/hub/gpulab/copy",
        params={"owner": OWNER, "project": PROJECT, "path": "nb/secret.ipynb"},
        timeout=30,
    )
    assert r.status_code == 404
    page = alice.http.get(alice.base + f"/hub/gpulab/public-links/{PROJECT}", timeout=30)
    for link_id in re.findall(r'data-id="(pl_[0-9a-f]+)"', page.text):
        post(alice, f"/hub/gpulab/public-links/{PROJECT}", action="revoke", id=link_id)
    r = bob.http.get(bob.base + "/hub/gpulab/copy", params={"public": code}, timeout=30)
    assert r.status_code == 404


def storm_notebook(cells: int) -> dict:
    """A notebook that takes nbconvert seconds (about 4 s here for 400 cells)."""
    nb = notebook("Storm notebook 2323")
    cell = {
        "cell_type": "code",
        "metadata": {},
        "execution_count": 1,
        "source": "for k in range(10):\n    print(k * 2, 'words')\n",
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "output line\n" * 5}],
    }
    nb["cells"] += [{**cell, "id": f"s{i}"} for i in range(cells)]
    return nb


def test_a_storm_of_views_renders_once_and_the_home_page_stays_quick(pubhub, people):
    """20 anonymous views at once of a notebook that takes seconds to render (before:
    every view rendered it on the home page's thread pool; 8 such views made /hub/home
    take 36 s): one render, shared; a signed-in user's home page answers meanwhile."""
    alice = people[OWNER]
    put(alice, "nb/storm.ipynb", {"type": "notebook", "content": storm_notebook(400)})
    link = make_link(alice, "nb/storm.ipynb")
    home = alice.http.get(alice.base + "/hub/home", timeout=30)
    assert home.status_code == 200 and PROJECT in home.text

    stranger = visitor("127.0.0.21")
    homes: list[float] = []

    def view(_):
        return stranger.get(pubhub.url + link, timeout=120, allow_redirects=False)

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(view, i) for i in range(20)]
        while not all(f.done() for f in futures):
            started = time.monotonic()
            r = alice.http.get(alice.base + "/hub/home", timeout=30)
            homes.append(time.monotonic() - started)
            assert r.status_code == 200
            time.sleep(0.1)
        views = [f.result() for f in futures]

    assert [r.status_code for r in views] == [200] * 20
    assert all("Storm notebook 2323" in r.text for r in views)
    came = sorted(r.headers["X-Gpulab-Cache"] for r in views)
    assert came.count("miss") == 1, came  # one render; the others shared it or the cache
    assert set(came) <= {"miss", "shared", "hit"}
    assert len(homes) >= 5, homes  # the storm lasted (a render takes seconds)
    assert max(homes) < 1.0, homes

    # The next view is served from the cache, without rendering.
    started = time.monotonic()
    again = stranger.get(pubhub.url + link, timeout=30)
    assert again.headers["X-Gpulab-Cache"] == "hit" and "Storm notebook 2323" in again.text
    assert time.monotonic() - started < 1.0


def test_a_new_version_of_the_notebook_is_rendered_again(pubhub, people):
    alice = people[OWNER]
    put(alice, "nb/versions.ipynb", {"type": "notebook", "content": notebook("Version one")})
    link = make_link(alice, "nb/versions.ipynb")
    guest = visitor("127.0.0.22")
    first = guest.get(pubhub.url + link, timeout=60)
    assert first.headers["X-Gpulab-Cache"] == "miss" and "Version one" in first.text
    assert guest.get(pubhub.url + link, timeout=60).headers["X-Gpulab-Cache"] == "hit"
    put(alice, "nb/versions.ipynb", {"type": "notebook", "content": notebook("Version two")})
    changed = guest.get(pubhub.url + link, timeout=60)
    assert changed.headers["X-Gpulab-Cache"] == "miss"
    assert "Version two" in changed.text and "Version one" not in changed.text


def test_a_notebook_over_the_size_limit_gets_a_page_that_says_so_at_once(pubhub, people):
    alice = people[OWNER]
    code = (
        "import json\n"
        "out = {'output_type': 'stream', 'name': 'stdout', 'text': 'x' * (10 * 2**20)}\n"
        "cell = {'cell_type': 'code', 'id': 'c', 'metadata': {}, 'execution_count': 1,\n"
        "        'source': 'big()', 'outputs': [out]}\n"
        "nb = {'cells': [cell], 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}\n"
        "text = json.dumps(nb)\n"
        "open('/workspace/nb/huge.ipynb', 'w').write(text + ' ' * (21 * 2**19 - len(text)))\n"
        "print('ok')\n"
    )
    guest = HubUser(alice.base, OWNER, "")
    guest.token = alice.token
    assert guest.execute(PROJECT, code) == "ok\n"
    size = (pubhub.home / "projects" / OWNER / PROJECT / "nb" / "huge.ipynb").stat().st_size
    assert size == 10.5 * 2**20
    link = make_link(alice, "nb/huge.ipynb")
    started = time.monotonic()
    r = visitor("127.0.0.23").get(pubhub.url + link, timeout=60)
    took = time.monotonic() - started
    assert r.status_code == 413 and took < 1.0, (r.status_code, took)
    assert (
        "This notebook is too large to show here (10.5 MiB; the limit is 10 MiB) "
        "\u2014 ask the owner to share the project instead." in unescape(r.text)
    )
    assert 'id="public-save-copy"' in r.text  # a copy can still be saved (up to 50 MiB)
    assert "xxxxxxxxxx" not in r.text


def test_views_per_address_are_limited_whatever_headers_the_visitor_sends(pubhub, people):
    """30 views a minute from one address (the default), then 429 with Retry-After.
    Every request forges X-Forwarded-For and X-Real-Ip, as an attacker spreading views
    over made-up addresses would: the hub counts the address its proxy saw."""
    alice = people[OWNER]
    link = make_link(alice, "nb/shown.ipynb")
    flood = visitor("127.0.0.24")
    statuses, refused = [], None
    started = time.monotonic()
    for _ in range(45):
        made_up = ".".join(str(secrets.randbelow(250) + 1) for _ in range(4))
        headers = {"X-Forwarded-For": made_up, "X-Real-Ip": made_up}
        r = flood.get(pubhub.url + link, headers=headers, timeout=60)
        statuses.append(r.status_code)
        if r.status_code == 429 and refused is None:
            refused = r
    elapsed = time.monotonic() - started
    assert statuses[:30] == [200] * 30, statuses
    assert set(statuses) == {200, 429}, statuses
    # A burst of 30, then one view every 2 s at most.
    assert statuses.count(200) <= 30 + elapsed / 2 + 1, (statuses, elapsed)
    assert refused is not None, statuses
    # one view every 2 s: the next is at most 2 s away, never "now"
    assert int(refused.headers["Retry-After"]) in (1, 2), refused.headers
    assert refused.text.startswith("Too many views from your address: at most 30 a minute.")
    assert SHOWN not in refused.text
    # Another address is counted apart.
    r = visitor("127.0.0.25").get(pubhub.url + link, timeout=60)
    assert r.status_code == 200 and SHOWN in r.text

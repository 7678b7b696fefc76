"""Change runtime type (home/runtime.py) on a real hub with real project containers.

This machine has no GPU, so the restart is CPU to CPU: the project stops and starts
again through JupyterHub's spawn, its files and image kept; a GPU is refused in words;
a stopped project's choice is its next start's (the start page's form included).
"""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
from hubclient import HubUser
from security.people import log_in_admin, make_user, share_by_link

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, COLLAB, STRANGER = "rtann", "rtbob", "rtcarl"
LAB = "rt-lab"
MARK = "kept across the runtime change"


def page(user: HubUser, owner: str = OWNER, project: str = LAB):
    return user.http.get(f"{user.base}/hub/gpulab/runtime/{owner}/{project}", timeout=30)


def change(user: HubUser, owner: str = OWNER, project: str = LAB, xsrf: bool = True, **form):
    """The page's form, as a browser posts it (the page first, for its _xsrf)."""
    page(user, owner, project)
    data = dict(form)
    if xsrf:
        data["_xsrf"] = user.http.cookies.get("_xsrf", path="/hub/")
    return user.http.post(
        f"{user.base}/hub/gpulab/runtime/{owner}/{project}",
        data=data,
        allow_redirects=False,
        timeout=240,
    )


def server(user: HubUser, project: str = LAB) -> dict | None:
    r = user.api("GET", f"/hub/api/users/{user.name}?include_stopped_servers=1")
    return r.json()["servers"].get(project)


def kept_options(hub, owner: str = OWNER, project: str = LAB) -> dict:
    """The start options JupyterHub keeps for the project's next start (its database)."""
    db = hub.home / "hub" / "jupyterhub.sqlite"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = con.execute(
            "SELECT s.user_options FROM spawners s JOIN users u ON s.user_id = u.id "
            "WHERE u.name = ? AND s.name = ?",
            (owner, project),
        ).fetchone()
    finally:
        con.close()
    return json.loads(row[0] or "{}")


def container_of(docker_engine, owner: str, project: str) -> dict:
    found = docker_engine.call(
        "containers",
        filters={"label": [f"gpulab.owner={owner}", f"gpulab.project={project}"]},
    )
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {n: make_user(hub, admin, n) for n in (OWNER, COLLAB, STRANGER)}


@pytest.fixture(scope="module")
def running(people):
    ann = people[OWNER]
    ann.start_project(LAB)
    assert ann.execute(LAB, f"open('kept.txt', 'w').write({MARK!r})") == ""
    share_by_link(ann, LAB, people[COLLAB], "collaborator")
    return ann


def test_the_home_page_links_each_project_to_its_runtime_page(people, running):
    home = running.http.get(f"{running.base}/hub/home", timeout=30)
    link = re.search(r'id="runtime-rt-lab"\s+href="([^"]+)"', home.text)
    assert link and link.group(1) == f"/hub/gpulab/runtime/{OWNER}/{LAB}", home.text


def test_a_gpu_is_refused_in_words_and_the_project_runs_on(hub, people, running, docker_engine):
    before = container_of(docker_engine, OWNER, LAB)
    shown = page(running)
    assert shown.status_code == 200
    assert re.search(r"Runs on: <strong>CPU only</strong>\s+\(running now\)", shown.text)
    assert "Only CPU is offered: this computer has no GPU." in shown.text
    for form in ({"gpus": "1"}, {"gpus": "2", "gpu_type": "H100"}, {"mig_profile": "1g.10gb"}):
        r = change(running, **{"gpus": "0", **form})
        assert r.status_code == 400, r.text
        assert "this computer has no GPU" in r.text and 'id="runtime-error"' in r.text
    r = change(running, gpus="lots")
    assert r.status_code == 400 and "The number of GPUs must be a whole number." in r.text
    assert change(running, xsrf=False, gpus="0").status_code == 403
    assert container_of(docker_engine, OWNER, LAB)["Id"] == before["Id"]  # not restarted


def test_others_may_not_change_it(people, running, docker_engine):
    before = container_of(docker_engine, OWNER, LAB)
    bob, carl = people[COLLAB], people[STRANGER]
    assert page(carl).status_code == 404
    assert change(carl, gpus="0").status_code == 404
    # a collaborator sees it, but changes it only where the owner lets them start it
    shown = page(bob)
    assert shown.status_code == 200 and 'id="runtime-not-allowed"' in shown.text
    r = change(bob, gpus="0")
    assert r.status_code == 403 and "ask rtann" in r.text
    assert container_of(docker_engine, OWNER, LAB)["Id"] == before["Id"]


def test_a_running_project_restarts_with_its_files_and_image(hub, people, running, docker_engine):
    before = container_of(docker_engine, OWNER, LAB)
    r = change(running, gpus="0")
    assert r.status_code == 302, r.text
    assert r.headers["Location"] == f"/hub/spawn-pending/{OWNER}/{LAB}"
    running.wait_ready(LAB, timeout=300)
    after = container_of(docker_engine, OWNER, LAB)
    assert after["Id"] != before["Id"]  # a new server ...
    assert after["ImageID"] == before["ImageID"]  # ... of the same image: nothing rebuilt
    assert running.execute(LAB, "print(open('kept.txt').read())").strip() == MARK
    assert server(running)["user_options"].get("gpus") == 0
    assert kept_options(hub).get("gpus") == 0


def test_a_stopped_projects_choice_is_its_next_start(hub, people, running):
    ann = running
    ann.stop_project(LAB)
    # as if it had never been chosen: the start options of its creation only
    r = ann.api("PATCH", f"/hub/api/users/{OWNER}/servers/{LAB}", json={"user_options": {}})
    assert r.status_code in (200, 204), r.text
    assert "gpus" not in kept_options(hub)
    r = change(ann, gpus="0")
    assert r.status_code == 200, r.text
    assert "Saved: rt-lab starts on CPU only from now on." in r.text
    assert re.search(r"Runs on: <strong>CPU only</strong>\s+\(stopped", r.text)
    assert kept_options(hub) == {"gpus": 0}
    # the start page's form (no hardware fields on this computer) starts with it
    spawn = ann.http.get(f"{ann.base}/hub/spawn/{OWNER}/{LAB}", timeout=30)
    action = re.search(r'<form[^>]*id="spawn_form"[^>]*action="([^"]+)"', spawn.text)
    action = action or re.search(r'action="([^"]+)"[^>]*id="spawn_form"', spawn.text)
    assert action, spawn.text
    r = ann.http.post(ann.base + action.group(1).replace("&amp;", "&"), data={}, timeout=60)
    assert r.status_code < 400, r.text
    ann.wait_ready(LAB, timeout=300)
    assert kept_options(hub).get("gpus") == 0  # a start without the choice would drop it
    assert ann.execute(LAB, "print(open('kept.txt').read())").strip() == MARK

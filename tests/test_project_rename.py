"""Renaming a project (rename.py): its files, image record, shares and links move, on a
real hub with real project containers; refusals; and, without a hub, every record moved
and everything put back when a step fails."""

from __future__ import annotations

import json
import time

import hubdb_kit
import pytest
from hubclient import HubUser
from jupyterhub import orm
from security.people import execute, log_in_admin, make_user, page_post, share_by_link

from gpulab_hub.cluster import jobs as cluster_jobs
from gpulab_hub.secrets.store import SecretStore, Selection
from gpulab_hub.sharing import received

# Tests through the hub are marked docker; the record tests at the end need no hub.
OWNER, OLD, NEW, OTHER = "rnalice", "lab-one", "lab-two", "lab-side"
MARK = "written before the rename"


def rename_form(user: HubUser, project: str, new: str, display: str = ""):
    """The rename page's form, as a browser posts it (with the page's _xsrf)."""
    user.http.get(f"{user.base}/hub/gpulab/rename/{project}", timeout=30)
    xsrf = user.http.cookies.get("_xsrf", path="/hub/")
    return user.http.post(
        f"{user.base}/hub/gpulab/rename/{project}",
        data={"_xsrf": xsrf, "new_name": new, "display_name": display},
        timeout=60,
    )


def rename_api(user: HubUser, owner: str, project: str, new, **extra):
    path = f"/hub/api/gpulab/projects/{owner}/{project}/rename"
    return user.api("POST", path, json={"name": new, **extra}, timeout=60)


def servers(user: HubUser) -> dict:
    return user.api("GET", f"/hub/api/users/{user.name}").json()["servers"]


def named(user: HubUser) -> set[str]:
    """The user's projects as JupyterHub knows them (running or not)."""
    r = user.api("GET", f"/hub/api/users/{user.name}?include_stopped_servers=1")
    return {name for name in r.json()["servers"] if name}


def stopped(user: HubUser, project: str = OLD) -> None:
    if project in servers(user):
        user.stop_project(project)


def wait_code(user: HubUser, path: str, status: int, within: float = 45) -> int:
    deadline = time.monotonic() + within
    while True:
        got = user.api("GET", path).status_code
        if got == status or time.monotonic() > deadline:
            return got
        time.sleep(1)


@pytest.fixture(scope="module")
def admin(hub):
    return log_in_admin(hub)


@pytest.fixture(scope="module")
def people(hub, admin):
    made = {n: make_user(hub, admin, n) for n in (OWNER, "rnbob", "rncarol", "rndave")}
    r = admin.api("POST", "/hub/api/groups/rnteam", json={"users": ["rncarol"]})
    assert r.status_code == 201, r.text
    return made


@pytest.fixture(scope="module")
def shared(hub, people):
    """alice's project, built once, with a file, shared with bob (link) and a group."""
    alice, bob = people[OWNER], people["rnbob"]
    alice.start_project(OLD)
    assert alice.execute(OLD, f"open('kept.txt', 'w').write({MARK!r})") == ""
    share_by_link(alice, OLD, bob, "collaborator")
    r = page_post(alice, OLD, action="group", name="rnteam", role="collaborator")
    assert r.status_code == 200 and "group <strong>rnteam</strong>" in r.text, r.text
    r = page_post(alice, OLD, action="settings", allow="collaborators_may_start")
    assert r.status_code == 200, r.text
    # a second project: a name that exists
    alice.start_project(OTHER)
    alice.stop_project(OTHER)
    return alice


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_a_running_project_is_not_renamed(hub, people, shared):
    alice = people[OWNER]
    assert OLD in servers(alice)
    r = rename_api(alice, OWNER, OLD, NEW)
    assert r.status_code == 409 and "Stop the project first" in r.json()["message"], r.text
    r = rename_form(alice, OLD, NEW)
    assert r.status_code == 409 and "Stop the project first" in r.text
    page = alice.http.get(f"{alice.base}/hub/gpulab/rename/{OLD}", timeout=30)
    assert page.status_code == 200 and 'id="rename-running"' in page.text
    assert (hub.home / "projects" / OWNER / OLD / "kept.txt").read_text() == MARK
    assert OLD in servers(alice) and NEW not in named(alice)


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_only_the_owner_renames(hub, people, shared, admin):
    bob, dave = people["rnbob"], people["rndave"]
    for who in (bob, dave, admin):  # a collaborator, a stranger, an admin
        r = rename_api(who, OWNER, OLD, NEW)
        assert r.status_code in (403, 404), (who.name, r.status_code, r.text)
        assert rename_form(who, OLD, NEW).status_code == 404
    assert OLD in named(people[OWNER]) and NEW not in named(people[OWNER])


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
@pytest.mark.parametrize(
    "bad", ["Lab", "lab_two", "-lab", "lab-", "lab--two", "a" * 31, "lab\n", "", "2lab", "default"]
)
def test_invalid_names_are_refused_and_change_nothing(hub, people, shared, bad):
    alice = people[OWNER]
    stopped(alice)
    r = rename_api(alice, OWNER, OLD, bad)
    assert r.status_code == 400, r.text
    assert rename_form(alice, OLD, bad).status_code == 400
    assert OLD in named(alice)
    assert (hub.home / "projects" / OWNER / OLD / "kept.txt").read_text() == MARK


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_existing_names_are_refused_and_change_nothing(hub, people, shared):
    alice = people[OWNER]
    stopped(alice)
    r = rename_api(alice, OWNER, OLD, OTHER)
    assert r.status_code == 409 and "already" in r.json()["message"], r.text
    left = hub.home / "projects" / OWNER / "left-over"
    left.mkdir()
    try:
        r = rename_form(alice, OLD, "left-over")
        assert r.status_code == 409 and "taken" in r.text
    finally:
        left.rmdir()
    assert rename_api(alice, OWNER, "no-such", NEW).status_code == 404
    assert {OLD, OTHER} <= named(alice) and NEW not in named(alice)
    assert (hub.home / "projects" / OWNER / OLD / "kept.txt").read_text() == MARK


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_rename_keeps_files_shares_and_image(hub, people, shared):
    alice, bob, carol = people[OWNER], people["rnbob"], people["rncarol"]
    stopped(alice)
    home = alice.http.get(f"{alice.base}/hub/home", timeout=30)
    assert f'href="/hub/gpulab/rename/{OLD}"' in home.text

    r = rename_form(alice, OLD, NEW)
    assert r.status_code == 200 and f"Renamed {OLD} to {NEW}." in r.text, r.text

    projects, state = hub.home / "projects" / OWNER, hub.home / "hub" / "projects" / OWNER
    assert (projects / NEW / "kept.txt").read_text() == MARK
    assert not (projects / OLD).exists() and not (state / OLD).exists()
    assert json.loads((state / NEW / "image.json").read_text())["last_good"]["tag"]
    assert OLD not in named(alice) and NEW in named(alice)
    hub_dir = hub.home / "hub"
    # the sharing settings (the hub's database) follow the server row
    settings = received.policy_store(f"sqlite:///{hub_dir / 'jupyterhub.sqlite'}").snapshot()
    assert f"{OWNER}/{NEW}" in settings and f"{OWNER}/{OLD}" not in settings
    group_roles = (hub_dir / "group-share-roles.json").read_text()
    assert f"{OWNER}/{NEW}" in group_roles and f"{OWNER}/{OLD}" not in group_roles
    listing = alice.api("GET", f"/hub/api/shares/{OWNER}/{NEW}").json()["items"]
    assert {s["user"]["name"] for s in listing if s["user"]} == {"rnbob"}
    assert all(f"!server={OWNER}/{NEW}" in x for s in listing for x in s["scopes"])

    # The last good image is still the project's: a start may choose it.
    r = alice.api("POST", f"/hub/api/users/{OWNER}/servers/{NEW}", json={"use_last_good": True})
    assert r.status_code in (201, 202), r.text
    alice.wait_ready(NEW)
    assert alice.execute(NEW, "print(open('kept.txt').read())").strip() == MARK
    # bob (by link) and carol (through the group) still work in it, under the new name.
    server = f"/user/{OWNER}/{NEW}"
    assert wait_code(bob, server + "/api/contents/kept.txt", 200) == 200
    assert execute(hub.url, server, bob.token, "print(open('kept.txt').read())").strip() == MARK
    carol.new_token()
    assert wait_code(carol, server + "/api/contents/kept.txt", 200) == 200
    assert execute(hub.url, server, carol.token, "print(1 + 1)").strip() == "2"
    alice.stop_project(NEW)

    # The old name is free: a new project of that name starts empty, shared with nobody.
    alice.start_project(OLD)
    files = alice.execute(OLD, "import os; print([f for f in os.listdir() if f[0] != '.'])")
    assert files.strip() == "['Dockerfile']"
    assert alice.api("GET", f"/hub/api/shares/{OWNER}/{OLD}").json()["items"] == []
    assert wait_code(bob, f"/user/{OWNER}/{OLD}/api/contents", 403) == 403
    alice.stop_project(OLD)


# --- without a hub: every record moves, and a failed step puts everything back -------
def records_hub(tmp_path, url: str | None = None):
    """A JupyterHub database (gpulab's tables beside its own: a SQLite file, or the empty
    database ``url``), and gpulab's folders and records of alice/one: files, image
    record, a user share, a group share (with its role), a share code, a token naming
    the server, sharing settings, a public link, a choice of secrets, a job."""
    import logging

    from jupyterhub import scopes

    from gpulab_hub.sharing import groupshares, public, received, roles
    from gpulab_hub.workflows import rename

    scopes.define_custom_scopes(roles.CUSTOM_SCOPES)
    db = hubdb_kit.database(tmp_path / "db", url)[1]
    alice, bob = orm.User(name="alice"), orm.User(name="bob")
    team = orm.Group(name="team", users=[bob])
    db.add_all([alice, bob, team, orm.OAuthClient(identifier="jupyterhub")])
    spawner = orm.Spawner(name="one", display_name="one", user=alice)
    db.add(spawner)
    db.commit()
    orm.Share.grant(db, spawner, bob, scopes=roles.share_scopes("collaborator", "alice", "one"))
    orm.Share.grant(db, spawner, team, scopes=roles.share_scopes("viewer", "alice", "one"))
    orm.ShareCode.new(db, spawner, scopes=roles.share_scopes("viewer", "alice", "one"))
    token = orm.APIToken.find(db, orm.APIToken.new(user=alice, scopes=["inherit"]))
    token.scopes = ["access:servers!server=alice/one"]  # as if alice held a role on it
    hub_dir = tmp_path / "hub"
    where = rename.Where(tmp_path / "projects", hub_dir / "projects", hub_dir, tmp_path / "data")
    (where.projects_root / "alice" / "one").mkdir(parents=True)
    (where.data_root / "projects" / "alice" / "one" / "outputs").mkdir(parents=True)
    (where.data_root / "projects" / "alice" / "one" / "outputs" / "result.txt").write_text(MARK)
    (where.projects_root / "alice" / "one" / "kept.txt").write_text(MARK)
    (where.state_root / "alice" / "one").mkdir(parents=True)
    (where.state_root / "alice" / "one" / "image.json").write_text('{"failed": false}')
    received.policy_store(str(db.get_bind().url)).set("alice", "one", collaborators_may_start=True)
    public.store(hub_dir).create("alice", "one", "nb.ipynb", 3600)
    secrets = SecretStore(str(db.get_bind().url), "alice")
    secrets.put("HF_TOKEN", "encrypted")
    secrets.choose("one", ["HF_TOKEN"], collaborators=True)
    groupshares.GroupShareRoles(hub_dir / groupshares.FILE_NAME).sync_project(db, spawner)
    db.commit()
    jobs = {"417": {"owner": "alice", "project": "one", "job": "20261126-120000-abcd"}}
    jobs["418"] = {"owner": "bob", "project": "one", "job": "20261126-120001-abcd"}
    for entry in jobs.values():
        entry["addresses"] = ["10.99.0.2"]
    cluster_jobs.record_of(hub_dir)._write(jobs)  # a multi-node job of alice/one, bob's own
    return db, spawner, where, token, logging.getLogger("rename-test")


def snapshot(db, where, name: str) -> dict:
    """What alice's project ``name`` has, everywhere a rename looks."""
    from gpulab_hub.sharing import groupshares, public, received

    spawner = orm.User.find(db, "alice").orm_spawners.get(name)
    roles_file = groupshares.GroupShareRoles(where.hub_dir / groupshares.FILE_NAME)
    here = f"alice/{name}"
    return {
        "server": None
        if spawner is None
        else (
            spawner.display_name,
            sorted(x for s in spawner.shares for x in s.scopes),
            sorted(x for c in spawner.share_codes for x in c.scopes),
        ),
        "files": sorted(p.name for p in (where.projects_root / "alice" / name).glob("*")),
        "state": sorted(p.name for p in (where.state_root / "alice" / name).glob("*")),
        "data": sorted(
            str(p.relative_to(where.data_root))
            for p in (where.data_root / "projects" / "alice" / name).glob("*/*")
        ),
        "settings": received.policy_store(str(db.get_bind().url)).get("alice", name),
        "links": [x.path for x in public.store(where.hub_dir).list("alice", name)],
        "secrets": SecretStore(str(db.get_bind().url), "alice").selections().get(name),
        "roles": sorted(s["name"] for s in roles_file.role_specs() if here in s["description"]),
        "hub_roles": sorted(r.name for r in db.query(orm.Role) if any(here in x for x in r.scopes)),
        "jobs": sorted(
            e["job"]
            for e in cluster_jobs.record_of(where.hub_dir)._read().values()
            if (e["owner"], e["project"]) == ("alice", name)
        ),
    }


def test_every_record_moves_to_the_new_name(tmp_path):
    from gpulab_hub.workflows import rename

    db, spawner, where, token, log = records_hub(tmp_path)
    before = snapshot(db, where, "one")
    assert before["roles"] and before["links"] and before["settings"].collaborators_may_start
    moved = rename.move(db, spawner, where, "two", None, log)
    assert "project folder" in moved and "group shares' roles" in moved
    after, old = snapshot(db, where, "two"), snapshot(db, where, "one")
    assert after["files"] == ["kept.txt"] and after["state"] == ["image.json"]
    assert after["data"] == ["projects/alice/two/outputs/result.txt"] and "data folders" in moved
    assert after["server"][0] == "two"  # the display name was the old name
    assert all(x.endswith("!server=alice/two") for x in after["server"][1] + after["server"][2])
    assert len(after["server"][1]) == len(before["server"][1])
    assert after["settings"] == before["settings"] and after["links"] == before["links"]
    assert after["secrets"] == before["secrets"] == Selection(("HF_TOKEN",), True)
    assert len(after["roles"]) == len(before["roles"]) == len(after["hub_roles"])
    assert token.scopes == ["access:servers!server=alice/two"]
    assert old == {
        "server": None, "files": [], "state": [], "data": [],
        "settings": type(before["settings"])(),
        "links": [], "secrets": None, "roles": [], "hub_roles": [], "jobs": [],
    }  # fmt: skip
    assert (
        after["jobs"] == before["jobs"] == ["20261126-120000-abcd"] and "multi-node jobs" in moved
    )
    bobs = [
        e for e in cluster_jobs.record_of(where.hub_dir)._read().values() if e["owner"] == "bob"
    ]
    assert [(e["project"], e["job"]) for e in bobs] == [("one", "20261126-120001-abcd")]
    # A display name of the owner's stays.
    spawner.display_name = "My lab"
    rename.move(db, spawner, where, "three", None, log)
    assert snapshot(db, where, "three")["server"][0] == "My lab"


def _steps() -> list[str]:
    from gpulab_hub.workflows import records

    return ["rename_row", *(c.__name__ for c in records.REGISTRY if c.moves and c.per_project)]


@pytest.mark.parametrize("failing", _steps())
def test_a_failed_step_puts_everything_back(tmp_path, monkeypatch, failing):
    """Every step of a rename (the server row, each registered record) may fail: what
    was moved before it is put back, and the project is as it was."""
    from gpulab_hub.workflows import records, rename

    db, spawner, where, token, log = records_hub(tmp_path)
    before = snapshot(db, where, "one")
    full = OSError(28, "No space left on device")
    if failing == "rename_row":
        real = rename.rename_row

        def broken(*args):
            if args[-2:-1] == ("two",) or args[-3:-1] == ("one", "two"):
                raise full
            return real(*args)

        monkeypatch.setattr(rename, failing, broken)
    else:
        (cls,) = [c for c in records.REGISTRY if c.__name__ == failing]
        real = cls.move

        def broken(self, owner, old, new):
            if new == "two":
                raise full
            return real(self, owner, old, new)

        monkeypatch.setattr(cls, "move", broken)
    with pytest.raises(rename.RenameError) as e:
        rename.move(db, spawner, where, "two", None, log)
    assert "everything was put back" in str(e.value) and "No space left" in str(e.value)
    assert snapshot(db, where, "one") == before
    assert snapshot(db, where, "two")["files"] == [] and spawner.name == "one"
    assert token.scopes == ["access:servers!server=alice/one"]


def test_one_rename_of_an_owners_projects_at_a_time(tmp_path, monkeypatch):
    """While another rename of alice's projects holds her lock (another process here),
    a rename is told her list of projects is busy, and nothing moves."""
    import subprocess
    import sys

    from gpulab_hub.records import run_here
    from gpulab_hub.workflows import rename

    db, spawner, where, token, log = records_hub(tmp_path)
    before = snapshot(db, where, "one")
    monkeypatch.setattr(rename, "LOCK_S", 0.5)
    lock = where.hub_dir / rename.LOCKS / "alice.lock"
    lock.parent.mkdir(parents=True)
    hold = (
        "import filelock, sys, time; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); time.sleep(30)"
    )
    other = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE)
    try:
        assert other.stdout.readline().strip() == b"held"
        with pytest.raises(rename.RenameError) as e:
            rename.move_locked(db, spawner, where, "two", None, log, run_here)
    finally:
        other.kill()
        other.wait()
    assert e.value.status == 409
    assert str(e.value) == (
        "Your list of projects is busy: another change to your list of projects is under "
        "way; try again in a moment."
    )
    assert snapshot(db, where, "one") == before
    assert rename.move_locked(db, spawner, where, "two", None, log, run_here)  # free again
    assert snapshot(db, where, "two")["files"] == before["files"]


def test_names_are_checked_whole():
    from gpulab_hub.workflows import rename

    for bad in ["lab\n", "Lab", "lab_2", "-lab", "lab-", "a--b", "a" * 31, "", "default", "1a"]:
        with pytest.raises(rename.RenameError):
            rename.check_new_name(bad, "old")
    assert rename.check_new_name("vision-2", "old") == "vision-2"
    with pytest.raises(rename.RenameError):
        rename.check_new_name("old", "old")
    with pytest.raises(rename.RenameError):
        rename.check_display_name("two\nlines")


def test_a_data_folder_left_under_the_new_name_is_refused(tmp_path):
    """A project's data folders move with it, so a left-over one of the new name (from an
    earlier project) is never taken over: the rename is refused and nothing moves."""
    from gpulab_hub.workflows import rename

    db, spawner, where, token, log = records_hub(tmp_path)
    before = snapshot(db, where, "one")
    (where.data_root / "projects" / "alice" / "two").mkdir()
    with pytest.raises(rename.RenameError) as e:
        rename.move(db, spawner, where, "two", None, log)
    assert e.value.status == 409 and "taken" in str(e.value)
    assert snapshot(db, where, "one") == before

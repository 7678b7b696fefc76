"""The owners' sharing settings in the hub's database (sharing/policy.py), without a
hub: what an owner sets is what collaborators get, a project's settings follow its
rename and go with its deletion or its owner's, a database the hub cannot read gives
the least allowed, and the file of gpulab before its database is imported once."""

from __future__ import annotations

import json

import hubdb_kit
import pytest
from jupyterhub import orm

from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate
from gpulab_hub.sharing import policyfile
from gpulab_hub.sharing.policy import ProjectSharing, SharingPolicyStore

START = ProjectSharing(collaborators_may_start=True)


@pytest.fixture
def hub(tmp_path):
    url, db = hubdb_kit.database(tmp_path / "hub")
    alice, bob = orm.User(name="alice"), orm.User(name="bob")
    db.add_all([alice, bob, orm.Spawner(user=alice, name="one"), orm.Spawner(user=bob, name="p")])
    db.commit()
    yield url, db
    db.close()
    db_engine.dispose()


def test_what_the_owner_sets_is_kept_per_project(hub):
    url, _db = hub
    store = SharingPolicyStore(url)
    assert store.get("alice", "one") == ProjectSharing()  # the least allowed, by default
    assert store.set("alice", "one", collaborators_may_start=True) == START
    both = store.set("alice", "one", collaborators_may_reshare=True)
    assert both == ProjectSharing(True, True) and store.get("alice", "one") == both
    assert store.get("bob", "p") == ProjectSharing() and store.get("bob", "one") == ProjectSharing()
    assert store.snapshot() == {"alice/one": both}
    with pytest.raises(ValueError, match="No project bob/one"):
        store.set("bob", "one", collaborators_may_start=True)  # not bob's project
    with pytest.raises(TypeError, match="not a sharing setting"):
        store.set("alice", "one", owner_is_admin=True)
    assert store.snapshot() == {"alice/one": both}


def test_the_settings_follow_a_rename_and_go_with_the_project_and_its_owner(hub):
    url, db = hub
    store = SharingPolicyStore(url)
    store.set("alice", "one", collaborators_may_start=True)
    store.set("bob", "p", collaborators_may_reshare=True)
    orm.User.find(db, "alice").orm_spawners["one"].name = "two"  # a rename: the row renamed
    db.commit()
    db.add(orm.Spawner(user=orm.User.find(db, "alice"), name="one"))
    db.commit()
    assert store.get("alice", "two") == START
    assert store.get("alice", "one") == ProjectSharing()  # a new project of the old name
    db.delete(orm.User.find(db, "alice").orm_spawners["two"])
    db.commit()
    assert store.snapshot() == {"bob/p": ProjectSharing(collaborators_may_reshare=True)}
    db.delete(orm.User.find(db, "bob"))
    db.commit()
    assert store.snapshot() == {}


def test_a_database_the_hub_cannot_read_gives_the_least_allowed(tmp_path, caplog):
    store = SharingPolicyStore(f"sqlite:///{tmp_path / 'gone.sqlite'}")
    assert store.get("alice", "one") == ProjectSharing() and store.snapshot() == {}
    assert "cannot be used now" in caplog.text
    with pytest.raises(SharingPolicyStore.Error):
        store.set("alice", "one", collaborators_may_start=True)


def _old(path, projects) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "projects": projects}))


def test_the_old_file_is_imported_once_each_project_that_is_still_there(hub, tmp_path):
    url, _db = hub
    path = tmp_path / "hub" / "sharing.json"
    _old(path, {
        "alice/one": {"collaborators_may_start": True},
        "bob/p": {"collaborators_may_start": True, "collaborators_may_reshare": True},
        "carol/gone": {"collaborators_may_start": True},
    })  # fmt: skip
    done = migrate.upgrade(url, backup=False, imports=[policyfile.PolicyImport(path)])
    said = " ".join(done.imported)
    assert "Imported the sharing settings of 2 project(s)" in said
    assert "leaving out 1: carol/gone (no such project)" in said
    assert not path.exists() and path.with_name("sharing.json.imported").is_file()
    store = SharingPolicyStore(url)
    assert store.snapshot() == {"alice/one": START, "bob/p": ProjectSharing(True, True)}
    _old(path, {"alice/one": {"collaborators_may_reshare": True}})
    again = migrate.upgrade(url, backup=False, imports=[policyfile.PolicyImport(path)])
    assert "were imported before" in " ".join(again.imported)
    assert store.get("alice", "one") == START


def test_a_damaged_old_file_leaves_the_least_allowed_and_a_newer_one_stops(hub, tmp_path):
    url, _db = hub
    path = tmp_path / "hub" / "sharing.json"
    _old(path, {"alice/one": {"collaborators_may_start": "yes"}})
    done = migrate.upgrade(url, backup=False, imports=[policyfile.PolicyImport(path)])
    assert "sharing.json (damaged: the settings of alice/one are not true or false" in " ".join(
        done.imported
    )
    assert SharingPolicyStore(url).snapshot() == {}
    newer = tmp_path / "newer" / "sharing.json"
    newer.parent.mkdir()
    newer.write_text(json.dumps({"version": 99, "projects": {}}))
    fresh = hubdb_kit.database(tmp_path / "db2")[0]
    with pytest.raises(db_engine.DatabaseError, match="newer gpulab"):
        migrate.upgrade(fresh, backup=False, imports=[policyfile.PolicyImport(newer)])
    assert newer.is_file()

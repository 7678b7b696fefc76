"""Users' secrets in the hub's database (secrets/store.py), without a hub: no plaintext
in it, each user's own secrets and projects only, projects' choices following their
renames and dropped with their projects and accounts, the limit held by changes at
once, and the import of the files of gpulab before its database (links never
followed, a file of a newer gpulab refused)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import hubdb_kit
import pytest
import sqlalchemy as sa
from jupyterhub import orm
from test_secrets import VALUE, keeper  # noqa: F401 (the fixture)

from gpulab_hub import hubsettings
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables
from gpulab_hub.secrets import crypt, importfile
from gpulab_hub.secrets.names import MAX_SECRETS, SecretRefused
from gpulab_hub.secrets.store import SecretStore, Selection


@pytest.fixture
def hub(tmp_path):
    """JupyterHub's database (SQLite, gpulab's tables beside JupyterHub's) with alice's
    projects vision and audio, and the users bob and alice.b."""
    url, db = hubdb_kit.database(tmp_path / "hub")
    alice = orm.User(name="alice")
    db.add_all([alice, orm.User(name="bob"), orm.User(name="alice.b")])
    db.add_all([orm.Spawner(user=alice, name="vision"), orm.Spawner(user=alice, name="audio")])
    db.commit()
    yield url, db
    db.close()
    db_engine.dispose()


def store_of(hub, user: str = "alice") -> SecretStore:
    return SecretStore(hub[0], user)


async def put(store: SecretStore, name: str, value: str) -> bool:
    return await asyncio.to_thread(store.put, name, await crypt.encrypt(value))


@pytest.mark.usefixtures("keeper")
async def test_store_keeps_only_encrypted_values_and_gives_each_project_its_choice(hub):
    store = store_of(hub)
    assert await put(store, "HF_TOKEN", VALUE) is True
    assert await put(store, "WANDB_API_KEY", "wandb-" + VALUE) is True
    assert await put(store, "HF_TOKEN", VALUE + "2") is False  # replaced
    # The store blocks (the database): the rest runs off the event loop, as the pages do.
    owner = await asyncio.to_thread(_listed_and_chosen, store)
    assert await crypt.decrypt(owner["HF_TOKEN"]) == VALUE + "2"
    await asyncio.to_thread(_the_rest_of_the_store, store, hub)


def _listed_and_chosen(store: SecretStore) -> dict:
    assert [s.name for s in store.listing()] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert time.strptime(store.listing()[0].set, "%Y-%m-%dT%H:%M:%SZ")

    assert store.choose("vision", ["HF_TOKEN"], collaborators=False) == Selection(("HF_TOKEN",))
    assert store.selections() == {"vision": Selection(("HF_TOKEN",), False)}
    owner = store.encrypted_for("vision", collaborator=False)
    assert list(owner) == ["HF_TOKEN"]
    return owner


def _the_rest_of_the_store(store: SecretStore, hub) -> None:
    assert store.encrypted_for("vision", collaborator=True) == {}
    assert store.encrypted_for("audio", collaborator=False) == {}
    store.choose("vision", ["HF_TOKEN", "WANDB_API_KEY"], collaborators=True)
    assert sorted(store.encrypted_for("vision", collaborator=True)) == ["HF_TOKEN", "WANDB_API_KEY"]

    raw = Path(db_engine.sqlite_file(hub[0])).read_bytes()
    assert VALUE.encode() not in raw and b"wandb-" not in raw  # only the encrypted values
    # Another user's secrets are theirs: none of alice's, and alice's project is not theirs.
    bob = store_of(hub, "bob")
    assert bob.listing() == [] and bob.selections() == {}
    assert bob.encrypted_for("vision", collaborator=False) == {}
    bob.put("HF_TOKEN", "bobs")
    with pytest.raises(SecretRefused, match="Choose one of your projects"):
        bob.choose("vision", ["HF_TOKEN"], collaborators=True)
    assert store.encrypted_for("vision", collaborator=False)["HF_TOKEN"] != "bobs"

    # Deleting a secret takes it out of every project's choice.
    assert store.delete("WANDB_API_KEY") is True and store.delete("WANDB_API_KEY") is False
    assert store.selections()["vision"].names == ("HF_TOKEN",)
    # Choosing nothing drops the project's entry.
    store.choose("vision", [], collaborators=False)
    assert store.selections() == {}


def test_store_refuses_what_it_cannot_keep(hub):
    store = store_of(hub)
    for n in range(MAX_SECRETS):
        store.put(f"S{n}", "ciphertext")
    with pytest.raises(SecretRefused, match="delete one first"):
        store.put("ONE_MORE", "ciphertext")
    store.put("S0", "replaced")  # replacing is always possible
    assert len(store.listing()) == MAX_SECRETS
    with pytest.raises(SecretRefused, match="no secret named NOPE"):
        store.choose("vision", ["S1", "NOPE"], collaborators=False)
    for project in ("../x", "Vision", "", "a/b", "nosuch"):
        with pytest.raises(SecretRefused, match="Choose one of your projects"):
            store.choose(project, ["S1"], collaborators=False)
    assert store.selections() == {}
    for user in ("../alice", "Alice", "", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="not a gpulab user name"):
            store_of(hub, user)
    with pytest.raises(SecretRefused, match="no account of that name"):
        store_of(hub, "nobody").put("HF_TOKEN", "ciphertext")


def test_two_changes_at_once_never_keep_more_than_the_limit(hub):
    """Two pages of one user adding at once (two threads, two transactions) stop at the
    limit together: each change holds the user's secrets until it commits."""
    import concurrent.futures

    store = store_of(hub)
    for n in range(MAX_SECRETS - 5):
        store.put(f"S{n}", "ciphertext")

    def add(n: int) -> str:
        try:
            store_of(hub).put(f"NEW{n}", "ciphertext")
            return "added"
        except SecretRefused:
            return "refused"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        said = list(pool.map(add, range(16)))
    assert said.count("added") == 5 and said.count("refused") == 11
    assert len(store.listing()) == MAX_SECRETS


def test_a_choice_follows_its_project_renamed_and_goes_with_it_deleted(hub):
    url, db = hub
    store = store_of(hub)
    store.put("HF_TOKEN", "ciphertext")
    store.choose("vision", ["HF_TOKEN"], collaborators=True)
    store.choose("audio", ["HF_TOKEN"], collaborators=False)
    alice = orm.User.find(db, "alice")
    # A rename renames JupyterHub's server row in place (workflows/rename.py): the
    # choice goes with it, and a new project of the old name gets nothing.
    alice.orm_spawners["vision"].name = "vision2"
    db.commit()
    db.add(orm.Spawner(user=alice, name="vision"))
    db.commit()
    assert store.selections() == {
        "vision2": Selection(("HF_TOKEN",), True),
        "audio": Selection(("HF_TOKEN",), False),
    }
    assert store.encrypted_for("vision", collaborator=False) == {}
    # Deleting the project (JupyterHub's removal of its server row) drops its choice.
    db.delete(orm.User.find(db, "alice").orm_spawners["audio"])
    db.commit()
    assert set(store.selections()) == {"vision2"}
    assert [s.name for s in store.listing()] == ["HF_TOKEN"]  # the secret itself stays
    # Deleting the account deletes its secrets: a new account of the name has none.
    store_of(hub, "alice.b").put("KEEP", "ciphertext")
    db.delete(orm.User.find(db, "alice"))
    db.commit()
    db.add(orm.User(name="alice"))
    db.commit()
    assert store.listing() == [] and store.selections() == {}
    assert [s.name for s in store_of(hub, "alice.b").listing()] == ["KEEP"]
    with db_engine.begin(url) as conn:
        for table in (tables.secrets, tables.secret_choices, tables.secret_chosen):
            n = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
            assert n == (1 if table is tables.secrets else 0), table.name


def test_a_database_the_hub_cannot_use_is_an_error_for_the_log(tmp_path):
    store = SecretStore(f"sqlite:///{tmp_path / 'gone.sqlite'}", "alice")
    with pytest.raises(SecretStore.Error, match="secrets of alice .* cannot be used now"):
        store.listing()
    assert not (tmp_path / "gone.sqlite").exists()  # never made empty


# --- the files of gpulab before its database --------------------------------------------
def _old_file(folder: Path, user: str, secrets: dict, projects: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{user}.json"
    body = {"secrets": {n: {"value": v, "set": "2026-11-27T03:35:12Z"} for n, v in secrets.items()},
            "projects": projects}  # fmt: skip
    path.write_text(json.dumps({"version": 1, "user": body}))
    return path


def test_the_upgrade_imports_the_old_files_once_and_keeps_them_as_the_backup(hub, tmp_path):
    url, db = hub
    folder = tmp_path / "hub" / hubsettings.SECRETS
    _old_file(folder, "alice", {"HF_TOKEN": "enc-hf", "WANDB_API_KEY": "enc-wandb"}, {
        "vision": {"names": ["HF_TOKEN", "GONE"], "collaborators": True},
        "deleted": {"names": ["HF_TOKEN"], "collaborators": False},
    })  # fmt: skip
    _old_file(folder, "bob", {"B": "enc-b"}, {})
    _old_file(folder, "zed", {"Z": "enc-z"}, {})  # an account that is gone
    (folder / "carol.json").write_text("{not json")
    elsewhere = tmp_path / "planted.json"
    _old_file(tmp_path / "p", "x", {"STOLEN": "enc"}, {}).rename(elsewhere)
    (folder / "alice.b.json").symlink_to(elsewhere)  # never followed
    db.add(orm.User(name="carol"))
    db.commit()

    done = migrate.upgrade(url, backup=False, imports=[importfile.SecretsImport(folder)])
    said = " ".join(done.imported)
    assert "Imported 3 secret(s)" in said and "leaving out 4" in said
    for words in ("no user zed", "'deleted' (no such project)", "carol.json (damaged",
                  "alice.b.json (damaged: a link"):  # fmt: skip
        assert words in said, said
    kept = importfile.kept_folder(folder)
    assert not folder.exists() and (kept / "alice.json").is_file() and f"kept as {kept}" in said
    store = store_of(hub)
    assert [s.name for s in store.listing()] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert store.listing()[0].set == "2026-11-27T03:35:12Z"
    assert store.selections() == {"vision": Selection(("HF_TOKEN",), True)}
    assert store.encrypted_for("vision", collaborator=True) == {"HF_TOKEN": "enc-hf"}
    assert [s.name for s in store_of(hub, "bob").listing()] == ["B"]
    assert store_of(hub, "alice.b").listing() == []

    # Once: a folder of the same name again later is not imported a second time.
    _old_file(folder, "bob", {"AGAIN": "enc"}, {})
    again = migrate.upgrade(url, backup=False, imports=[importfile.SecretsImport(folder)])
    assert "were imported before" in " ".join(again.imported)
    assert [s.name for s in store_of(hub, "bob").listing()] == ["B"]
    # An account's deletion removes its file from the kept folders too (never archived).
    assert importfile.forget_user(tmp_path / "hub", hubsettings.SECRETS, "alice") == [
        "secrets.pre-database/alice.json"
    ]


def test_an_old_file_of_a_newer_gpulab_stops_the_upgrade(hub, tmp_path):
    url, _db = hub
    folder = tmp_path / "hub" / hubsettings.SECRETS
    folder.mkdir(parents=True)
    (folder / "alice.json").write_text(json.dumps({"version": 99, "user": {}}))
    with pytest.raises(db_engine.DatabaseError, match="newer"):
        migrate.upgrade(url, backup=False, imports=[importfile.SecretsImport(folder)])
    assert folder.is_dir() and store_of(hub).listing() == []

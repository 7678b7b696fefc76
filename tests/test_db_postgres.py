"""gpulab's records layer on PostgreSQL (JupyterHub's database in production): the
migration, the upgrade's idempotence and its refusal of a newer revision, the cascade
from JupyterHub's users, the usage ledger (a stop's transaction, fair share by query,
the retention) and the import of the old ledger file, on a PostgreSQL server of the
tests' own (tests/pg_kit.py); the same as tests/test_db.py and tests/test_gpu_usage.py
check on SQLite."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pg_kit
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from jupyterhub import orm

from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables
from gpulab_hub.gpus import usagefile
from gpulab_hub.gpus.usage import DAY, Record, UsageLedger

REPO = Path(__file__).resolve().parents[1]
FIXTURE = sorted((REPO / "tests" / "fixtures").glob("state-*"))[-1]
H = 3600.0
NOW = 1_800_000_000.0


@pytest.fixture
def pg(pg_server):
    yield pg_kit.fresh_database(pg_server)
    db_engine.dispose()


def _gpulabs(obj, name, type_, reflected, compare_to) -> bool:
    table = obj if type_ == "table" else getattr(obj, "table", None)
    return table is None or (
        table.name.startswith(tables.PREFIX) and table.name != tables.VERSION_TABLE
    )


def test_the_migration_makes_gpulabs_tables_beside_jupyterhubs_and_runs_once(pg):
    done = migrate.upgrade(pg)
    assert (done.before, done.after, done.backup) == (None, migrate.head(), None)
    engine = sa.create_engine(pg)
    with engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
        assert {"gpulab_usage", "gpulab_imports", tables.VERSION_TABLE, "users"} <= names
        ours = conn.execute(sa.text(f"SELECT version_num FROM {tables.VERSION_TABLE}")).scalar()
        theirs = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        whole = sa.MetaData()
        for t in orm.Base.metadata.tables.values():  # JupyterHub's: named by foreign keys
            t.to_metadata(whole)
        for t in tables.METADATA.tables.values():
            t.to_metadata(whole)
        ctx = MigrationContext.configure(conn, opts={"include_object": _gpulabs})
        assert compare_metadata(ctx, whole) == []
    engine.dispose()
    assert ours == migrate.head() and theirs != ours
    again = migrate.upgrade(pg)
    assert not again.changed
    orm.new_session_factory(pg).kw["bind"].dispose()  # JupyterHub takes the database


def test_a_newer_revision_is_refused_on_postgresql(pg):
    migrate.upgrade(pg)
    engine = sa.create_engine(pg)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {tables.VERSION_TABLE} SET version_num = '9999_future'"))
    with pytest.raises(db_engine.DatabaseError, match="newer gpulab"):
        migrate.upgrade(pg)
    with engine.connect() as conn:
        rev = conn.execute(sa.text(f"SELECT version_num FROM {tables.VERSION_TABLE}")).scalar()
    engine.dispose()
    assert rev == "9999_future"


def test_deleting_a_jupyterhub_user_cascades_and_fair_share_reads_the_window(pg):
    factory = orm.new_session_factory(pg)
    session = factory()
    session.add_all([orm.User(name="ann"), orm.User(name="bob")])
    session.commit()
    migrate.upgrade(pg)
    ledger = UsageLedger(pg, clock=lambda: NOW, retention=30 * DAY)
    ledger.append([
        Record("ann", "p", "GPU-0", "GPU 0", NOW - 40 * DAY, NOW - 39 * DAY),  # past retention
        Record("ann", "p", "GPU-0", "GPU 0", NOW - 7 * DAY - 3 * H, NOW - 7 * DAY + 2 * H),
        Record("bob", "p", "GPU-1", "GPU 1", NOW - 5 * H, NOW - H, 50.0),
    ])  # fmt: skip
    assert len(ledger.records()) == 2  # the old one went in the same transaction
    assert ledger.hours_by_user(7 * DAY, now=NOW) == pytest.approx({"ann": 2.0, "bob": 4.0})
    with pytest.raises(sa.exc.IntegrityError):  # a user the hub does not have
        with db_engine.begin(pg) as conn:
            conn.execute(tables.usage.insert(), {
                "user_id": 999, "owner": "zed", "project": "p", "uuid": "u", "label": "",
                "started": 1.0, "ended": 2.0,
            })  # fmt: skip
    session.delete(session.query(orm.User).filter_by(name="ann").one())
    session.commit()
    session.close()
    factory.kw["bind"].dispose()
    assert [r.owner for r in ledger.records()] == ["bob"]


def test_the_old_ledger_is_imported_into_postgresql_once(pg, tmp_path):
    hub = tmp_path / "hub"
    shutil.copytree(FIXTURE / "hub", hub)
    path = hub / "gpu-usage.jsonl"
    expected = json.loads((FIXTURE / "expected.json").read_text())["gpu-usage"]
    done = migrate.upgrade(pg, imports=[usagefile.LedgerImport(path)])
    assert f"Imported {len(expected)} GPU usage record(s)" in " ".join(done.imported)
    got = sorted((r.owner, r.start, r.end, r.util) for r in UsageLedger(pg).records())
    assert got == sorted((e["owner"], e["start"], e["end"], e["util"]) for e in expected)
    assert (hub / "gpu-usage.jsonl.imported").is_file() and not path.exists()
    assert not migrate.upgrade(pg, imports=[usagefile.LedgerImport(path)]).changed


def test_secrets_on_postgresql_hold_the_limit_follow_renames_and_go_with_the_user(pg, tmp_path):
    """The secrets store's transactions on PostgreSQL: the limit held by changes at once
    (the user's row locked), a choice that follows its renamed project and goes with
    it, and the user's deletion taking every row; then the old files imported."""
    import concurrent.futures

    from gpulab_hub.secrets import importfile
    from gpulab_hub.secrets.names import MAX_SECRETS, SecretRefused
    from gpulab_hub.secrets.store import SecretStore, Selection

    folder = tmp_path / "hub" / "secrets"
    shutil.copytree(FIXTURE / "hub" / "secrets", folder)
    factory = orm.new_session_factory(pg)
    db = factory()
    alice, bob = orm.User(name="alice"), orm.User(name="bob")
    db.add_all([alice, bob, orm.Spawner(user=alice, name="thesis")])
    db.add(orm.Spawner(user=bob, name="p"))
    db.commit()
    done = migrate.upgrade(pg, imports=[importfile.SecretsImport(folder)])
    assert "Imported 2 secret(s)" in " ".join(done.imported)
    fixture = json.loads((FIXTURE / "expected.json").read_text())["secrets"]
    store = SecretStore(pg, "alice")
    assert [s.name for s in store.listing()] == fixture["listing"]
    assert store.selections() == {"thesis": Selection(("HF_TOKEN",), False)}
    assert store.encrypted_for("thesis", collaborator=False) == fixture["thesis"]

    bobs = SecretStore(pg, "bob")
    for n in range(MAX_SECRETS - 3):
        bobs.put(f"S{n}", "ciphertext")

    def add(n: int) -> str:
        try:
            SecretStore(pg, "bob").put(f"NEW{n}", "ciphertext")
            return "added"
        except SecretRefused:
            return "refused"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        said = list(pool.map(add, range(12)))
    assert said.count("added") == 3 and len(bobs.listing()) == MAX_SECRETS
    bobs.choose("p", ["S1", "S2"], collaborators=True)
    assert bobs.delete("S1") and bobs.selections() == {"p": Selection(("S2",), True)}

    db.query(orm.Spawner).filter_by(name="p").one().name = "p2"  # a rename: the row renamed
    db.commit()
    assert bobs.selections() == {"p2": Selection(("S2",), True)}
    db.delete(db.query(orm.User).filter_by(name="alice").one())
    db.commit()
    assert store.listing() == [] and store.selections() == {}
    with db_engine.begin(pg) as conn:
        owners = (
            conn.execute(
                sa.select(sa.distinct(tables.secrets.c.user_id)).select_from(tables.secrets)
            )
            .scalars()
            .all()
        )
    assert owners == [bob.id]
    db.close()
    factory.kw["bind"].dispose()

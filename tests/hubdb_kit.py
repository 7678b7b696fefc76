"""JupyterHub's database in a SQLite file with gpulab's tables beside its own
(db/migrate.py, as the hub's start makes them), for tests of JupyterHub's ORM without a
hub: a rename and a deletion write their row in gpulab's journal (workflows/journal.py)."""

from __future__ import annotations

from pathlib import Path

from jupyterhub import orm

from gpulab_hub.db import migrate


def database(folder: Path, url: str | None = None) -> tuple[str, orm.Session]:
    """(the database's URL, a session of JupyterHub's ORM on it): a SQLite file in
    ``folder``, or the empty database ``url`` (PostgreSQL: tests/pg_kit.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    url = url or f"sqlite:///{folder / 'jupyterhub.sqlite'}"
    migrate.upgrade(url, backup=False)
    return url, orm.new_session_factory(url)()

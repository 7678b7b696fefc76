"""A hub killed in a project's rename or deletion finishes it as it starts.

Both write their row in the journal (workflows/journal.py) before their first step.
:func:`finish_interrupted` runs as the hub reads its configuration, after gpulab's
tables are upgraded and before JupyterHub serves anyone (hubconfig.finish_interrupted),
and only reads further when the journal holds a row. Each workflow is finished forward,
as its owner asked, by steps that change nothing where they were done already:

- a rename: each folder moves while the old one is there (never onto a new one); each
  record store moves while the old name holds something in it
  (records.ProjectRecords.holds: a move again would drop what moved before); the server
  row is renamed while it has the old name; the group shares' roles are made again from
  the renamed server's shares; then the row is crossed out;
- a deletion: the project's records and files go (archived or removed, as the hub's
  settings said when it began), then its server row, which takes the journal's row.

Afterwards the project, its records and its folders agree: under the new name or gone,
never half. A workflow that cannot be finished (a folder of the new name in the way, a
database JupyterHub must upgrade first) stays in the journal for the next start, and the
hub's output says which and why; the hub starts anyway.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from gpulab_hub import blocking, records
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import tables
from gpulab_hub.workflows import deletion, journal, rename
from gpulab_hub.workflows import records as registry

LOG = logging.getLogger("gpulab.recovery")


def _spawner_row(db, entry: journal.Entry):
    from jupyterhub import orm

    return db.get(orm.Spawner, entry.server_id)


def finish_rename(db, entry: journal.Entry, log=LOG) -> list[str]:
    """Blocking, JupyterHub's session in this thread: the rename of ``entry`` done to its
    end; what this did."""
    where = rename.Where.of_saved(entry.place)
    owner, old, new = entry.owner, entry.project, entry.new_name
    at = where.records(db, records.run_here, log)
    done = []
    for what, parent in where.folders(owner):
        if rename.move_folder(parent, old, new):
            done.append(what)
    for record in registry.files(at):
        if record.per_project and record.moves and record.holds(owner, old):
            record.move(owner, old, new)
            done.append(record.what)
    orm_spawner = _spawner_row(db, entry)
    if orm_spawner is not None and orm_spawner.name == old:
        rename.rename_row(db, orm_spawner, old, new, entry.display_name)
        done.append("server, shares and share links")
    for record in registry.server(at):
        if record.move(owner, old, new) is not None:
            done.append(record.what)
    journal.end(db, entry.id)
    return done


def finish_delete(db, entry: journal.Entry, log=LOG) -> list[str]:
    """Blocking, JupyterHub's session in this thread: the deletion of ``entry`` done to
    its end (the server row last, the journal's row with it); what this did."""
    place = deletion.Place.of_saved(entry.place)
    orm_spawner = _spawner_row(db, entry)
    if orm_spawner is None:  # cannot be (the row would have gone with it): cross it out
        journal.end(db, entry.id)
        return []
    return deletion.finish(db, place, entry.owner, entry.project, orm_spawner)


FINISH = {journal.RENAME: finish_rename, journal.DELETE: finish_delete}


def _what(entry: journal.Entry) -> str:
    if entry.kind == journal.RENAME:
        return f"the rename of {entry.owner}'s project {entry.project!r} to {entry.new_name!r}"
    return f"the deletion of {entry.owner}'s project {entry.project!r}"


def finish_all(db, log=LOG) -> list[str]:
    """Blocking: every workflow in the journal finished; a sentence for each."""
    said = []
    for entry in journal.pending(db):
        finish = FINISH.get(entry.kind)
        try:
            if finish is None:
                raise ValueError(f"a workflow of a kind this gpulab does not know: {entry.kind!r}")
            done = finish(db, entry, log)
        except (OSError, ValueError, sa.exc.SQLAlchemyError) as e:
            db.rollback()
            log.error("gpulab: %s could not be finished: %s", _what(entry), e)
            said.append(
                f"{_what(entry)} was interrupted and could not be finished ({e}); it stays "
                "in the journal for the next start."
            )
            continue
        said.append(
            f"{_what(entry)} was interrupted; finished as the hub started"
            + (f" ({', '.join(done)})." if done else ".")
        )
    return said


def waiting(url: str) -> int:
    """Blocking: how many workflows the journal holds (0 where gpulab's tables are not
    there yet)."""
    with db_engine.begin(url) as conn:
        if tables.workflows.name not in sa.inspect(conn).get_table_names():
            return 0
        return journal.count(conn)


def finish_interrupted(url: str, log=LOG) -> list[str]:
    """Blocking: the workflows a killed hub left in ``url``'s journal, finished; a
    sentence for each (none: nothing was interrupted)."""
    if not waiting(url):
        return []
    from jupyterhub import orm, scopes

    from gpulab_hub.sharing import roles

    try:
        factory = orm.new_session_factory(url)
    except orm.DatabaseSchemaMismatch as e:
        return [f"interrupted projects' renames or deletions wait for JupyterHub's upgrade ({e})"]
    scopes.define_custom_scopes(roles.CUSTOM_SCOPES)  # the group shares' roles name them
    db = factory()
    try:
        with blocking.allowed("finishing an interrupted rename or deletion, before serving"):
            return finish_all(db, log)
    finally:
        db.close()
        factory.kw["bind"].dispose()

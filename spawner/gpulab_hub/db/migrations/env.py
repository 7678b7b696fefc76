"""gpulab's Alembic environment: run by ``gpulab_hub.db.migrate`` on the connection it
passes (``config.attributes["connection"]``), inside that connection's transaction.

Only gpulab's tables (``gpulab_…``) are its business: JupyterHub's are left to
JupyterHub's own migrations, and gpulab's revision is kept in ``gpulab_alembic_version``.
"""

from alembic import context

from gpulab_hub.db import tables


def _ours(name, type_, parent_names) -> bool:
    return type_ != "table" or bool(name and name.startswith(tables.PREFIX))


connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=tables.METADATA,
    version_table=tables.VERSION_TABLE,
    include_name=_ours,
    render_as_batch=True,  # SQLite alters a table by copying it
)
with context.begin_transaction():
    context.run_migrations()

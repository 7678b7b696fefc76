"""gpulab's records in JupyterHub's own database.

gpulab's tables (each named ``gpulab_…``, :mod:`gpulab_hub.db.tables`) live beside
JupyterHub's in the database ``JupyterHub.db_url`` names (SQLite by default), and are
migrated with Alembic as JupyterHub migrates its own: gpulab's migrations
(``migrations/``) and its own version table, ``gpulab_alembic_version``, so JupyterHub's
``alembic_version`` is never touched. ``gpulab upgrade-db`` upgrades them, and the hub
upgrades them as it starts, a backup of a SQLite database first (:mod:`.migrate`).

A row that belongs to a JupyterHub user names it by foreign key (``users.id``, ON
DELETE CASCADE): deleting the user deletes the row, in the database itself. SQLite
checks foreign keys only on connections that turn them on: gpulab's do (and so do
JupyterHub's own).

One engine a database a process (:func:`gpulab_hub.db.engine.of`); every use of it is
blocking work, run on the records pool (``blocking.RECORDS``), never on the event loop
(the guard, ``blocking.off_loop``, says so) nor on the Docker pool. Nothing is made at
import time: the engine on first use.
"""

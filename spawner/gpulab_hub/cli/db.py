"""`gpulab upgrade-db`: gpulab's tables in the hub's database brought to this gpulab's
revision (db/migrate.py), a SQLite database backed up first; the hub does the same as it
starts. Run it with the hub stopped, as `jupyterhub upgrade-db`."""

from __future__ import annotations

import sys

from gpulab_hub import hubsettings
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate
from gpulab_hub.gpus import usagefile


def cmd_upgrade_db(args, environ) -> int:
    where = hubsettings.load(hubsettings.config_file())
    try:
        done = migrate.upgrade(
            where.db_url,
            backup=not args.no_backup,
            imports=[usagefile.LedgerImport(where.usage_file)],
        )
    except db_engine.DatabaseError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 1
    print(done.words(where.db_url))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "upgrade-db",
        help="upgrade gpulab's tables in the hub's database (a SQLite database is backed "
        "up first; the hub also does this as it starts)",
    )
    p.add_argument(
        "--no-backup",
        action="store_true",
        help="make no copy of a SQLite database first (you made one yourself)",
    )
    p.set_defaults(fn=cmd_upgrade_db)

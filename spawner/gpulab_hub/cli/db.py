"""`gpulab upgrade-db`: gpulab's tables in the hub's database brought to this gpulab's
revision (db/migrate.py), a SQLite database backed up first; the hub does the same as it
starts. Run it with the hub stopped, as `jupyterhub upgrade-db`.

`gpulab forget-logins NAME... | --all`: the accounts' bindings to their provider's
identity forgotten (accounts/identities.py), so each is bound again at its next login
(docs/authentication.md: moving to another provider)."""

from __future__ import annotations

import sys

from gpulab_hub import hubsettings
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate
from gpulab_hub.workflows import dbimports


def cmd_upgrade_db(args, environ) -> int:
    where = hubsettings.load(hubsettings.config_file())
    try:
        done = migrate.upgrade(
            where.db_url,
            backup=not args.no_backup,
            imports=dbimports.of(where),
        )
    except db_engine.DatabaseError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 1
    print(done.words(where.db_url))
    return 0


def cmd_forget_logins(args, environ) -> int:
    import sqlalchemy as sa

    from gpulab_hub.accounts import identities
    from gpulab_hub.db import tables

    if bool(args.all) == bool(args.names):
        print("gpulab: name the accounts, or say --all", file=sys.stderr)
        return 2
    where = hubsettings.load(hubsettings.config_file())
    t = tables.login_identities
    try:
        with db_engine.begin_write(where.db_url) as conn:
            q = sa.delete(t) if args.all else sa.delete(t).where(t.c.name.in_(args.names))
            gone = conn.execute(q.returning(t.c.name)).scalars().all()
    except (sa.exc.SQLAlchemyError, db_engine.DatabaseError) as e:
        print(f"gpulab: {identities.IdentityUnavailable(e)}", file=sys.stderr)
        return 1
    for name in sorted(gone):
        print(f"Forgot the login identity of {name}: its next login binds it again.")
    missing = sorted(set(args.names) - set(gone))
    for name in missing:
        print(f"No login identity of {name} was kept.")
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
    p = sub.add_parser(
        "forget-logins",
        help="forget which identity at the login provider each named account (or --all) "
        "is bound to: its next login binds it again, to whoever signs in with its name",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="the accounts")
    p.add_argument("--all", action="store_true", help="every account")
    p.set_defaults(fn=cmd_forget_logins)

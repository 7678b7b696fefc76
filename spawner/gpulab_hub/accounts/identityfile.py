"""The login identities file of gpulab before its database, imported once at the upgrade.

Before 0004_login_identities, each account's provider identity was a record of the
hub's folder, ``login-identities.json``::

    {"version": 1, "accounts": {"carol": {"provider": "oidc https://sso/realms/lab",
                                          "id": "<sub>", "since": 1790000000.0}}}

:class:`IdentitiesImport` (a ``db.migrate.Import``) copies every binding into the table
(identities.py) within the upgrade's transaction, then keeps the file as
``login-identities.json.imported``, the pre-upgrade backup. A damaged file stops the
upgrade with what to do, never imported as empty: an account without its binding would
be bound again to whoever signs in first with its name. So does a file of a newer
gpulab. Read bounded, never through a link.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables

IMPORT = "login-identities"  # its row in gpulab_imports
IMPORTED = ".imported"
KIND = stateversion.KINDS["login-identities"]
SECTION = "accounts"
MAX_BYTES = 64 * 1024 * 1024


def load(path: Path) -> dict:
    """The accounts of the file ``path`` (:func:`parse`), read bounded."""
    return parse(jsonfile.section_of(jsonfile.read_regular(path, MAX_BYTES), path, KIND, SECTION))


def parse(accounts) -> dict:
    """The file's accounts (its section); ValueError/TypeError where it is damaged."""
    if not isinstance(accounts, dict):
        raise TypeError('"accounts" is not a mapping')
    for name, rec in accounts.items():
        if not isinstance(name, str) or not 0 < len(name) <= tables.NAME_LEN:
            raise ValueError(f"{str(name)[:70]!r} is not an account's name")
        if not isinstance(rec, dict) or not all(
            isinstance(rec.get(k), str) and rec[k] for k in ("provider", "id")
        ):
            raise TypeError(f"the identity of {name} has no provider and id")
        if not isinstance(rec.get("since", 0), int | float):
            raise TypeError(f"the identity of {name} has no time it was bound")
    return accounts


class IdentitiesImport(migrate.FileImport):
    """The import of ``path`` (the hub's ``login-identities.json``) into the table."""

    name = IMPORT
    suffix = IMPORTED
    what = "the login identities"
    counted = "the login identities of {n} account(s)"

    def rows(self, conn: sa.Connection) -> tuple[int, list[str]]:
        try:
            accounts = parse(self.read(self.path, KIND, SECTION, MAX_BYTES))
        except (jsonfile.NotARecord, ValueError, TypeError, KeyError) as e:
            raise db_engine.DatabaseError(
                f"The login identities file {self.path} cannot be imported ({e}). Repair "
                "it (or restore it from a backup) and start again; only if every account "
                "may be bound again at its next login to whoever signs in first with its "
                "name, move it away instead."
            ) from None
        rows = [
            {"name": name, "provider": rec["provider"], "subject": rec["id"],
             "since": float(rec.get("since", self._clock()))}
            for name, rec in sorted(accounts.items())
        ]  # fmt: skip
        if rows:
            conn.execute(sa.insert(tables.login_identities), rows)
        return len(rows), []

"""The owner's choice of secrets for each project, as rename and delete see them
(records.py). The database keeps them (store.py): a choice names JupyterHub's server
row, so it follows a rename with the row and goes with the project's or the account's
deletion, in the same transaction; nothing here moves or forgets it, a rename only
names it among what moved. Left to do by hand: the secrets files of gpulab before its
database (importfile.py), from which an account's deletion removes its file too
(never archived)."""

from __future__ import annotations

import sqlalchemy as sa

from gpulab_hub import hubsettings, records
from gpulab_hub.db import tables
from gpulab_hub.secrets import importfile
from gpulab_hub.secrets import store as secret_store


def _has_choice(db, owner: str, project: str) -> bool:
    """Whether ``owner``'s ``project`` has a choice of secrets (JupyterHub's session)."""
    servers, users = tables.SPAWNERS, tables.USERS
    q = (
        sa.select(tables.secret_choices.c.server_id)
        .join(servers, servers.c.id == tables.secret_choices.c.server_id)
        .join(users, users.c.id == servers.c.user_id)
        .where(users.c.name == owner, servers.c.name == project)
    )
    return db.execute(q).first() is not None


class SecretChoiceRecords(records.Records):
    """Which of the owner's secrets each project gets; on an account's deletion, the
    old secrets file of gpulab before its database (removed, never archived)."""

    what = "choice of secrets"
    store = secret_store.SecretStore
    server = True  # kept by JupyterHub's server row: it has moved once the row has

    def _has(self, owner: str, project: str) -> bool:
        if self.where.db is None:
            return False
        return self.where.on_loop(_has_choice, self.where.db, owner, project)

    def move(self, owner: str, old: str, new: str) -> records.Undo | None:
        if not self._has(owner, new):
            return None
        return lambda: None  # the row carries it back as it is renamed back

    def holds(self, owner: str, project: str) -> bool:
        return self._has(owner, project)

    def forget_owner(self, owner: str) -> None:
        try:
            importfile.forget_user(self.where.records_dir, hubsettings.SECRETS, owner)
        except ValueError:
            return  # not an account name gpulab allows: it never had secrets
        except OSError as e:
            self.where.log.error("The old secrets file of %s was not removed: %s", owner, e)

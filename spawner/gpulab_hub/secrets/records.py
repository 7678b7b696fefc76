"""The owner's choice of secrets for each project, as rename and delete see them
(records.py). The database keeps them (store.py): a choice names JupyterHub's server
row, so it follows a rename with the row and goes with the project's or the account's
deletion, in the same transaction (records.ByServerRow). Left to do by hand: the
secrets files of gpulab before its database (importfile.py), from which an account's
deletion removes its file too (never archived)."""

from __future__ import annotations

from gpulab_hub import hubsettings, records
from gpulab_hub.db import tables
from gpulab_hub.secrets import importfile
from gpulab_hub.secrets import store as secret_store


class SecretChoiceRecords(records.ByServerRow):
    """Which of the owner's secrets each project gets; on an account's deletion, the
    old secrets file of gpulab before its database (removed, never archived)."""

    what = "choice of secrets"
    store = secret_store.SecretStore
    table = tables.secret_choices

    def forget_owner(self, owner: str) -> None:
        try:
            importfile.forget_user(self.where.records_dir, hubsettings.SECRETS, owner)
        except ValueError:
            return  # not an account name gpulab allows: it never had secrets
        except OSError as e:
            self.where.log.error("The old secrets file of %s was not removed: %s", owner, e)

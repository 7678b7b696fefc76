"""Each account's login identity, as delete sees it (records.py): kept per account in
the hub's database (identities.py), not per project, so only an account's deletion
forgets it. It is named by the account's name, not by foreign key (it is bound before
JupyterHub has the user's row), so the deletion removes it here, with gpulab's own
engine (records that live in JupyterHub's database: ``server``)."""

from __future__ import annotations

from gpulab_hub import records
from gpulab_hub.accounts import identities


class LoginIdentityRecords(records.Records):
    """A deleted account's name is free again: the next login with it makes a new
    account, bound to its own identity, with nothing of the old one."""

    what = "login identity"
    store = identities.IdentityStore
    per_project = False
    server = True  # in JupyterHub's database: ``where.db`` names it

    def forget_owner(self, owner: str) -> None:
        url = self.where.db_url
        if url is None:
            raise ValueError("forgetting a login identity needs the hub's database")
        identities.IdentityStore(url, self.where.log).forget(owner)

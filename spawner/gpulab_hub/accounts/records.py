"""Each account's login identity, as delete sees it (records.py): kept per account
(identities.py), not per project, so only an account's deletion forgets it."""

from __future__ import annotations

from pathlib import Path

from gpulab_hub import records
from gpulab_hub.accounts import identities


class LoginIdentityRecords(records.Records):
    """A deleted account's name is free again: the next login with it makes a new
    account, bound to its own identity, with nothing of the old one."""

    what = "login identity"
    store = identities.IdentityStore
    per_project = False

    def forget_owner(self, owner: str) -> None:
        path = Path(self.where.records_dir) / identities.FILE_NAME
        identities.IdentityStore(path, self.where.log).forget(owner)

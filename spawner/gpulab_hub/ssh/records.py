"""The SSH keys an account keeps on the hub, as delete sees them (records.py): kept per
owner (keys.py), not per project, so only an account's deletion takes them away."""

from __future__ import annotations

from gpulab_hub import records, ssh
from gpulab_hub.ssh.keys import KeyStore


class SshKeyRecords(records.Records):
    """A later account of the same name must not get in with these keys."""

    what = "SSH keys"
    store = KeyStore
    per_project = False

    def forget_owner(self, owner: str) -> None:
        KeyStore(ssh.paths(self.where.records_dir)["keys_dir"]).remove_all(owner)

"""The files of gpulab before its database that the upgrade imports into its tables
(db/migrate.py's ``Import``s), one list for the hub's start and ``gpulab upgrade-db``."""

from __future__ import annotations

from gpulab_hub.accounts import identities, identityfile
from gpulab_hub.db import migrate
from gpulab_hub.gpus import usagefile
from gpulab_hub.layout import Layout
from gpulab_hub.secrets import importfile
from gpulab_hub.sharing import policyfile


def of(layout: Layout) -> list[migrate.Import]:
    """The imports of the hub whose folders ``layout`` names, in the order they run."""
    return [
        usagefile.LedgerImport(layout.usage_file),
        importfile.SecretsImport(layout.secrets_dir),
        identityfile.IdentitiesImport(layout.records_dir / identities.FILE_NAME),
        policyfile.PolicyImport(layout.sharing_policy),
    ]

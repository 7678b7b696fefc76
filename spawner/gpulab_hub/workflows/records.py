"""The registry of per-project records: every store that names a project, once.

Rename moves each of them and delete forgets each of them, in this order; neither
names a store itself. A store that keys anything on (owner, project) implements
:class:`gpulab_hub.records.ProjectRecords` beside its own code and is listed here:
tests/test_project_records.py fails for a store that is not.
"""

from __future__ import annotations

from gpulab_hub import records
from gpulab_hub.accounts.records import LoginIdentityRecords
from gpulab_hub.cluster.records import JobsRecords
from gpulab_hub.gpus.records import GpuHoldingRecords
from gpulab_hub.secrets.records import SecretChoiceRecords
from gpulab_hub.sharing.records import (
    GroupShareRecords,
    LinkAccessRecords,
    PublicLinkRecords,
    SharingPolicyRecords,
)
from gpulab_hub.ssh.records import SshKeyRecords

REGISTRY: tuple[type[records.ProjectRecords], ...] = (
    PublicLinkRecords,
    SshKeyRecords,
    JobsRecords,
    GpuHoldingRecords,
    LinkAccessRecords,
    # server: in JupyterHub's database (after its server row, on a rename)
    LoginIdentityRecords,
    SharingPolicyRecords,
    SecretChoiceRecords,
    GroupShareRecords,
)


def of(where: records.Where) -> list[records.ProjectRecords]:
    """Every registered record, made for ``where``."""
    return [cls(where) for cls in REGISTRY]


def files(where: records.Where) -> list[records.ProjectRecords]:
    """The records kept in files only."""
    return [r for r in of(where) if not r.server]


def server(where: records.Where) -> list[records.ProjectRecords]:
    """The records that mirror JupyterHub's database (moved after the server row)."""
    return [r for r in of(where) if r.server]

"""The layout: where gpulab keeps things, and the names it gives Docker objects.

:class:`Layout` holds the hub's folders and files (projects, data, hub records, the
GPU allocation record, queue and ledger); hubsettings.py derives it from
``GPULAB_HOME`` and the admin's traits, and it is part of the settings
(``Settings.layout``, settings.py). The names of the files in the hub's records folder
and beside the GPU allocation record are here, each kept by one module.

Nothing here imports gpulab: this module sits at the bottom of the house.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Defaults of traits that other parts read too (the traits take them from here).
GPU_USAGE_WINDOW_S = 7 * 24 * 3600.0  # ProjectSpawner.gpu_usage_window: a week
GPU_USAGE_RETENTION_DAYS = 90.0  # ProjectSpawner.gpu_usage_retention_days
DRIVER_DIR = "/usr/local/nvidia"  # ProjectSpawner.driver_dir (GPULAB_DRIVER_DIR's default)

# Files in ``records_dir`` (the hub's folder), each kept by one module.
SHARING_POLICY = "sharing.json"
GROUP_SHARE_ROLES = "group-share-roles.json"
PUBLIC_LINKS = "public-links.json"
DOCTOR_REPORT = "doctor-last.json"
DELETED = "deleted"
SECRETS = "secrets"  # before the database, one file per user (secrets/importfile.py)
DATABASE = "jupyterhub.sqlite"  # the hub's database (JupyterHub's tables and gpulab's)


# Files beside the GPU allocation record, unless the traits say otherwise.
QUEUE = "gpu-queue.json"  # starts waiting for a GPU
USAGE = "gpu-usage.jsonl"  # ended GPU holdings


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of the SQLite database file ``path``."""
    return f"sqlite:///{path}"


@dataclass(frozen=True)
class Layout:
    """Where gpulab keeps things, and the names it gives Docker objects."""

    records_dir: Path  # hub-owned: sharing records, public links, doctor report, archives
    projects_root: Path
    data_root: Path
    state_root: Path
    allocations_file: Path
    image_repo: str
    base_image: str
    allowed_base_images: tuple[str, ...]  # what project Dockerfiles may name (policy.py)
    prefix: str
    network: str
    queue_file: Path | None = None  # None: QUEUE beside allocations_file
    usage_file: Path | None = None  # None: USAGE beside allocations_file
    usage_window: float = GPU_USAGE_WINDOW_S  # seconds budgets are measured over
    # seconds a usage record is kept after its holding ended (gpu_usage_retention_days)
    usage_retention: float = GPU_USAGE_RETENTION_DAYS * 24 * 3600.0
    # the hub's database (JupyterHub.db_url), where gpulab's tables live (db/); "": the
    # SQLite file DATABASE in records_dir
    db_url: str = ""
    budget_hours: tuple[tuple[str, float], ...] = ()  # ProjectSpawner.gpu_budget_hours
    driver_dir: str = DRIVER_DIR  # ProjectSpawner.driver_dir
    # how GPUs are granted: the allocator.Policy fields the ProjectSpawner gpu_* traits set
    # other than its defaults (gpu_policy, gpu_shared_cap, gpu_max_per_user, ...)
    allocation_policy: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for name, file in (("queue_file", QUEUE), ("usage_file", USAGE)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, Path(self.allocations_file).parent / file)
        if not self.db_url:
            object.__setattr__(self, "db_url", sqlite_url(Path(self.records_dir) / DATABASE))

    @property
    def sharing_policy(self) -> Path:
        return self.records_dir / SHARING_POLICY

    @property
    def group_share_roles(self) -> Path:
        return self.records_dir / GROUP_SHARE_ROLES

    @property
    def public_links(self) -> Path:
        return self.records_dir / PUBLIC_LINKS

    @property
    def doctor_report(self) -> Path:
        return self.records_dir / DOCTOR_REPORT

    @property
    def deleted_dir(self) -> Path:
        return self.records_dir / DELETED

    @property
    def secrets_dir(self) -> Path:
        return self.records_dir / SECRETS

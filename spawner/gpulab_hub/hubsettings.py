"""The layout: where gpulab keeps things, and what it names them.

Derived from ``GPULAB_HOME`` (:func:`default_layout`, which ``hubconfig.apply`` writes
into ``ProjectSpawner``'s traits), then moved wherever the admin's own
``c.ProjectSpawner.*`` lines move it. :class:`Layout` is read back from the hub's
configuration once, through ``ProjectSpawner``'s traits (so defaults and the admin's
overrides both count), and is part of the settings (``settings.Settings.layout``)
that the hub's pages (:func:`of_handler`), the ``gpulab`` command and the doctor
(:func:`load`) get. Nothing else derives these paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from traitlets.utils.importstring import import_item

from gpulab_hub.settings import DEFAULT, GPU_USAGE_WINDOW_S, parse

# Files in ``records_dir`` (the hub's folder), each kept by one module.
SHARING_POLICY = "sharing.json"
GROUP_SHARE_ROLES = "group-share-roles.json"
PUBLIC_LINKS = "public-links.json"
DOCTOR_REPORT = "doctor-last.json"
DELETED = "deleted"
SECRETS = "secrets"  # one file per user (secrets/store.py)


# Files beside the GPU allocation record, unless the traits say otherwise.
QUEUE = "gpu-queue.json"  # starts waiting for a GPU
USAGE = "gpu-usage.jsonl"  # ended GPU holdings


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
    budget_hours: tuple[tuple[str, float], ...] = ()  # ProjectSpawner.gpu_budget_hours
    driver_dir: str = DEFAULT.gpus.driver_dir  # ProjectSpawner.driver_dir

    def __post_init__(self) -> None:
        for name, file in (("queue_file", QUEUE), ("usage_file", USAGE)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, Path(self.allocations_file).parent / file)

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


def default_layout(home: str | Path) -> Layout:
    """The layout under ``home`` (GPULAB_HOME) where no trait moves anything."""
    hub = Path(home) / "hub"
    return Layout(
        records_dir=hub,
        projects_root=Path(home) / "projects",
        data_root=Path(home) / "data",
        state_root=hub / "projects",
        allocations_file=hub / "gpu-allocations.json",
        image_repo=DEFAULT.images.image_repo,
        base_image=DEFAULT.images.base_image,
        allowed_base_images=(DEFAULT.images.base_image,),
        prefix=DEFAULT.prefix,
        network=DEFAULT.network_name,
    )


def spawner_of(config, spawner_class=None):
    """The hub's spawner (``JupyterHub.spawner_class``, gpulab's ProjectSpawner by
    default) with this (traitlets) configuration: its traits are the settings."""
    if spawner_class is None:
        name = config.JupyterHub.get("spawner_class", "gpulab_hub.spawner.ProjectSpawner")
        spawner_class = import_item(name) if isinstance(name, str) else name
    return spawner_class(config=config)


def from_spawner(sp) -> Layout:
    """The layout of a spawner made by :func:`spawner_of`."""
    return Layout(
        records_dir=Path(sp.records_dir),
        projects_root=Path(sp.projects_root),
        data_root=Path(sp.data_root),
        state_root=Path(sp.state_root),
        allocations_file=Path(sp.allocations_file),
        image_repo=sp.image_repo,
        base_image=sp.base_image,
        allowed_base_images=tuple(sp.allowed_base_images),
        prefix=sp.prefix,
        network=sp.network_name,
        queue_file=Path(sp.queue_file),
        usage_file=Path(sp.usage_file),
        usage_window=float(sp.gpu_usage_window),
        budget_hours=tuple(sorted(sp.gpu_budget_hours.items())),
        driver_dir=str(sp.driver_dir),
    )


def from_config(config, spawner_class=None) -> Layout:
    """The layout a hub with this (traitlets) configuration uses: its spawner's
    traits (``JupyterHub.spawner_class``, gpulab's ProjectSpawner)."""
    return from_spawner(spawner_of(config, spawner_class))


def of_handler(handler) -> Layout:
    """The running hub's layout, for one of its pages (its settings': read once)."""
    from gpulab_hub import settings

    return settings.of_handler(handler).layout


def config_file() -> Path:
    """The hub's jupyterhub_config.py: in the checkout gpulab runs from (next to
    its ``images/``), else in the working folder (the hub image's layout)."""
    here = Path(__file__).resolve().parents[2]
    if (here / "jupyterhub_config.py").exists():
        return here / "jupyterhub_config.py"
    return Path.cwd() / "jupyterhub_config.py"


def read_config(config_file: Path):
    """The (traitlets) configuration ``config_file`` (the hub's jupyterhub_config.py)
    gives, read as the hub reads it, with this process's environment."""
    from traitlets.config.loader import PyFileConfigLoader

    # The command never listens for containers: spare the config file asking Docker
    # where the hub's API should listen (hubconfig.with_hub_ip).
    placeholder = not parse(os.environ).hub_ip
    if placeholder:
        os.environ["GPULAB_HUB_IP"] = "127.0.0.1"
    umask = os.umask(0o077)  # the config file makes the hub's umask; keep this process's
    try:
        loader = PyFileConfigLoader(config_file.name, path=str(config_file.parent))
        return loader.load_config()
    finally:
        os.umask(umask)
        if placeholder:
            del os.environ["GPULAB_HUB_IP"]


def load(config_file: Path) -> Layout:
    """The layout of the hub that ``config_file`` (its jupyterhub_config.py)
    configures, read as the hub reads it, with this process's environment."""
    return from_config(read_config(config_file))

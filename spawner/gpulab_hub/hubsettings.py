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
from pathlib import Path

from traitlets.utils.importstring import import_item

# The layout's type and the names of the hub's record files are layout.py's (the
# layout is part of the settings); this module derives the layout.
from gpulab_hub.layout import (
    DELETED,
    DOCTOR_REPORT,
    GROUP_SHARE_ROLES,
    PUBLIC_LINKS,
    QUEUE,
    SECRETS,
    SHARING_POLICY,
    USAGE,
    Layout,
)
from gpulab_hub.settings import DEFAULT, parse

__all__ = [
    "DELETED", "DOCTOR_REPORT", "GROUP_SHARE_ROLES", "PUBLIC_LINKS", "QUEUE", "SECRETS",
    "SHARING_POLICY", "USAGE", "Layout", "config_file", "db_url_of", "default_layout",
    "from_config",
    "from_spawner", "load", "of_handler", "read_config", "spawner_of",
]  # fmt: skip


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


def db_url_of(config) -> str:
    """The hub's database, ``JupyterHub.db_url`` in the hub's configuration (gpulab's
    sets it: hubconfig.apply); "" where it is not set (the layout then has the SQLite
    file in its records folder, where gpulab's configuration puts it)."""
    url = config.JupyterHub.get("db_url") if "JupyterHub" in config else None
    return url if isinstance(url, str) else ""


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
        usage_retention=float(sp.gpu_usage_retention_days) * 24 * 3600.0,
        db_url=db_url_of(sp.config),
        budget_hours=tuple(sorted(sp.gpu_budget_hours.items())),
        driver_dir=str(sp.driver_dir),
        allocation_policy=_changed(sp),
    )


# allocator.Policy's fields and the ProjectSpawner traits that set them (gpus.spawner's
# policy_of reads the same traits; tests/test_hubsettings.py checks both agree)
POLICY_TRAITS = (
    ("mode", "gpu_policy"),
    ("shared_cap", "gpu_shared_cap"),
    ("max_per_user", "gpu_max_per_user"),
    ("max_per_project", "gpu_max_per_project"),
    ("allowed_types", "gpu_allowed_types"),
    ("allow_mig", "gpu_allow_mig"),
)


def _changed(sp) -> tuple[tuple[str, object], ...]:
    """The allocator.Policy fields whose traits ``sp`` sets to other than their defaults."""
    out = []
    for field, trait in POLICY_TRAITS:
        value, default = getattr(sp, trait), sp.trait_defaults(trait)
        if value != default:
            out.append((field, tuple(value) if isinstance(value, list) else value))
    return tuple(out)


def from_config(config, spawner_class=None) -> Layout:
    """The layout a hub with this (traitlets) configuration uses: its spawner's
    traits (``JupyterHub.spawner_class``, gpulab's ProjectSpawner)."""
    return from_spawner(spawner_of(config, spawner_class))


def of_handler(handler) -> Layout:
    """The running hub's layout, for one of its pages: its settings' (hubconfig.finish
    put them in the tornado settings; a hub configured otherwise reads its
    configuration once, here)."""
    import dataclasses

    from gpulab_hub import settings

    app = handler.settings
    if settings.APP_KEY not in app:
        app[settings.APP_KEY] = dataclasses.replace(
            parse(os.environ),
            layout=from_config(app["config"], app.get("spawner_class")),
        )
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

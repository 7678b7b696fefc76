"""One source of truth: where gpulab keeps things comes from the hub's configuration,
the admin's own lines included, for the hub's pages, the command and the doctor."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import REPO

from gpulab_hub import hubsettings


def config_copy(tmp_path: Path, extra: str = "") -> Path:
    """The repository's jupyterhub_config.py, as an admin would extend it."""
    shutil.copytree(REPO / "images", tmp_path / "images")
    config = tmp_path / "jupyterhub_config.py"
    config.write_text((REPO / "jupyterhub_config.py").read_text() + extra)
    return config


def test_paths_follow_the_site_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    s = hubsettings.load(config_copy(tmp_path))
    home = tmp_path / "home"
    assert s.projects_root == home / "projects"
    assert s.data_root == home / "data"
    assert s.state_root == home / "hub" / "projects"
    assert s.records_dir == home / "hub"
    assert s.allocations_file == home / "hub" / "gpu-allocations.json"
    assert s.sharing_policy == home / "hub" / "sharing.json"
    assert s.network == "gpulab-net"
    assert s.driver_dir == "/usr/local/nvidia"


def test_the_admins_own_lines_win(tmp_path, monkeypatch):
    """An admin who moves projects in jupyterhub_config.py moves them for every part."""
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    extra = (
        "\nc.ProjectSpawner.projects_root = '/mnt/big/projects'"
        "\nc.ProjectSpawner.records_dir = '/var/lib/gpulab'"
        "\nc.ProjectSpawner.allocations_file = '/var/lib/gpulab/gpus.json'"
        "\nc.ProjectSpawner.driver_dir = '/opt/nvidia-driver'\n"
    )
    s = hubsettings.load(config_copy(tmp_path, extra))
    assert s.projects_root == Path("/mnt/big/projects")
    assert s.public_links == Path("/var/lib/gpulab/public-links.json")
    assert s.allocations_file == Path("/var/lib/gpulab/gpus.json")
    assert s.driver_dir == "/opt/nvidia-driver"  # the doctor checks the folder projects get
    assert s.data_root == tmp_path / "home" / "data"  # what the admin left alone stays


def test_reading_the_settings_leaves_the_process_as_it_was(tmp_path, monkeypatch):
    """The command reads the hub's configuration without asking Docker where the hub
    listens and without keeping the hub's umask or a placeholder address."""
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPULAB_HUB_IP", raising=False)
    import os

    before = os.umask(0o022)
    try:
        hubsettings.load(config_copy(tmp_path))
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)
    assert "GPULAB_HUB_IP" not in os.environ


def test_hub_pages_read_the_running_hubs_configuration(tmp_path):
    """Save a copy, public links, sharing and the doctor's page find projects and records
    where the hub's configuration (admin's lines included) puts them, read once."""
    from traitlets.config import Config

    from gpulab_hub.spawner import ProjectSpawner

    config = Config()
    config.ProjectSpawner.projects_root = str(tmp_path / "elsewhere")
    config.ProjectSpawner.records_dir = str(tmp_path / "records")

    class Page:  # what a JupyterHub handler offers: the tornado application's settings
        settings = {"config": config, "spawner_class": ProjectSpawner}

    first = hubsettings.of_handler(Page())
    assert first.projects_root == tmp_path / "elsewhere"
    assert first.sharing_policy == tmp_path / "records" / "sharing.json"
    assert first.doctor_report == tmp_path / "records" / "doctor-last.json"
    assert hubsettings.of_handler(Page()) is first  # built once per hub


def test_the_keeper_grants_with_the_spawners_gpu_policy():
    """The keeper's allocator policy (the layout's allocation_policy) is the one the
    spawner grants with, for defaults and for an admin's gpu_* lines alike."""
    from traitlets.config import Config

    from gpulab_hub.gpus import keeper
    from gpulab_hub.gpus import spawner as gpu_spawner

    c = Config()
    assert keeper.policy_of(hubsettings.from_config(c).allocation_policy) == (
        gpu_spawner.policy_of(hubsettings.spawner_of(c))
    )
    c.ProjectSpawner.gpu_policy = "shared"
    c.ProjectSpawner.gpu_shared_cap = 3
    c.ProjectSpawner.gpu_max_per_user = 1
    c.ProjectSpawner.gpu_max_per_project = 2
    c.ProjectSpawner.gpu_allowed_types = ["NVIDIA H200"]
    c.ProjectSpawner.gpu_allow_mig = False
    sp = hubsettings.spawner_of(c)
    policy = keeper.policy_of(hubsettings.from_spawner(sp).allocation_policy)
    assert policy == gpu_spawner.policy_of(sp)
    assert (policy.mode, policy.max_per_user, policy.allowed_types) == (
        "shared",
        1,
        ("NVIDIA H200",),
    )

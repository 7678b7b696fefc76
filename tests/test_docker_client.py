"""One Docker client factory: the hub's spawner, the command and the doctor all reach
the engine DOCKER_HOST names (as DockerSpawner's users expect), never another one."""

import os

import pytest

from gpulab_hub import host
from gpulab_hub.doctor import docker_checks
from gpulab_hub.spawner import ProjectSpawner

pytestmark = pytest.mark.docker


def test_every_part_reaches_the_engine_docker_host_names(docker_engine, tmp_path, monkeypatch):
    # The same engine under another address: only a client that reads DOCKER_HOST finds it.
    socket = tmp_path / "engine.sock"
    os.symlink("/var/run/docker.sock", socket)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    monkeypatch.setattr(ProjectSpawner, "_client", None)
    clients = {
        "spawner": ProjectSpawner().client,
        "command": host.Docker().client,
        "doctor": docker_checks.doctor_docker().client,
    }
    for name, c in clients.items():
        assert c._custom_adapter.socket_path == str(socket), name
        assert c.ping(), name
    assert clients["doctor"].timeout == docker_checks.CALL_TIMEOUT  # a hung engine: short
    monkeypatch.setattr(ProjectSpawner, "_client", None)

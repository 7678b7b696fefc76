"""`gpulab doctor` says which protections are active (recorded Docker answers), and the
spawner refuses settings that would bypass them."""

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpulab_hub.doctor import protections
from gpulab_hub.doctor.findings import FAIL, OK, WARN
from gpulab_hub.projects import ProjectError
from gpulab_hub.spawner import ProjectSpawner

REMAPPED = {
    "SecurityOptions": ["name=seccomp,profile=builtin", "name=userns"],
    "DockerRootDir": "/var/lib/docker/100000.100000",
    "PidsLimit": True,
    "MemoryLimit": True,
    "CpuCfsQuota": True,
}
PLAIN = {"SecurityOptions": ["name=seccomp,profile=builtin"], "DockerRootDir": "/var/lib/docker"}
HARDENED = {
    "Name": "/gpulab-alice--one",
    "Config": {"User": "1000:100"},
    "HostConfig": {
        "NetworkMode": "gpulab-net",
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
    },
}


def test_userns_on_and_off():
    on = protections.check_userns(REMAPPED)
    assert on.status == OK and "host uid 101000" in on.seen
    off = protections.check_userns(PLAIN)
    assert off.status == WARN and "userns-remap" in off.fix


def test_an_engine_without_gpulabs_build_runtime_fails_with_the_fix():
    confined = {"DefaultRuntime": "gpulab", "Runtimes": {"gpulab": {}, "runc": {}}}
    assert protections.check_builds(confined).status == OK
    f = protections.check_builds({"DefaultRuntime": "runc", "Runtimes": {"runc": {}}})
    assert f.status == FAIL and "'runc'" in f.seen and "gpulab-build-runtime" in f.fix


def test_missing_cgroup_controllers_are_named():
    assert protections.check_kernel_limits(REMAPPED).status == OK
    f = protections.check_kernel_limits({**REMAPPED, "PidsLimit": False})
    assert f.status == WARN and "process" in f.seen


def test_network_must_be_a_bridge_without_inter_container_traffic():
    good = {"Driver": "bridge", "Options": {"com.docker.network.bridge.enable_icc": "false"}}
    assert protections.check_network(good, "gpulab-net").status == OK
    assert protections.check_network({"Driver": "bridge"}, "gpulab-net").status == WARN
    assert protections.check_network({"Driver": "host"}, "gpulab-net").status == FAIL
    assert protections.check_network(None, "gpulab-net").status == WARN


def test_a_container_without_the_hardening_is_named():
    assert protections.check_containers([HARDENED]).status == OK
    weak = {
        "Name": "/gpulab-bob--old",
        "Config": {"User": ""},
        "HostConfig": {"NetworkMode": "host", "CapDrop": None, "SecurityOpt": None},
    }
    f = protections.check_containers([HARDENED, weak])
    assert f.status == FAIL
    assert "gpulab-bob--old" in f.seen and "network host" in f.seen
    assert "gpulab-alice--one" not in f.seen


@pytest.mark.parametrize(
    "name,value",
    [
        ("volumes", {"/": "/host"}),
        ("extra_host_config", {"network_mode": "host", "privileged": True}),
        ("extra_create_kwargs", {"user": "root"}),
        ("mounts", [{"source": "/", "target": "/host", "type": "bind"}]),
    ],
)
def test_docker_settings_gpulab_does_not_apply_are_refused_not_ignored(name, value):
    """An admin who sets a DockerSpawner setting the hardened spec would not apply
    is told so at the project's start, instead of it being silently dropped."""
    c = Config()
    setattr(c.DockerSpawner, name, value)
    with pytest.raises(ProjectError, match=f"c.ProjectSpawner.{name} .*does not apply"):
        ProjectSpawner(config=c)._refuse_unapplied_settings()
    ProjectSpawner(config=Config())._refuse_unapplied_settings()  # nothing set: fine


@pytest.mark.parametrize("network", ["host", "none"])
def test_the_spawner_refuses_host_networking(network):
    c = Config()
    c.ProjectSpawner.network_name = network
    with pytest.raises(TraitError, match="bridge network of its own"):
        ProjectSpawner(config=c).network_name  # noqa: B018 (reading applies the config)

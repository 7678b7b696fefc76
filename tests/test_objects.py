"""Whole container specs from the pure functions in gpulab_hub.projects.objects."""

import pytest

from gpulab_hub.projects.objects import (
    ContainerInputs,
    GpuAssignment,
    container_spec,
    data_folders,
    detect_isolation,
    group_folder,
    userns_offset,
    valid_group,
)


def settings(**overrides) -> ContainerInputs:
    base = dict(
        name="gpulab-alice--vision",
        image="gpulab/project:0123456789abcdef",
        command=["jupyterhub-singleuser", "--notebook-dir=/workspace"],
        env={"JUPYTERHUB_API_TOKEN": "t0k3n", "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/"},
        project_dir="/srv/gpulab/projects/alice/vision",
        data_root="/srv/gpulab/data",
        hf_cache_volume="gpulab-hf-alice",
        network="gpulab-net",
        port=8888,
        owner="alice",
        labels={"gpulab.instance": "gpulab", "gpulab.owner": "alice", "gpulab.project": "vision"},
        data_scope="project",  # ProjectSpawner.data_scope's default
    )
    base.update(overrides)
    return ContainerInputs(**base)


# The project's own data folders and cache: nothing of alice's other projects.
MINE = "/srv/gpulab/data/projects/alice/vision"
EXPECTED_BINDS = {
    "/srv/gpulab/projects/alice/vision": {"bind": "/workspace", "mode": "rw"},
    "/srv/gpulab/data/datasets": {"bind": "/data/datasets", "mode": "ro"},
    f"{MINE}/models": {"bind": "/data/models", "mode": "rw"},
    f"{MINE}/outputs": {"bind": "/data/outputs", "mode": "rw"},
    f"{MINE}/huggingface": {"bind": "/cache/huggingface", "mode": "rw"},
}
# data_scope "user" (the admin's choice): the user's folders and volume in every project.
USER_BINDS = {
    "/srv/gpulab/projects/alice/vision": {"bind": "/workspace", "mode": "rw"},
    "/srv/gpulab/data/datasets": {"bind": "/data/datasets", "mode": "ro"},
    "/srv/gpulab/data/models/alice": {"bind": "/data/models", "mode": "rw"},
    "/srv/gpulab/data/outputs/alice": {"bind": "/data/outputs", "mode": "rw"},
    "gpulab-hf-alice": {"bind": "/cache/huggingface", "mode": "rw"},
}
EXPECTED_ENV = {
    "JUPYTERHUB_API_TOKEN": "t0k3n",
    "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/",
    "GPULAB_WORKSPACE": "/workspace",
    "GPULAB_PROJECT_DIR": "/workspace",
    "GPULAB_DATA": "/data",
    "HF_HOME": "/cache/huggingface",
    "HF_TOKEN_PATH": "/tmp/gpulab-huggingface/token",  # never in a mounted folder
    "NVIDIA_VISIBLE_DEVICES": "void",
    "CUDA_VISIBLE_DEVICES": "",
}
EXPECTED_VOLUMES = [
    "/cache/huggingface",
    "/data/datasets",
    "/data/models",
    "/data/outputs",
    "/workspace",
]
# What every project container gets whatever its Dockerfile says.
HARDENED = {
    "network_mode": "gpulab-net",
    "port_bindings": {},
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
}


def test_project_spec_on_the_bridge_network():
    spec = container_spec(settings(shm_size="16g", pids_limit=4096))
    assert spec == {
        "name": "gpulab-alice--vision",
        "hostname": "vision",  # a terminal's prompt: jovyan@vision, not a container ID
        "image": "gpulab/project:0123456789abcdef",
        "command": ["jupyterhub-singleuser", "--notebook-dir=/workspace"],
        "environment": EXPECTED_ENV,
        "labels": {
            "gpulab.instance": "gpulab",
            "gpulab.owner": "alice",
            "gpulab.project": "vision",
        },
        "user": "1000:100",
        "working_dir": "/workspace",
        "volumes": EXPECTED_VOLUMES,
        "ports": {"8888/tcp": None},
        "host_config": {
            **HARDENED,
            "binds": EXPECTED_BINDS,
            "shm_size": "16g",
            "pids_limit": 4096,
        },
    }


@pytest.mark.parametrize("network", ["host", "none", ""])
def test_host_and_no_network_are_refused(network):
    with pytest.raises(ValueError, match="bridge network of its own"):
        container_spec(settings(network=network))


def test_a_project_needs_its_owner_for_the_data_folders():
    with pytest.raises(ValueError, match="owner"):
        container_spec(settings(owner=""))


def test_each_project_has_its_own_data_folders_and_cache():
    other = settings(name="gpulab-alice--nlp", project_dir="/srv/gpulab/projects/alice/nlp")
    mine, theirs = container_spec(settings()), container_spec(other)
    assert data_folders(settings()) == [f"{MINE}/models", f"{MINE}/outputs", f"{MINE}/huggingface"]
    shared = set(mine["host_config"]["binds"]) & set(theirs["host_config"]["binds"])
    assert shared == {"/srv/gpulab/data/datasets"}  # read-only for everyone
    assert theirs["host_config"]["binds"]["/srv/gpulab/data/projects/alice/nlp/huggingface"] == {
        "bind": "/cache/huggingface",
        "mode": "rw",
    }
    assert theirs["volumes"] == mine["volumes"] == EXPECTED_VOLUMES


def test_the_per_user_layout_when_the_admin_chooses_it():
    s = settings(data_scope="user")
    assert container_spec(s)["host_config"]["binds"] == USER_BINDS
    assert data_folders(s) == ["/srv/gpulab/data/models/alice", "/srv/gpulab/data/outputs/alice"]
    # Even then the login token goes to no folder that other projects mount.
    assert container_spec(s)["environment"]["HF_TOKEN_PATH"] == "/tmp/gpulab-huggingface/token"


@pytest.mark.parametrize(
    "bad",
    [
        {"data_scope": "everyone"},
        {"data_scope": ""},
        {"project_dir": "/srv/gpulab/projects/alice/.."},
        {"project_dir": "/srv/gpulab/projects/alice/Vision"},
        {"owner": ".."},
        {"owner": "a/b"},
        {"project_dir": "/srv/gpulab/projects/alice/x\n"},
    ],
)
def test_an_unknown_scope_or_a_project_folder_not_named_as_a_project_is_refused(bad):
    with pytest.raises(ValueError):
        container_spec(settings(**bad))


@pytest.mark.parametrize("scope", ["project", "user"])
def test_everyones_data_readable_and_group_folders_when_the_admin_says_so(scope):
    s = settings(data_scope=scope, data_read_all=True, data_groups=("vision-lab",))
    assert container_spec(s)["host_config"]["binds"] == {
        **(EXPECTED_BINDS if scope == "project" else USER_BINDS),
        "/srv/gpulab/data/models": {"bind": "/data/all/models", "mode": "ro"},
        "/srv/gpulab/data/outputs": {"bind": "/data/all/outputs", "mode": "ro"},
        "/srv/gpulab/data/groups/vision-lab": {"bind": "/data/groups/vision-lab", "mode": "rw"},
    }
    assert data_folders(s)[-1] == "/srv/gpulab/data/groups/vision-lab"


@pytest.mark.parametrize(
    "name,ok",
    [
        ("vision-lab", True),
        ("a", True),
        ("..", False),
        ("a/b", False),
        ("lab\n", False),
        ("-x", False),
        ("a..b", False),
        ("x" * 65, False),
    ],
)
def test_group_folder_names_are_full_matches(name, ok):
    assert valid_group(name) is ok


def test_keycloak_group_paths_keep_folders_of_their_own():
    # Keycloak's "Full group path": two teams of one last name stay two folders, neither
    # a plain group's nor inside another's
    names = ["/staff/gpu-team", "/students/gpu-team", "/staff", "staff", "gpu-team"]
    folders = [group_folder(n) for n in names]
    assert folders == ["+staff+gpu-team", "+students+gpu-team", "+staff", "staff", "gpu-team"]
    for bad in ("/staff/../x", "/staff//x", "/", "staff/gpu-team", "/a+b/c", "/" + "x" * 65):
        assert group_folder(bad) is None, bad


def test_userns_offset_from_docker_info():
    remapped = {
        "SecurityOptions": ["name=seccomp,profile=builtin", "name=userns"],
        "DockerRootDir": "/var/lib/docker/100000.100000",
    }
    assert userns_offset(remapped) == (100000, 100000)
    assert userns_offset({"SecurityOptions": [], "DockerRootDir": "/var/lib/docker"}) == (0, 0)
    with pytest.raises(ValueError):
        userns_offset({"SecurityOptions": ["name=userns"], "DockerRootDir": "/var/lib/docker"})


def test_limits_and_custom_mount_points():
    spec = container_spec(
        settings(
            mem_limit=8 * 2**30,
            cpu_limit=2.5,
            workspace="/home/jovyan/work",
            data_mount="/mnt/data",
            hf_cache_mount="/hf",
        )
    )
    assert spec["host_config"] == {
        **HARDENED,
        "binds": {
            "/srv/gpulab/projects/alice/vision": {"bind": "/home/jovyan/work", "mode": "rw"},
            "/srv/gpulab/data/datasets": {"bind": "/mnt/data/datasets", "mode": "ro"},
            f"{MINE}/models": {"bind": "/mnt/data/models", "mode": "rw"},
            f"{MINE}/outputs": {"bind": "/mnt/data/outputs", "mode": "rw"},
            f"{MINE}/huggingface": {"bind": "/hf", "mode": "rw"},
        },
        "shm_size": "8g",
        "mem_limit": 8 * 2**30,
        "cpu_period": 100_000,
        "cpu_quota": 250_000,
    }
    assert spec["working_dir"] == "/home/jovyan/work"
    assert spec["environment"]["HF_HOME"] == "/hf"
    assert spec["environment"]["GPULAB_DATA"] == "/mnt/data"


def test_hostname_is_the_project_name_as_one_dns_label():
    # the longest project name (30 characters) is a DNS label too
    longest = "a" + "b-" * 14 + "c"
    for project in ("first", "alice-first", "p2", longest):
        spec = container_spec(settings(project_dir=f"/srv/gpulab/projects/alice/{project}"))
        assert spec["hostname"] == project
        assert len(spec["hostname"]) <= 63
    # a folder that names no project gives no hostname of it (Docker picks one)
    for folder in ("/nonexistent/Not_A_Label", "/srv/x/-bad", "/srv/x/a.b", "/srv/x/" + "a" * 64):
        spec = container_spec(settings(project_dir=folder, data_scope="user"))
        assert "hostname" not in spec


def test_spec_does_not_alias_its_inputs():
    s = settings()
    spec = container_spec(s)
    spec["environment"]["EXTRA"] = "1"
    spec["labels"]["x"] = "y"
    spec["command"].append("--debug")
    assert "EXTRA" not in s.env and "x" not in s.labels and "--debug" not in s.command


H100 = "GPU-1f2e3d4c-0000-1111-2222-333344445555"
H100_B = "GPU-9a8b7c6d-0000-1111-2222-333344446666"


def test_gpu_spec_with_the_nvidia_runtime():
    gpus = GpuAssignment(uuids=(H100, H100_B), minors=(0, 3), isolation="runtime")
    spec = container_spec(settings(gpus=gpus))
    assert spec["host_config"] == {
        **HARDENED,
        "binds": EXPECTED_BINDS,
        "shm_size": "8g",
        "device_requests": [
            {
                "driver": "nvidia",
                "device_ids": [H100, H100_B],
                "capabilities": [["gpu", "compute", "utility"]],
            }
        ],
    }
    assert spec["environment"] == {
        **EXPECTED_ENV,
        "NVIDIA_VISIBLE_DEVICES": f"{H100},{H100_B}",
        "CUDA_VISIBLE_DEVICES": f"{H100},{H100_B}",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


def test_gpu_spec_with_explicit_device_nodes():
    gpus = GpuAssignment(uuids=(H100_B,), minors=(3,), isolation="devices")
    spec = container_spec(settings(gpus=gpus))
    assert spec["host_config"] == {
        "binds": {
            **EXPECTED_BINDS,
            "/usr/local/nvidia": {"bind": "/usr/local/nvidia", "mode": "ro"},
        },
        **HARDENED,
        "shm_size": "8g",
        "devices": [
            "/dev/nvidia3:/dev/nvidia3:rwm",
            "/dev/nvidiactl:/dev/nvidiactl:rwm",
            "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
            "/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rwm",
        ],
    }
    assert spec["environment"] == {
        **EXPECTED_ENV,
        "NVIDIA_VISIBLE_DEVICES": H100_B,
        "CUDA_VISIBLE_DEVICES": H100_B,
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64",
    }
    assert "/usr/local/nvidia" in spec["volumes"]


def test_detect_isolation(tmp_path):
    assert detect_isolation({"Runtimes": {"runc": {}, "nvidia": {}}}, str(tmp_path)) == "runtime"
    assert detect_isolation({"Runtimes": {"runc": {}}}, str(tmp_path)) == "none"
    (tmp_path / "nvidiactl").touch()
    assert detect_isolation({"Runtimes": {"runc": {}}}, str(tmp_path)) == "devices"

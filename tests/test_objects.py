"""Whole container specs from the pure functions in gpulab_hub.objects."""

from gpulab_hub.objects import ContainerSettings, GpuAssignment, container_spec, detect_isolation


def settings(**overrides) -> ContainerSettings:
    base = dict(
        name="gpulab-alice--vision",
        image="gpulab/project:0123456789abcdef",
        command=["jupyterhub-singleuser", "--notebook-dir=/workspace"],
        env={"JUPYTERHUB_API_TOKEN": "t0k3n", "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:40123/"},
        project_dir="/srv/gpulab/projects/alice/vision",
        data_root="/srv/gpulab/data",
        hf_cache_volume="gpulab-hf-alice",
        network="host",
        port=40123,
        labels={"gpulab.instance": "gpulab", "gpulab.owner": "alice", "gpulab.project": "vision"},
    )
    base.update(overrides)
    return ContainerSettings(**base)


EXPECTED_BINDS = {
    "/srv/gpulab/projects/alice/vision": {"bind": "/workspace", "mode": "rw"},
    "/srv/gpulab/data/datasets": {"bind": "/data/datasets", "mode": "ro"},
    "/srv/gpulab/data/models": {"bind": "/data/models", "mode": "rw"},
    "/srv/gpulab/data/outputs": {"bind": "/data/outputs", "mode": "rw"},
    "gpulab-hf-alice": {"bind": "/cache/huggingface", "mode": "rw"},
}
EXPECTED_ENV = {
    "JUPYTERHUB_API_TOKEN": "t0k3n",
    "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:40123/",
    "GPULAB_WORKSPACE": "/workspace",
    "GPULAB_PROJECT_DIR": "/workspace",
    "GPULAB_DATA": "/data",
    "HF_HOME": "/cache/huggingface",
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


def test_host_network_spec():
    assert container_spec(settings()) == {
        "name": "gpulab-alice--vision",
        "image": "gpulab/project:0123456789abcdef",
        "command": ["jupyterhub-singleuser", "--notebook-dir=/workspace"],
        "environment": EXPECTED_ENV,
        "labels": {
            "gpulab.instance": "gpulab",
            "gpulab.owner": "alice",
            "gpulab.project": "vision",
        },
        "working_dir": "/workspace",
        "volumes": EXPECTED_VOLUMES,
        "host_config": {
            "binds": EXPECTED_BINDS,
            "network_mode": "host",
            "shm_size": "8g",
        },
    }


def test_user_defined_network_spec():
    spec = container_spec(settings(network="gpulab-net", port=8888, shm_size="16g"))
    assert spec == {
        "name": "gpulab-alice--vision",
        "image": "gpulab/project:0123456789abcdef",
        "command": ["jupyterhub-singleuser", "--notebook-dir=/workspace"],
        "environment": EXPECTED_ENV,
        "labels": {
            "gpulab.instance": "gpulab",
            "gpulab.owner": "alice",
            "gpulab.project": "vision",
        },
        "working_dir": "/workspace",
        "volumes": EXPECTED_VOLUMES,
        "ports": {"8888/tcp": None},
        "host_config": {
            "binds": EXPECTED_BINDS,
            "network_mode": "gpulab-net",
            "shm_size": "16g",
            "port_bindings": {},
        },
    }


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
        "binds": {
            "/srv/gpulab/projects/alice/vision": {"bind": "/home/jovyan/work", "mode": "rw"},
            "/srv/gpulab/data/datasets": {"bind": "/mnt/data/datasets", "mode": "ro"},
            "/srv/gpulab/data/models": {"bind": "/mnt/data/models", "mode": "rw"},
            "/srv/gpulab/data/outputs": {"bind": "/mnt/data/outputs", "mode": "rw"},
            "gpulab-hf-alice": {"bind": "/hf", "mode": "rw"},
        },
        "network_mode": "host",
        "shm_size": "8g",
        "mem_limit": 8 * 2**30,
        "cpu_period": 100_000,
        "cpu_quota": 250_000,
    }
    assert spec["working_dir"] == "/home/jovyan/work"
    assert spec["environment"]["HF_HOME"] == "/hf"
    assert spec["environment"]["GPULAB_DATA"] == "/mnt/data"


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
        "binds": EXPECTED_BINDS,
        "network_mode": "host",
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
        "network_mode": "host",
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

"""Whole container specs from the pure functions in gpulab_hub.objects."""

from gpulab_hub.objects import ContainerSettings, container_spec


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

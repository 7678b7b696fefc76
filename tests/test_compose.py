"""compose.yml, as Debian's docker-compose reads it."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def compose_config(env: dict) -> dict:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is missing: the README's test command installs it")
    done = subprocess.run(
        [exe, "-f", str(REPO / "compose.yml"), "config"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


SITE = {"GPULAB_SUBDOMAIN_HOST": "https://lab.example.org"}


def test_compose_file_is_valid_and_wires_the_hub():
    cfg = compose_config(SITE)
    hub = cfg["services"]["hub"]
    assert hub["build"]["dockerfile"] == "images/hub.Dockerfile"
    assert (REPO / "images" / "hub.Dockerfile").exists()
    # The hub image starts FROM Debian bookworm (slim) unless GPULAB_HUB_BASE says otherwise.
    assert hub["build"]["args"] == {"BASE": "debian:bookworm-slim"}
    assert "/var/run/docker.sock:/var/run/docker.sock:rw" in hub["volumes"]
    # project folders must mean the same path on the host and in the hub
    assert "/srv/gpulab:/srv/gpulab:rw" in hub["volumes"]
    assert hub["environment"]["GPULAB_HOME"] == "/srv/gpulab"
    # Projects join gpulab's bridge (made by `gpulab up`); the trusted hub shares the
    # host's network and ids, and listens on loopback by default (a reverse proxy
    # terminates TLS).
    assert hub["environment"]["GPULAB_NETWORK"] == "gpulab"
    assert hub["network_mode"] == "host" and hub["userns_mode"] == "host"
    assert hub["environment"]["GPULAB_BIND_URL"] == "http://127.0.0.1:8000"
    assert "ports" not in hub and "networks" not in cfg
    # SSH into projects cannot pass a reverse proxy: the gateway listens on the host's
    # interfaces, on its own port (ssh/).
    assert hub["environment"]["GPULAB_SSH_PORT"] == "2222"
    assert hub["environment"]["GPULAB_SSH_BIND"] == "0.0.0.0"


def test_compose_follows_site_settings():
    cfg = compose_config(
        {
            **SITE,
            "GPULAB_HOME": "/data/gpulab",
            "GPULAB_PUBLISH": "0.0.0.0:443",
            "GPULAB_SSH_PORT": "22",
            "GPULAB_HUB_BASE": "local/debian:bookworm",
        }
    )
    hub = cfg["services"]["hub"]
    assert hub["build"]["args"]["BASE"] == "local/debian:bookworm"
    assert hub["environment"]["GPULAB_SSH_PORT"] == "22"
    assert "/data/gpulab:/data/gpulab:rw" in hub["volumes"]
    assert hub["environment"]["GPULAB_HOME"] == "/data/gpulab"
    assert hub["environment"]["GPULAB_BIND_URL"] == "http://0.0.0.0:443"


def test_compose_serves_each_user_from_their_own_origin():
    """Remote deployments: subdomains are required (docs/deployment.md, "Origins")."""
    cfg = compose_config(SITE)
    assert (
        cfg["services"]["hub"]["environment"]["GPULAB_SUBDOMAIN_HOST"]
        == SITE["GPULAB_SUBDOMAIN_HOST"]
    )
    exe = shutil.which("docker-compose")
    done = subprocess.run(
        [exe, "-f", str(REPO / "compose.yml"), "config"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0
    assert "set GPULAB_SUBDOMAIN_HOST" in done.stderr

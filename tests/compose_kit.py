"""gpulab's production deployment (compose.yml) brought up by a test, as an admin does.

The hub image is built from the checkout exactly as compose.yml builds it
(``docker-compose -f compose.yml -f <override> build``), then started with
``up -d``: the hub in its container on the host's network, project containers
beside it on the host's engine. The override changes only what a test must: names
that carry the test prefix (the container, the hub image, project containers, the
network), free ports, and the session hub's base image settings, so the base image
that hub built is reused rather than built again. Everything compose.yml reads from
the environment (GPULAB_HOME, GPULAB_PUBLISH, GPULAB_SUBDOMAIN_HOST, GPULAB_HUB_BASE,
GPULAB_BASE_FROM, ...) is passed as an admin passes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import requests
import yaml
from conftest import PREFIX, REPO, free_port, hub_env

from gpulab_hub import host

# Where images/hub.Dockerfile takes extra CA certificates from (docs/deployment.md).
HUB_CA_DIR = REPO / "images" / "hub-ca-certificates"


@contextlib.contextmanager
def host_ca_certificates():
    """The host's extra CA certificates (/usr/local/share/ca-certificates/*.crt) in
    images/hub-ca-certificates/, as the deployment docs tell an admin behind a
    TLS-intercepting proxy to put them; the copies made here are removed after."""
    made = []
    for crt in sorted(Path(host.HOST_CA_DIR).glob("*.crt")):
        target = HUB_CA_DIR / crt.name
        if target.exists():
            assert target.read_bytes() == crt.read_bytes(), f"{target} differs from {crt}"
            continue
        shutil.copyfile(crt, target)
        made.append(target)
    try:
        yield
    finally:
        for path in made:
            path.unlink(missing_ok=True)


class Deployment:
    """One compose project: ``build``, ``up``, ``down`` with the test's names."""

    def __init__(self, workdir: Path, admin_password: str):
        self.project = f"{PREFIX}compose"
        self.container = f"{PREFIX}-compose-hub"
        self.image = f"{PREFIX}/hub:compose"
        self.db_container = f"{PREFIX}-compose-db"
        self.db_image = f"{PREFIX}/db:compose"
        self.container_prefix = f"{PREFIX}cmp"
        self.network = f"{PREFIX}-compose-net"
        self.home = workdir / "home"
        self.home.mkdir()
        port = free_port()
        self.url = f"http://lab.localhost:{port}"
        # The session hub's values (tests/conftest.py hub_env): its base image is reused.
        session = hub_env(self.home)
        self.base_from = session["GPULAB_BASE_FROM"]
        torch = session["GPULAB_TORCH"]
        self.hub_port = int(session["GPULAB_HUB_PORT"])
        # What compose.yml reads from the environment, as an admin sets it.
        self.env = {
            **os.environ,
            "GPULAB_HOME": str(self.home),
            "GPULAB_PUBLISH": f"127.0.0.1:{port}",
            "GPULAB_SUBDOMAIN_HOST": self.url,
            "GPULAB_ADMIN_PASSWORD": admin_password,
            "GPULAB_BASE_FROM": self.base_from,
            "GPULAB_HUB_BASE": self.base_from,  # the local debootstrap Debian
            "GPULAB_SSH_PORT": "0",
        }
        environment = {
            name: session[name]
            for name in (
                "GPULAB_IMAGE_REPO",
                "GPULAB_BASE_IMAGE",
                "GPULAB_HUB_PORT",
                "GPULAB_PROXY_API_PORT",
                "GPULAB_BUILD_DISK_LIMIT_MB",
                "GPULAB_PREBUILD",
                "GPULAB_LOOP_GUARD",
            )
        }
        environment["GPULAB_CONTAINER_PREFIX"] = self.container_prefix
        environment["GPULAB_NETWORK"] = self.network
        environment["GPULAB_TORCH"] = torch
        hub = {"image": self.image, "container_name": self.container, "environment": environment}
        if Path(torch).is_file():  # a wheel on disk: at the same path inside the hub
            hub["volumes"] = [f"{torch}:{torch}:ro"]
        self.override = workdir / "compose.test.yml"
        db = {"image": self.db_image, "container_name": self.db_container}
        self.override.write_text(yaml.safe_dump({"services": {"hub": hub, "db": db}}))

    def compose(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        exe = shutil.which("docker-compose")
        assert exe, "docker-compose is missing: scripts/setup.sh test installs it"
        cmd = [exe, "-p", self.project, "-f", str(REPO / "compose.yml")]
        cmd += ["-f", str(self.override), *args]
        return subprocess.run(
            cmd, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def must(self, *args: str, timeout: float = 900) -> str:
        done = self.compose(*args, timeout=timeout)
        assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{done.stderr[-4000:]}"
        return done.stdout + done.stderr

    def wait_ready(self, dk: host.Docker, timeout: float = 600) -> None:
        """Until the hub in its container answers (its `gpulab up` checked the base
        image, then started JupyterHub), or its container stopped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/hub/api", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            state = dk.call("inspect_container", self.container)["State"]
            assert state["Running"], f"the hub container stopped: {state}\n{self.logs()}"
            time.sleep(1)
        raise AssertionError(f"the hub did not answer at {self.url} within {timeout} s")

    def psql(self, dk: host.Docker, query: str) -> list[str]:
        """What the database server answers ``query`` (psql in the db container, on
        its socket, as the hub connects): one line a row."""
        run = dk.call(
            "exec_create",
            self.db_container,
            ["psql", "-h", "/run/gpulab-db", "-U", "gpulab", "-d", "gpulab", "-Atc", query],
        )
        out = dk.call("exec_start", run["Id"]).decode()
        code = dk.call("exec_inspect", run["Id"])["ExitCode"]
        assert code == 0, out
        return out.splitlines()

    def logs(self) -> str:
        done = self.compose("logs", "--no-color", "--tail", "80", timeout=60)
        return done.stdout + done.stderr

    def remove(self, dk: host.Docker, images_before: set[str]) -> None:
        """``docker-compose down``, then every object the deployment made: project
        containers, the project images built meanwhile, the hub image, the network
        and its firewall rules."""
        self.compose("down", "--remove-orphans", "--volumes", timeout=300)
        for c in dk.call("containers", all=True, filters={"name": self.container_prefix}):
            if c["Names"][0].lstrip("/").startswith(self.container_prefix + "-"):
                dk.call("remove_container", c["Id"], force=True, v=True)
        for img in dk.call("images"):
            tags = [t for t in img.get("RepoTags") or [] if t.startswith(f"{PREFIX}/")]
            if img["Id"] not in images_before and tags and not self._base(tags):
                with contextlib.suppress(Exception):  # still used: left to the session's end
                    dk.call("remove_image", img["Id"], force=True)
        host.forget_firewall(dk, self.network, self.hub_port)
        for net in dk.call("networks", names=[self.network]):
            if net["Name"] == self.network:
                dk.call("remove_network", net["Id"])

    def leftovers(self, dk: host.Docker) -> list[str]:
        """What of the deployment is still there after :meth:`remove` (nothing, or a bug)."""
        left = [
            c["Names"][0]
            for c in dk.call("containers", all=True, filters={"name": PREFIX})
            if c["Names"][0]
            .lstrip("/")
            .startswith((self.container, self.db_container, self.container_prefix + "-"))
        ]
        tags = [t for img in dk.call("images") for t in img.get("RepoTags") or []]
        left += [t for t in tags if t in (self.image, self.db_image)]
        left += [
            v["Name"]
            for v in dk.call("volumes").get("Volumes") or []
            if v["Name"].startswith(f"{self.project}_")
        ]
        left += [n["Name"] for n in dk.call("networks", names=[self.network])]
        labelled = dk.call(
            "containers", all=True, filters={"label": f"com.docker.compose.project={self.project}"}
        )
        return left + [c["Names"][0] for c in labelled]

    def _base(self, tags: list[str]) -> bool:
        """The session's base image and the Debian it is built FROM (kept for others)."""
        return any(t.startswith((f"{PREFIX}/base:", self.base_from)) for t in tags)


def image_ids(dk: host.Docker) -> set[str]:
    return {img["Id"] for img in dk.call("images")}

"""The Docker side of the test cluster (used by ``cluster_kit.SlurmKit``): each node's
own Docker engine and the registry that carries images from this machine's engine
to the nodes.

Each node engine is a ``containerd`` and a ``dockerd`` of the kit's own, both started
in the node's network and UTS namespaces, configured only by files the kit writes
(``dockerd --config-file``: never /etc/docker/daemon.json). The engine's own
containerd is named explicitly (``"containerd": <socket>``): dockerd 20.10 would
otherwise attach to a system containerd at /run/containerd/containerd.sock where one
runs, and share its "moby" namespace with this machine's engine. Its containerd
namespaces are named after the node as well. iptables rules go to the node's own
network namespace, so bridge networks, NAT and published ports work inside the node.

The registry is Debian's ``docker-registry`` started twice on one storage folder:
read-write on 127.0.0.1 (this machine's engine pushes there; Docker treats loopback
registries as insecure) and read-only with htpasswd (bcrypt) on this host's fabric
address (the nodes pull there; their engines list it with ``insecure-registries``).
JSON is YAML, so the registry's configuration files are written as JSON.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import bcrypt
import docker
import requests

from gpulab_hub import host

if TYPE_CHECKING:
    from cluster_kit import KitNode

REGISTRY_USER = "gpulab-nodes"
SHIM_SOCKETS = Path("/run/containerd/s")  # containerd 1.6 puts every shim's socket here
_SHIM_ADDRESS = re.compile(r"unix://(/run/containerd/s/[0-9a-f]{64})")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the final NUL


class KitError(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class NodeEngines:
    """SlurmKit's node engines and registry (a mixin: it uses the kit's ``root``,
    ``prefix``, ``nodes``, ``controller_address``, ``_procs``, ``_start``,
    ``_stop_started``, ``_in_node`` and ``logs``)."""

    @property
    def host_address(self) -> str:
        return self.controller_address

    def node(self, name: str) -> KitNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KitError(f"no node {name!r} in this test cluster")

    def node_address(self, node: str) -> str:
        return self.node(node).address

    @property
    def node_docker_host_template(self) -> str:
        return f"unix://{self.root}/{{node}}/docker.sock"

    def node_docker_host(self, node: str) -> str:
        return self.node_docker_host_template.format(node=self.node(node).name)

    def node_engine(self, node: str, timeout: float = 60) -> host.Docker:
        """gpulab's Docker client for a node's engine."""
        return docker_engine(self.node_docker_host(node), timeout)

    @property
    def main_engine(self) -> host.Docker:
        """This machine's engine (DOCKER_HOST or the local socket): the hub's."""
        if self._main is None:
            self._main = host.Docker(timeout=600)
        return self._main

    @property
    def registry(self) -> str:
        return f"127.0.0.1:{self.registry_port}"

    @property
    def registry_for_nodes(self) -> str:
        return f"{self.host_address}:{self.node_registry_port}"

    @property
    def node_docker_config(self) -> str:
        return str(self.root / "node-docker")

    @property
    def node_docker_cli(self) -> str:
        return str(self.root / "bin" / "docker")

    def push(self, image: str) -> tuple[str, float]:
        """Push ``image`` (``<prefix>/...[:tag]`` on this machine's engine) to the
        registry; returns the nodes' reference by digest and the seconds it took."""
        name = (
            rf"{self.prefix}/[a-z0-9][a-z0-9._/-]{{0,200}}(:[A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})?"
        )
        if not re.fullmatch(name, image):
            raise KitError(f"push {image!r}: only images named {self.prefix}/... ")
        started = time.monotonic()
        _, repo, digest = push_image(self.main_engine, image, self.registry)
        return f"{self.registry_for_nodes}/{repo}@{digest}", time.monotonic() - started

    def _stop_engines(self) -> None:
        """Containers first (removed at once: a graceful engine stop waits for each),
        then each dockerd and its containerd."""
        for n in self.nodes:
            if f"{n.name}-dockerd" not in self._procs:
                continue
            try:
                engine = self.node_engine(n.name, timeout=20)
                for c in engine.call("containers", all=True):
                    engine.call("remove_container", c["Id"], force=True, v=True)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                pass  # the kill below ends them
        for n in self.nodes:
            self._stop_started(f"{n.name}-dockerd")
        for n in self.nodes:
            self._stop_started(f"{n.name}-containerd")

    def _start_engines(self) -> None:
        """The registry (two instances) and each node's containerd and dockerd."""
        started = time.monotonic()
        self._start_registry()
        for n in self.nodes:
            folder = self.root / n.name
            check_socket_paths(folder)
            folder.mkdir()
            (folder / "containerd.toml").write_text(containerd_config(folder))
            config = daemon_config(folder, n.name, self.registry_for_nodes)
            (folder / "daemon.json").write_text(json.dumps(config, indent=1) + "\n")
            argv = ["containerd", "--config", f"{folder}/containerd.toml"]
            self._start(f"{n.name}-containerd", [*self._in_node(n), *argv])
        for n in self.nodes:
            folder = self.root / n.name
            self._wait(f"{n.name}-containerd", (folder / "containerd.sock").exists)
            argv = ["dockerd", "--config-file", f"{folder}/daemon.json"]
            self._start(f"{n.name}-dockerd", [*self._in_node(n), *argv])
        self._wait("registry-rw", lambda: registry_answers(f"http://{self.registry}"))
        self._wait("registry-ro", lambda: registry_answers(f"http://{self.registry_for_nodes}"))
        for n in self.nodes:
            url = self.node_docker_host(n.name)
            self._wait(f"{n.name}-dockerd", lambda url=url: engine_answers(url), 60)
        self.engine_seconds = time.monotonic() - started

    def _start_registry(self) -> None:
        """Read-write on loopback, read-only with a password on the fabric; one storage."""
        reg = self.root / "registry"
        (reg / "storage").mkdir(parents=True)
        self.registry_port, self.node_registry_port = free_port(), free_port()
        password = secrets.token_urlsafe(24)
        htpasswd = reg / "htpasswd"
        htpasswd.write_text(htpasswd_line(REGISTRY_USER, password))
        for name, addr, auth in (
            ("registry-rw", self.registry, None),
            ("registry-ro", self.registry_for_nodes, htpasswd),
        ):
            config = reg / f"{name}.json"
            config.write_text(registry_config(reg / "storage", addr, auth))
            self._start(name, ["docker-registry", "serve", str(config)])
        cfg = Path(self.node_docker_config)
        cfg.mkdir(mode=0o700)
        (cfg / "config.json").write_text(
            client_config(self.registry_for_nodes, REGISTRY_USER, password)
        )
        cli = Path(self.node_docker_cli)
        cli.parent.mkdir()
        cli.write_text(node_cli(self.root, [n.name for n in self.nodes], cfg))
        cli.chmod(0o755)

    def _wait(self, name: str, ready, timeout: float = 20) -> None:
        """Until ``ready()`` (bounded) while the started ``name`` runs; else KitError."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self._procs[name].poll() is not None:
                raise KitError(f"{name} exited:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise KitError(f"{name} did not answer within {timeout:g} s:\n{self.logs()}")
            time.sleep(0.05)


# --- configuration files -------------------------------------------------------------


def containerd_config(folder: Path) -> str:
    """A node's containerd: its own root, state and sockets under ``folder``; no CRI."""
    return "\n".join(
        [
            "version = 2",
            f'root = "{folder}/containerd"',
            f'state = "{folder}/x/containerd-state"',
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
            "[grpc]",
            f'  address = "{folder}/containerd.sock"',
            "[debug]",
            '  level = "warn"',
            "",
        ]
    )


def daemon_config(folder: Path, node: str, registry_for_nodes: str) -> dict:
    """A node's dockerd: everything it keeps is under ``folder``."""
    return {
        "hosts": [f"unix://{folder}/docker.sock"],
        "data-root": f"{folder}/data",
        "exec-root": f"{folder}/x",
        "pidfile": f"{folder}/x/dockerd.pid",
        "containerd": f"{folder}/containerd.sock",
        "containerd-namespace": node,
        "containerd-plugins-namespace": f"{node}-plugins",
        "userns-remap": "default",  # the same uid offset as this machine's engine
        "insecure-registries": [registry_for_nodes],
        "storage-driver": "overlay2",
        "log-level": "warn",
        "shutdown-timeout": 3,
    }


def check_socket_paths(folder: Path) -> None:
    longest = f"{folder}/containerd.sock.ttrpc"
    if len(longest.encode()) > MAX_SOCKET_PATH:
        raise KitError(f"{longest} is too long for a Unix socket: use a shorter TMPDIR")


def registry_config(storage: Path, addr: str, htpasswd: Path | None) -> str:
    """One registry instance; with ``htpasswd`` it is read-only and asks for a password."""
    config: dict = {
        "version": "0.1",
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}},
        "http": {"addr": addr, "secret": secrets.token_hex(16)},
    }
    if htpasswd is not None:
        config["storage"]["maintenance"] = {
            "readonly": {"enabled": True},
            "uploadpurging": {"enabled": False},
        }
        config["auth"] = {"htpasswd": {"realm": "gpulab test cluster", "path": str(htpasswd)}}
    return json.dumps(config, indent=1) + "\n"


def htpasswd_line(user: str, password: str) -> str:
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    return f"{user}:{hashed}\n"


def client_config(registry: str, user: str, password: str) -> str:
    """A Docker client's config.json holding the nodes' registry credentials."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {registry: {"auth": auth}}}, indent=1) + "\n"


def node_cli(root: Path, nodes: list[str], config_dir: Path) -> str:
    """A Docker CLI for batch scripts and Epilogs: the engine of the node it runs on
    (``$SLURMD_NODENAME``), with the registry's credentials."""
    names = "|".join(nodes)
    return (
        "#!/bin/sh\n"
        "# The Docker CLI of the node this runs on (the test cluster's node engines).\n"
        'case "$SLURMD_NODENAME" in\n'
        f"  {names}) ;;\n"
        "  *) echo \"gpulab test cluster: no node engine for '$SLURMD_NODENAME'\" >&2; exit 1 ;;\n"
        "esac\n"
        f'exec docker -H "unix://{root}/$SLURMD_NODENAME/docker.sock" '
        f'--config "{config_dir}" "$@"\n'
    )


# --- readiness -----------------------------------------------------------------------


def docker_engine(url: str, timeout: float = 60) -> host.Docker:
    """gpulab's Docker client for one engine, by socket URL."""
    return host.Docker(host.docker_client(timeout, base_url=url), timeout=timeout)


def engine_answers(url: str) -> bool:
    try:
        return bool(docker_engine(url, timeout=5).call("ping"))
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        return False


def registry_answers(url: str) -> bool:
    """True once the registry answers /v2/ (200, or 401 where it asks for a password)."""
    try:
        with urllib.request.urlopen(f"{url}/v2/", timeout=2) as reply:
            return reply.status == 200
    except urllib.error.HTTPError as e:
        return e.code == 401
    except OSError:
        return False


# --- this machine's engine -----------------------------------------------------------


def push_image(main: host.Docker, image: str, registry: str) -> tuple[str, str, str]:
    """Tag ``image`` (``repo:tag`` on this machine's engine) as ``<registry>/repo:tag``
    and push it; returns (the pushed tag, the repository path, the digest)."""
    repo, _, tag = image.rpartition(":")
    if not repo or "/" in tag:
        repo, tag = image, "latest"
    target = f"{registry}/{repo}"
    main.call("tag", image, target, tag)
    digest = ""
    for line in main.call("push", target, tag=tag, stream=True, decode=True):
        if "error" in line or "errorDetail" in line:
            raise KitError(f"pushing {image} to {registry} failed: {line}")
        found = (line.get("aux") or {}).get("Digest", "")
        digest = found or digest
    if not _DIGEST.fullmatch(digest):
        raise KitError(f"pushing {image} to {registry} gave no digest")
    return f"{target}:{tag}", repo, digest


def remove_registry_tags(main: host.Docker, prefix: str) -> None:
    """Untag, on this machine's engine, what a kit of ``prefix`` (or a hub pushing to
    it) tagged for its registry: ``127.0.0.1:<port>/<prefix>/...`` tags and the digest
    references a push adds. An image left with no other name goes with them."""
    ours = re.compile(rf"127\.0\.0\.1:\d+/{re.escape(prefix)}/\S+")
    try:
        if not main.reachable():
            return
        images = main.call("images")
    except docker.errors.DockerException:
        return
    for img in images:
        for ref in (img.get("RepoTags") or []) + (img.get("RepoDigests") or []):
            if ours.fullmatch(ref):
                try:
                    main.call("remove_image", ref, noprune=True)
                except docker.errors.NotFound:
                    pass


# --- leftovers -----------------------------------------------------------------------


def shim_sockets(root: Path) -> list[Path]:
    """The shim sockets (in containerd's shared /run/containerd/s) of the containers
    whose bundles lie under ``root``: a shim killed outright leaves its socket."""
    found = []
    for address in root.glob("*/x/containerd-state/io.containerd.runtime.v2.task/*/*/address"):
        try:
            m = _SHIM_ADDRESS.fullmatch(address.read_text().strip())
        except OSError:
            continue
        if m:
            found.append(Path(m.group(1)))
    return found


def mounts_under(root: Path) -> list[str]:
    """Mount points at or under ``root`` (this mount namespace), deepest first."""
    inside = str(root).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == str(root) or point.startswith(inside):
                points.append(point)
    return sorted(points, key=lambda p: (p.count("/"), len(p)), reverse=True)


def unmount_under(root: Path) -> None:
    """Unmount everything at or under ``root`` (overlays under the data roots, the
    engines' network namespaces, the kit's namespaces); lazily where busy."""
    for _ in range(5):
        points = mounts_under(root)
        if not points:
            return
        for point in points:
            done = subprocess.run(["umount", point], capture_output=True, timeout=30)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    left = mounts_under(root)
    if left:
        raise KitError(f"still mounted under {root}: {left}")


def remove_file(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def main_tags(dk) -> set[str]:
    """Every tag and digest reference on this machine's engine."""
    images = dk.call("images")
    return {r for i in images for r in (i.get("RepoTags") or []) + (i.get("RepoDigests") or [])}

"""Re-runnable ``ensure_*`` steps that make this machine able to run gpulab.

Each step checks first and acts only when needed, so running ``gpulab up``
again does no harm. Docker calls go through :meth:`Docker.call`.
"""

from __future__ import annotations

import hashlib
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import docker
import docker.errors
import docker.utils
import requests.exceptions

from gpulab_contract import files
from gpulab_hub import blocking, egress, firewall, images, pidfile
from gpulab_hub.images import base as baseimage
from gpulab_hub.images import userwheel
from gpulab_hub.projects import objects

# The local Debian image (no registry): what the base image needs, so its build skips
# apt-get (the SSH gateway's sftp and scp run the image's sftp-server).
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "openssh-sftp-server")
HOST_CA_DIR = "/usr/local/share/ca-certificates"


class HostError(Exception):
    """A set-up step failed; the message says what to do."""


_build_call = threading.local()


class APIClient(docker.APIClient):
    """docker-py's client, whose ``build`` also takes ``engine_params``: query parameters
    of the engine's build API that docker-py does not pass (``cgroupparent``, which asks
    gpulab's engine runtime to confine the steps; ``cpuquota`` and ``cpuperiod``).

    Every request it sends (``/version`` in its constructor included) is blocking work:
    the loop guard (blocking.off_loop) refuses it on the event-loop thread."""

    def request(self, method, url, *args, **kwargs):
        blocking.off_loop("A call to the Docker engine")
        return super().request(method, url, *args, **kwargs)

    def build(self, *args, engine_params: dict | None = None, **kwargs):
        _build_call.params = engine_params
        try:
            return super().build(*args, **kwargs)  # posts before it returns the stream
        finally:
            _build_call.params = None

    def _post(self, url, **kwargs):
        extra = getattr(_build_call, "params", None)
        if extra and url == self._url("/build"):
            kwargs["params"] = {**(kwargs.get("params") or {}), **extra}
        return super()._post(url, **kwargs)


def docker_client(timeout: float = 600, **kwargs) -> docker.APIClient:
    """gpulab's one way to make a Docker client: the engine DOCKER_HOST names (and its
    TLS variables), else the local socket; ``kwargs`` as ``docker.APIClient`` takes.
    Blocking: it asks the engine's version (never on an event loop, blocking.off_loop)."""
    blocking.off_loop("Making the Docker client")
    return APIClient(
        **{"version": "auto", "timeout": timeout, **docker.utils.kwargs_from_env(), **kwargs}
    )


class Docker:
    """The one place the CLI, set-up steps and the doctor talk to the Docker engine.

    It honours ``DOCKER_HOST`` and its TLS variables, as DockerSpawner's own client
    does, so the hub, the CLI and the doctor always mean the same engine.
    ``timeout`` bounds each call (the doctor keeps it short). Its calls block: from a
    coroutine, ``await dk.run(method, ...)`` runs one on the Docker pool (blocking.py).
    """

    def __init__(self, client: docker.APIClient | None = None, timeout: float = 600):
        self._client = client
        self.timeout = timeout

    @property
    def client(self) -> docker.APIClient:
        if self._client is None:
            self._client = docker_client(self.timeout)
        return self._client

    def call(self, method: str, *args, **kwargs):
        return getattr(self.client, method)(*args, **kwargs)

    async def run(self, method: str, *args, **kwargs):
        """:meth:`call` on the Docker pool, for coroutines."""
        return await blocking.run(blocking.DOCKER, self.call, method, *args, **kwargs)

    def reachable(self) -> bool:
        try:
            return bool(self.call("ping"))
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            self._client = None
            return False


# The engine runtime that confines build steps (buildruntime.py), by its name in dockerd.
BUILD_RUNTIME = "gpulab"


# The engine calls its runtime for every container (create, start, state, delete...):
# a shell script hands each call straight to runc, and only the creation of a gpulab
# build step (its spec names the build's cgroup parent) goes through buildruntime.py,
# run by Python without site packages (it needs the standard library only).
_RUNTIME_SCRIPT = """#!/bin/sh
# gpulab's engine runtime, written by gpulab when it started this dockerd
# (gpulab_hub/buildruntime.py says what it does).
bundle=. prev= create=
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle=$a ;; esac
  case "$a" in --bundle=*) bundle=${{a#--bundle=}} ;; create|run) create=1 ;; esac
  prev=$a
done
if [ -n "$create" ] && grep -q 'gpulab-build-pids' "$bundle/config.json" 2>/dev/null; then
  exec {python} -I -S {module} "$@"
fi
exec {runc} "$@"
"""


def write_build_runtime(state_dir: Path) -> Path:
    """gpulab's engine runtime (a script in ``state_dir``, root's, 0755), written anew."""
    from gpulab_hub import buildruntime

    paths = {"python": sys.executable, "module": buildruntime.__file__}
    paths["runc"] = buildruntime.find_runc()
    for value in paths.values():
        if not re.fullmatch(r"/[A-Za-z0-9_./+-]+", value):
            raise HostError(f"gpulab's engine runtime cannot name the path {value!r}.")
    text = _RUNTIME_SCRIPT.format(**paths)
    path = state_dir / "gpulab-build-runtime"
    files.write_atomic(path, text.encode(), mode=0o755)  # gpulab's one atomic writer
    return path


def dockerd_args(runtime: Path) -> tuple[str, ...]:
    """How gpulab starts dockerd when none runs: container root is an unprivileged host
    uid (user-namespace remapping onto the "dockremap" range), and every container is
    created through gpulab's ``runtime``, which confines build steps (buildruntime.py)."""
    return (
        "--userns-remap=default",
        f"--add-runtime={BUILD_RUNTIME}={runtime}",
        f"--default-runtime={BUILD_RUNTIME}",
    )


def build_confined(docker_info: dict) -> bool:
    """Whether the engine creates containers through gpulab's runtime (build steps confined)."""
    runtimes = docker_info.get("Runtimes") or {}
    return docker_info.get("DefaultRuntime") == BUILD_RUNTIME and BUILD_RUNTIME in runtimes


def ensure_dockerd(
    dk: Docker, state_dir: Path, wait: float = 60, args: tuple[str, ...] | None = None
) -> int | None:
    """Start dockerd when no engine answers. Returns the PID it started, else None."""
    if dk.reachable():
        return None
    state_dir.mkdir(parents=True, exist_ok=True)
    args = dockerd_args(write_build_runtime(state_dir)) if args is None else args
    dockerd = shutil.which("dockerd")
    if not dockerd:
        raise HostError(
            "No Docker engine answers and dockerd is not installed: "
            "install Debian's docker.io (the README's set-up command does)."
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    log = open(state_dir / "dockerd.log", "ab")
    proc = subprocess.Popen([dockerd, *args], stdout=log, stderr=log, start_new_session=True)
    pidfile.write(state_dir / "dockerd.pid", proc.pid)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HostError(f"dockerd exited at start; see {state_dir / 'dockerd.log'}")
        if dk.reachable():
            return proc.pid
        time.sleep(0.5)
    raise HostError(f"dockerd did not answer within {wait:.0f} s; see {state_dir / 'dockerd.log'}")


def stop_dockerd(state_dir: Path, log=print) -> bool:
    """Stop the dockerd that ensure_dockerd started (if any, and if it still runs:
    a stale PID file, say after a reboot, signals nothing)."""
    path = state_dir / "dockerd.pid"
    me, stale = pidfile.check(path, "dockerd")
    path.unlink(missing_ok=True)
    if stale:
        log(f"The Docker engine's PID file was stale, so nothing was signalled: {stale}.")
    return me is not None and stop_pid(me.pid, timeout=30, expect=me)


def stop_pid(pid: int, timeout: float = 15, expect: pidfile.Identity | None = None) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``; False if it was not running. Signals go
    through a pidfd where the kernel has them, so a PID reused meanwhile is never hit;
    with ``expect`` only that very process (pidfile.Identity) is signalled."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd here (an old kernel): plain PIDs
        fd = None
    try:
        if expect is not None and pidfile.identity(pid) != expect:
            return False
        if not _signal(pid, fd, signal.SIGTERM):
            return False
        if not _exits(pid, fd, timeout):
            _signal(pid, fd, signal.SIGKILL)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def _signal(pid: int, fd: int | None, sig: int) -> bool:
    try:
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False
    return True


def _exits(pid: int, fd: int | None, timeout: float) -> bool:
    """Wait up to ``timeout`` for the process to end; whether it did."""
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)  # readable once the process has exited
        return bool(poller.poll(timeout * 1000))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def ensure_network(dk: Docker, name: str) -> str:
    """The bridge network projects and builds join (made once); returns its gateway IP.

    Inter-container traffic is off (``enable_icc=false``): a project reaches the
    hub and, through NAT, the package index, but never another project.
    """
    objects.check_network(name)
    try:
        net = dk.call("inspect_network", name)
    except docker.errors.NotFound:
        dk.call(
            "create_network",
            name,
            driver=objects.NETWORK_DRIVER,
            options=dict(objects.NETWORK_OPTIONS),
            labels=dict(objects.NETWORK_LABELS),
            check_duplicate=True,
        )
        net = dk.call("inspect_network", name)
    if net.get("Driver") != objects.NETWORK_DRIVER:
        raise HostError(f"The Docker network {name!r} exists but is not a bridge network.")
    configs = (net.get("IPAM") or {}).get("Config") or []
    gateway = next((c["Gateway"] for c in configs if c.get("Gateway")), "")
    if not gateway:
        raise HostError(f"The Docker network {name!r} has no gateway address.")
    return gateway


def ensure_firewall(
    dk: Docker, network: str, hub_port: int, policy: egress.Policy | None = None
) -> str:
    """The host's own services out of projects' and builds' reach, but the hub's API
    port for projects (firewall.py); beyond the box, the cloud's metadata service and
    the networks ``policy`` refuses (egress.py; None: the default policy). Returns why
    IPv6 was skipped ("" when it was not)."""
    try:
        bridge = firewall.bridge_of(dk.call("inspect_network", network))
        firewall.ensure_projects(bridge, hub_port)
        return egress.ensure(policy or egress.default_policy(), bridge)
    except (firewall.FirewallError, egress.EgressError) as e:
        raise HostError(str(e)) from e


def forget_firewall(dk: Docker, network: str, hub_port: int) -> None:
    """``gpulab down``: close the hub's port to the projects' network again (when the
    network and the rules are still there)."""
    try:
        bridge = firewall.bridge_of(dk.call("inspect_network", network))
        firewall.forget_projects_port(bridge, hub_port)
    except (docker.errors.NotFound, firewall.FirewallError):
        return


def ensure_owned_folder(path: Path, uid: int, gid: int) -> None:
    """Make ``path`` (in a hub-owned parent) and give it to uid:gid; an existing
    folder is left as it is. A link or a non-folder there is refused."""
    try:
        path.mkdir(mode=0o750)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise HostError(f"{path} exists but is not a folder; gpulab will not use it.") from None
        return
    os.chmod(path, 0o750)  # whatever the hub's umask (077)
    os.chown(path, uid, gid, follow_symlinks=False)


def default_mem_limit() -> int | None:
    """Memory a project may use by default: all but 10 % (at least 2 GiB) of the host's."""
    try:
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(total - max(total // 10, 2 << 30), 1 << 30)


def default_cpu_limit() -> float:
    """CPUs a project may use by default: all but one of the host's (at least one)."""
    return float(max(1, (os.cpu_count() or 1) - 1))


def ensure_data_root(data_root: Path) -> None:
    """The shared data folders, hub-owned: ``datasets`` (read-only in containers, so
    only the admin fills it) and the parents of each user's ``models/<user>`` and
    ``outputs/<user>`` folders, which the spawner makes (and only it)."""
    for sub in (objects.DATASETS, *objects.PER_USER_DATA, objects.GROUPS_DATA):
        path = data_root / sub
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(path, 0, 0, follow_symlinks=False)
            path.chmod(0o755)


def cache_dir() -> Path:
    """This machine's cache for gpulab (XDG_CACHE_HOME/gpulab)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpulab"


def ensure_local_debian(dk: Docker, name: str, cache_dir: Path, log=print) -> str:
    """A Debian bookworm image made locally (debootstrap), for hosts with no registry.

    The root file system is kept as a tarball in ``cache_dir``, so making the
    image again (after ``docker rmi``) takes seconds. Its name carries the package
    list: a tarball made before a package was added is never taken for one with it.
    """
    if images.image_id(dk.call, name):
        return name
    repo, _, tag = name.rpartition(":")
    packages = hashlib.sha256(",".join(DEBIAN_PACKAGES).encode()).hexdigest()[:12]
    tarball = cache_dir / f"debian-bookworm-rootfs-{packages}.tar"
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Two set-ups at once (two hubs, or a hub beside a test run): one debootstrap; the
    # other waits for its tarball rather than making a second one beside it.
    with blocking.file_lock(cache_dir / f".{tarball.name}.lock", "the Debian image", 900):
        _ensure_rootfs(tarball, cache_dir, name, log)
    dk.call("import_image", src=str(tarball), repository=repo, tag=tag)
    return name


def _ensure_rootfs(tarball: Path, cache_dir: Path, name: str, log) -> None:
    if not tarball.exists():
        debootstrap = shutil.which("debootstrap")
        if not debootstrap:
            raise HostError(
                "debootstrap is needed to make a local base image (apt-get install debootstrap)"
            )
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gpulab-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            log(f"Making a local Debian image {name} with debootstrap (about a minute)...")
            cmd = [
                debootstrap,
                "--variant=minbase",
                "--include=" + ",".join(DEBIAN_PACKAGES),
                "bookworm",
                str(rootfs),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                tail = "\n".join(done.stdout.splitlines()[-10:])
                raise HostError(f"debootstrap failed:\n{tail}")
            # A name of its own, renamed into place whole: two set-ups at once never
            # write into one file, nor read half of one.
            fd, partial = tempfile.mkstemp(prefix=".rootfs-", suffix=".partial", dir=cache_dir)
            os.close(fd)
            try:
                subprocess.run(["tar", "-C", str(rootfs), "-cf", partial, "."], check=True)
                os.replace(partial, tarball)
            finally:
                Path(partial).unlink(missing_ok=True)


def user_wheels(repo_dir: Path, out_dir: Path) -> list[Path]:
    """The user side (extensions/) and the contract (contract/) as wheels in ``out_dir``:
    each built once per content of its sources (kept in this machine's cache), copied
    from there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for _, pattern in userwheel.PROJECT_WHEELS:
        for old in out_dir.glob(pattern):
            old.unlink()
    try:
        wheels = userwheel.project_wheels(repo_dir, cache_dir() / "wheels")
    except (userwheel.WheelError, OSError) as e:
        raise HostError(str(e)) from e
    return [Path(shutil.copy2(w, out_dir / w.name)) for w in wheels]


def ensure_base_image(
    dk: Docker,
    repo_dir: Path,
    state_dir: Path,
    spec: baseimage.BaseSpec,
    alias: str,
    log=print,
    *,
    network: str,
) -> str:
    """Build (or reuse) gpulab's base image for ``spec`` and tag it ``alias``."""
    # "<name>/debian:bookworm" (no registry host, not Docker Hub's library image) is the
    # local Debian made here: gpulab's default, and each test run's own prefix.
    namespace, _, rest = spec.base_image.partition("/")
    local = namespace not in ("library", "docker.io") and "." not in namespace
    if rest == "debian:bookworm" and local:
        ensure_local_debian(dk, spec.base_image, cache_dir(), log)
    else:
        ensure_pulled(dk, spec.base_image, log)
    wheels = user_wheels(repo_dir, state_dir / "wheels")
    log(
        f"Making sure the {spec.variant.upper()} base image {alias} is built "
        "(a few minutes the first time)..."
    )
    return baseimage.ensure(
        dk.call,
        repo_dir / "images",
        spec,
        wheels,
        HOST_CA_DIR,
        state_dir / "logs" / "base-build.log",
        lambda line: None,
        alias,
        network=network,
    )


def ensure_pulled(dk: Docker, ref: str, log=print) -> None:
    """Pull ``ref`` (what the base image is built FROM) unless the engine has it; a
    host that cannot reach the registry is told what to set instead."""
    if images.image_id(dk.call, ref):
        return
    repo, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        repo, tag = ref, "latest"
    log(f"Pulling {ref}, what the base image is built FROM (once; a few GB for CUDA)...")
    problem = ""
    try:
        for event in dk.call("pull", repo, tag=tag, stream=True, decode=True):
            problem = event.get("error", problem) if isinstance(event, dict) else problem
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        problem = str(e)
    if problem or not images.image_id(dk.call, ref):
        raise HostError(
            f"Could not pull {ref}, what gpulab's base image is built FROM: "
            f"{(problem or 'the engine has no such image')[:300]}. On a host without "
            f"access to that registry, set GPULAB_BASE_FROM to an image the engine has, "
            f"or to gpulab/debian:bookworm (made here with debootstrap; torch then "
            f"comes from the package index, GPULAB_TORCH)."
        )


def remove_containers(dk: Docker, label: str) -> list[str]:
    """Stop and remove every container carrying ``label`` (e.g. gpulab.project)."""
    removed = []
    for c in dk.call("containers", all=True, filters={"label": label}):
        dk.call("remove_container", c["Id"], force=True, v=True)
        removed.append(c["Names"][0].lstrip("/"))
    return removed


def remove_image_trees(dk: Docker, repo_prefix: str) -> int:
    """Remove every image tagged ``<repo_prefix>/...`` and every image built on
    one (tagged or left by a failed build), children before parents."""
    everything = dk.call("images", all=True)
    children: dict[str, list[str]] = {}
    for img in everything:
        children.setdefault(img.get("ParentId") or "", []).append(img["Id"])
    doomed: list[str] = []

    def visit(image: str) -> None:
        for child in children.get(image, []):
            visit(child)
        if image not in doomed:
            doomed.append(image)

    for img in everything:
        if any(t.startswith(f"{repo_prefix}/") for t in img.get("RepoTags") or []):
            visit(img["Id"])
    for image in doomed:
        try:
            dk.call("remove_image", image, force=True)
        except docker.errors.NotFound:
            pass
    return len(doomed)

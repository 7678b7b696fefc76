"""What confines one image build: its limits, a network of its own, a watch on its
disk use, and a build log that keeps its head and tail.

A project's build steps are its user's code with the engine's powers, so a build
gets no more than a running project (docs/security.md, "Builds"):

- its ``RUN`` steps join a bridge network made for this build alone (removed
  after it), so no step shares a segment with another tenant's container; the
  host's own services are out of its reach (firewall.py drops everything from
  build bridges to the host), and so are the cloud's metadata service and the LAN
  (egress.py);
- capabilities, ``no-new-privileges`` and the process limit come from gpulab's
  engine runtime (buildruntime.py), which the build asks for through its cgroup
  parent; memory and CPU through the build API's container limits;
- its disk use (the layers it committed plus what the running step wrote) is
  watched, and the step is killed past the limit;
- the whole build is bounded in time (images.build).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from gpulab_hub import egress, firewall

log = logging.getLogger(__name__)
NETWORK_LABELS = {"gpulab.network": "build"}
_COMMITTED = re.compile(r"^ ---> ([0-9a-f]{12,64})$")


class BuildRefused(Exception):
    """The engine cannot confine builds; the message says what the admin should do."""


@dataclass(frozen=True)
class BuildLimits:
    """Limits of one build (the hub's ``build_*`` settings)."""

    timeout: float = 3600
    memory: int | None = None  # bytes per step
    cpus: float | None = None  # CPUs per step
    pids: int = 1024  # processes per step
    disk: int = 20 << 30  # bytes the build may add (its layers and the running step)
    log_bytes: int = 4 << 20  # head + tail of the build log that are kept
    logs_kept: int = 10  # build logs kept per project
    # relative CPU weight of each step (Docker's default 1024; 2, the least, for the
    # starting points' background builds: any other work gets the CPUs first)
    cpu_shares: int | None = None
    # a build in the quick lane (builds.py): its running step is stopped past this
    # many seconds (images.QuickBuildOver), well before ``timeout``, or at once when
    # ``quick_stop`` is set (the pool gives its slot to another user's build)
    quick_s: float | None = None
    quick_stop: threading.Event | None = field(default=None, compare=False)

    def container_limits(self) -> dict:
        """docker-py's ``container_limits`` of each step."""
        out = {"memory": int(self.memory), "memswap": int(self.memory)} if self.memory else {}
        if self.cpu_shares:
            out["cpushares"] = int(self.cpu_shares)
        return out

    def engine_params(self, cgroup_driver: str) -> dict:
        """Build API parameters docker-py does not pass (host.APIClient.build): the CPU
        quota, and the cgroup parent that asks gpulab's runtime to confine the steps."""
        name = f"gpulab-build-pids{int(self.pids)}"
        params = {"cgroupparent": f"{name}.slice" if cgroup_driver == "systemd" else f"/{name}"}
        if self.cpus:
            params.update(cpuperiod=100_000, cpuquota=max(1000, int(self.cpus * 100_000)))
        return params


def check_engine(docker_info: dict, runtime: str) -> None:
    """Refuse to build on an engine that does not create containers through gpulab's runtime."""
    runtimes = docker_info.get("Runtimes") or {}
    if docker_info.get("DefaultRuntime") == runtime and runtime in runtimes:
        return
    raise BuildRefused(
        "This Docker engine does not confine image builds, so gpulab will not build on it "
        f"(its default runtime is {docker_info.get('DefaultRuntime')!r}, not gpulab's). "
        "Ask the administrator to let `gpulab up` start the engine, or to add gpulab's runtime "
        'to it (docs/security.md, "Builds").'
    )


class BuildNetwork:
    """A bridge network for one build: made on enter, removed on exit."""

    def __init__(self, docker_call, base_name: str):
        token = secrets.token_hex(4)
        self.docker_call = docker_call
        self.name = f"{base_name}-build-{token}"
        self.iface = f"{firewall.BUILD_IFACE_PREFIX}{token}"

    def __enter__(self) -> BuildNetwork:
        firewall.ensure_builds()
        egress.ensure_builds()
        self.docker_call(
            "create_network",
            self.name,
            driver="bridge",
            options={
                "com.docker.network.bridge.name": self.iface,
                "com.docker.network.bridge.enable_icc": "false",
            },
            labels=dict(NETWORK_LABELS),
            check_duplicate=True,
        )
        return self

    def __exit__(self, *exc) -> None:
        import docker.errors

        for attempt in range(20):
            try:
                self.docker_call("remove_network", self.name)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as e:
                # a step's container still attached (a cancelled build): gone in a moment
                if attempt == 19:
                    log.warning("gpulab: could not remove the build network %s: %s", self.name, e)
                    return
                remove_steps(self.docker_call, self.name)
                time.sleep(0.5)


def steps_on(docker_call, network: str, *, size: bool = False, stopped: bool = False) -> list[dict]:
    """The build steps (containers) on a build's ``network``; [] when Docker cannot say."""
    import docker.errors

    try:
        return docker_call("containers", all=stopped, filters={"network": network}, size=size)
    except docker.errors.APIError:
        return []


def remove_steps(docker_call, network: str) -> None:
    """Remove every build step on ``network``, running or not."""
    import docker.errors

    for c in steps_on(docker_call, network, stopped=True):
        try:
            docker_call("remove_container", c["Id"], force=True)
        except docker.errors.APIError as e:
            log.info("gpulab: removing build step %s: %s", c["Id"][:12], e)


def remove_stale(docker_call, base_name: str) -> list[str]:
    """Remove the build networks of ``base_name`` a hub that is gone left behind (and the
    build steps still running on them): at ``gpulab up`` and ``gpulab down``, when no
    build of this hub runs. Returns the names removed."""
    import docker.errors

    gone = []
    prefix = f"{base_name}-build-"
    for net in docker_call("networks", filters={"label": "gpulab.network=build"}):
        name = net.get("Name", "")
        if not name.startswith(prefix):
            continue
        try:
            remove_steps(docker_call, name)
            docker_call("remove_network", name)
        except docker.errors.APIError as e:
            log.warning("gpulab: could not remove the old build network %s: %s", name, e)
            continue
        gone.append(name)
    return gone


class StepWatch(threading.Thread):
    """Every ``every`` seconds, the running step of a build is killed when the build is
    past its deadline or its disk limit (what it added: the newest committed layer's
    image above its stage's base, plus what the running step wrote).

    Asking Docker for a step's size walks its files, which costs a busy step (pip
    writing thousands of files) real time; so where the engine's data folder is on
    this machine (``root_dir``), the watch first reads how much free space the disk
    lost since the build began (one statvfs): a build cannot have written more than
    that, and only past the limit is Docker asked for the exact figure."""

    def __init__(
        self,
        docker_call,
        network: str,
        limits: BuildLimits,
        every: float = 1.0,
        root_dir: str | None = None,
    ):
        super().__init__(name="gpulab-build-watch", daemon=True)
        self.docker_call, self.network, self.limits, self.every = (
            docker_call,
            network,
            limits,
            every,
        )
        self.deadline = time.monotonic() + limits.timeout
        self.quick_deadline = time.monotonic() + limits.quick_s if limits.quick_s else None
        self.base_size = self.layer_size = 0
        self.stopped: str = ""  # "time", "quick" or "disk" once it killed a step for that
        self.used_bytes = 0
        self.exact_checks = 0  # times Docker was asked for the sizes
        self.root_dir = root_dir if root_dir and os.path.isdir(root_dir) else None
        self._free_at_start = self._free()
        self._from_next = False
        self._done = threading.Event()

    def line(self, line: str) -> None:
        """Follow the classic builder's output: a stage's FROM, then each committed layer."""
        m = _COMMITTED.match(line)
        if line.startswith("Step ") and " : FROM " in line.upper():
            self._from_next = True
        elif m:
            size = self._image_size(m.group(1))
            if self._from_next:
                self.base_size, self.layer_size, self._from_next = size, 0, False
            else:
                self.layer_size = max(0, size - self.base_size)

    def _image_size(self, image_id: str) -> int:
        import docker.errors

        try:
            return int(self.docker_call("inspect_image", image_id).get("Size") or 0)
        except (docker.errors.APIError, ValueError, TypeError):
            return 0

    def kill_steps(self) -> None:
        import docker.errors

        for c in steps_on(self.docker_call, self.network):
            try:
                self.docker_call("kill", c["Id"])
            except docker.errors.APIError as e:
                log.info("gpulab: stopping build step %s: %s", c["Id"][:12], e)

    def _free(self) -> int | None:
        if self.root_dir is None:
            return None
        try:
            st = os.statvfs(self.root_dir)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def _may_be_over(self) -> bool:
        """Whether the build may be past its disk limit (False only when sure it is not)."""
        free = self._free()
        if free is None or self._free_at_start is None:
            return True
        return self._free_at_start - free > self.limits.disk

    def run(self) -> None:
        while not self._done.wait(self.every):
            if not self.stopped:
                self.stopped = self._over()
            if self.stopped:
                # and at every tick after, until the build ended: a step that begins
                # after the first kill (the builder goes on to the next) runs no longer
                self.kill_steps()

    def _over(self) -> str:
        """The limit the build is past now ("" for none)."""
        now = time.monotonic()
        if now > self.deadline:
            return "time"
        if self.quick_deadline is not None and now > self.quick_deadline:
            return "quick"
        if self.limits.quick_stop is not None and self.limits.quick_stop.is_set():
            return "quick"
        if self._may_be_over():
            self.exact_checks += 1
            steps = steps_on(self.docker_call, self.network, size=True)
            self.used_bytes = self.layer_size + sum(int(c.get("SizeRw") or 0) for c in steps)
            if self.used_bytes > self.limits.disk:
                return "disk"
        return ""

    def stop(self) -> None:
        self._done.set()


class CappedLog:
    """A build log that keeps its first ``limit / 2`` bytes and its last ``limit / 2``,
    with a line saying how much was left out in between."""

    def __init__(self, path: Path, limit: int):
        self.path, self.half = path, max(1024, limit // 2)
        self.file = open(path, "w", encoding="utf-8", errors="replace")
        self.head_left = self.half
        self.tail: deque[str] = deque()
        self.tail_bytes = 0
        self.skipped_lines = self.skipped_bytes = 0

    def write(self, line: str) -> None:
        line = line + "\n"
        size = len(line.encode("utf-8", errors="replace"))
        if self.head_left > 0 and not self.tail:
            self.file.write(line)
            self.head_left -= size
            return
        self.tail.append(line)
        self.tail_bytes += size
        while self.tail_bytes > self.half and len(self.tail) > 1:
            old = self.tail.popleft()
            self.tail_bytes -= len(old.encode("utf-8", errors="replace"))
            self.skipped_lines += 1
            self.skipped_bytes += len(old.encode("utf-8", errors="replace"))

    @property
    def cut(self) -> bool:
        return self.skipped_lines > 0

    def close(self) -> None:
        if self.file.closed:
            return
        if self.skipped_lines:
            self.file.write(
                f"[gpulab: {self.skipped_lines} lines ({self.skipped_bytes} bytes) of this "
                "build's output left out here; the log keeps its beginning and its end]\n"
            )
        self.file.writelines(self.tail)
        self.file.close()


def rotate_logs(folder: Path, pattern: re.Pattern, keep: int) -> None:
    """Remove all but the newest ``keep`` build logs in ``folder`` (names sort by time)."""
    try:
        names = sorted(p.name for p in folder.iterdir() if pattern.fullmatch(p.name))
    except FileNotFoundError:
        return
    for name in names[: max(0, len(names) - keep)]:
        (folder / name).unlink(missing_ok=True)

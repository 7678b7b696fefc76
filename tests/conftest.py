"""Shared fixtures: a real Docker engine, a real hub started with `gpulab up`.

Every Docker object the tests make is named with PREFIX and removed at the
start and end of the run; a dockerd the tests started is stopped at the end.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from torch_wheel import cpu_torch_wheel

from gpulab_hub import host

# Markers by what a test needs, and the fast lane's `slow` list (docs/testing.md).
pytest_plugins = ("lanes",)

# Prefix of every Docker object and container the tests make; two runs at once
# (say, a benchmark beside the suite) use different prefixes, and so does each worker
# of one run (pytest-xdist's gw0, gw1...: `make test` runs several). Modules that read
# the variable themselves, and the hubs the tests start, see the worker's own.
RUN_PREFIX = os.environ.get("GPULAB_TEST_RUN_PREFIX") or os.environ.get(
    "GPULAB_TEST_PREFIX", "gpulabtest"
)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
PREFIX = RUN_PREFIX + WORKER
os.environ["GPULAB_TEST_RUN_PREFIX"] = RUN_PREFIX
os.environ["GPULAB_TEST_PREFIX"] = PREFIX
# What the workers of one run share: the Docker engine the run started (stopped by
# the run's controller once every worker is done) and the ports handed out.
SHARED = Path(tempfile.gettempdir()) / f"{RUN_PREFIX}-run"


def run_file(name: str) -> Path:
    """A file in SHARED of this run only (its controller's process id, which its
    workers inherit): a fast-lane run beside a whole run leaves the whole run's alone."""
    return SHARED / f"{name}-{os.environ.get('GPULAB_TEST_RUN', os.getpid())}"


# Blocking work on an event loop's thread (a store lock, a Docker call) fails the test
# instead of a warning (gpulab_hub/blocking.py); the hubs tests start inherit it (hub_env).
os.environ["GPULAB_LOOP_GUARD"] = "strict"
REPO = Path(__file__).resolve().parents[1]
GPULAB = str(Path(sys.executable).parent / "gpulab")


def free_port() -> int:
    """A port free now, and never one this test run (any of its workers) handed out
    before: a hub binds its ports later, so two hubs (or one hub's proxy, twice) must
    not be given the same one."""
    from filelock import FileLock

    SHARED.mkdir(exist_ok=True)
    given = run_file("ports-given")
    with FileLock(str(SHARED / "ports.lock"), timeout=60):
        taken = set(given.read_text().split()) if given.exists() else set()
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if str(port) not in taken:
                with given.open("a") as f:
                    f.write(f"{port}\n")
                return port


def cleanup_docker(dk: host.Docker) -> None:
    for c in dk.call("containers", all=True, filters={"name": PREFIX}):
        dk.call("remove_container", c["Id"], force=True, v=True)
    host.remove_image_trees(dk, PREFIX)
    for vol in dk.call("volumes").get("Volumes") or []:
        if vol["Name"].startswith(PREFIX):
            dk.call("remove_volume", vol["Name"], force=True)
    for net in dk.call("networks", names=[PREFIX]):
        if net["Name"].startswith(PREFIX) and not net.get("Containers"):
            dk.call("remove_network", net["Id"])


def print_container_logs(dk: host.Docker) -> None:
    for c in dk.call("containers", all=True, filters={"name": PREFIX}):
        name = c["Names"][0]
        logs = dk.call("logs", c["Id"], tail=40).decode(errors="replace")
        print(f"\n----- docker logs {name} (last 40 lines) -----\n{logs}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


DOCKERD_STARTED = "dockerd-started-by-this-run"


@pytest.fixture(scope="session")
def docker_engine():
    """A reachable Docker engine (started here if none runs), cleaned of this worker's
    test objects. One engine for all workers of a run: the first to need it starts it;
    the run stops it at its end (pytest_sessionfinish) if the run started it."""
    from filelock import FileLock

    SHARED.mkdir(exist_ok=True)
    dk = host.Docker()
    with FileLock(str(SHARED / "dockerd.lock"), timeout=120):
        if host.ensure_dockerd(dk, SHARED / "dockerd"):
            run_file(DOCKERD_STARTED).touch()
    cleanup_docker(dk)
    yield dk
    cleanup_docker(dk)


def _controller(config) -> bool:
    """The process that runs the whole session: the only one without xdist, or
    xdist's controller (its workers have ``workerinput``)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    """Every browser test: Playwright's assertions wait as long as a loaded machine
    needs (browser_kit.py). A machine without Playwright (the GPU host's run of the gpu
    tests) runs no browser test.

    The tests that read jupyterhub_config.py in this process start no GPU-figures reader
    (gpus/metrics.register finds one, never started): the hubs they configure are not
    running, and a reader left behind kept reading their removed databases for the rest
    of the run, its warnings in other tests' failure output."""
    import importlib.util

    from gpulab_hub.gpus import metrics

    if _controller(config):  # before xdist starts the workers, which inherit it
        os.environ.setdefault("GPULAB_TEST_RUN", str(os.getpid()))

    metrics._registered = metrics._registered or metrics.GpuCollector(lambda: None)
    if importlib.util.find_spec("playwright") is None:
        return
    from browser_kit import EXPECT_TIMEOUT_MS
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)


def pytest_sessionstart(session):
    if _controller(session.config):
        run_file(DOCKERD_STARTED).unlink(missing_ok=True)
        run_file("ports-given").unlink(missing_ok=True)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session):
    """The engine this run started, stopped once every worker is done."""
    if not _controller(session.config):
        return
    run_file("ports-given").unlink(missing_ok=True)
    if run_file(DOCKERD_STARTED).exists():
        host.stop_dockerd(SHARED / "dockerd")
        run_file(DOCKERD_STARTED).unlink(missing_ok=True)


class Hub:
    def __init__(self, url: str, home: Path, env: dict, admin_password: str, up_output: str):
        self.url = url
        self.home = home
        self.env = env
        self.admin_password = admin_password
        self.up_output = up_output

    @property
    def log(self) -> str:
        return (self.home / "hub" / "hub.log").read_text(errors="replace")

    def gpulab(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([GPULAB, *args], env=self.env, capture_output=True, text=True)


def hub_env(home: Path, **extra) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "GPULAB_HOME": str(home),
            "GPULAB_BIND_URL": f"http://127.0.0.1:{free_port()}",
            "GPULAB_HUB_PORT": str(free_port()),
            "GPULAB_PROXY_API_PORT": str(free_port()),
            "GPULAB_SSH_PORT": str(free_port()),
            # Revoked shares end within 8 s, not 30: the tests that wait for it are quick.
            "GPULAB_REVOKE_WITHIN_S": "8",
            "GPULAB_CONTAINER_PREFIX": PREFIX,
            "GPULAB_IMAGE_REPO": f"{PREFIX}/project",
            "GPULAB_BASE_IMAGE": f"{PREFIX}/base:latest",
            "GPULAB_BASE_FROM": f"{PREFIX}/debian:bookworm",
            "GPULAB_TORCH": os.environ.get("GPULAB_TORCH") or cpu_torch_wheel(),  # CPU, on disk
            # a disk-filling build is stopped well before it fills the test machine
            "GPULAB_BUILD_DISK_LIMIT_MB": "768",
            # no background builds of the starting points (minutes of CPU on a 2-core CI
            # machine, the Hugging Face one a large download): test_prebuild.py's hub
            # builds two of them
            "GPULAB_PREBUILD": "none",
        }
    )
    env.update(extra)
    return env


class HubLaunch:
    """`gpulab up` running in the background; :meth:`hub` waits for it."""

    def __init__(self, home: Path, env: dict):
        self.home, self.env = home, env
        self.proc = subprocess.Popen(
            [GPULAB, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._hub: Hub | None = None

    def hub(self, timeout: float = 900) -> Hub:
        if self._hub is None:
            try:
                out, err = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, err = self.proc.communicate()
            if self.proc.returncode != 0:
                log = self.home / "hub" / "hub.log"
                raise AssertionError(
                    f"gpulab up failed:\n{out}\n{err}\n"
                    + (log.read_text()[-3000:] if log.exists() else "")
                )
            m = re.search(r"with the password (\S+)", out)
            password = m.group(1) if m else self.env.get("GPULAB_ADMIN_PASSWORD", "")
            self._hub = Hub(self.env["GPULAB_BIND_URL"], self.home, self.env, password, out)
        return self._hub

    def wait(self) -> None:
        """Until `gpulab up` has ended (its base image built), whether or not it worked."""
        self.proc.wait()


# The session hub's `gpulab up`, started as the session starts (session_hub_launch).
_EARLY: list[HubLaunch] = []


def start_hub(home: Path, env: dict) -> Hub:
    # After the session hub's `gpulab up`: it builds the base image every hub uses, and
    # two builds of one image at once would each take the whole time.
    for launch in _EARLY:
        launch.wait()
    return HubLaunch(home, env).hub()


@pytest.fixture(scope="session", autouse=True)
def session_hub_launch(request, tmp_path_factory):
    """Starts the session hub's `gpulab up` in the background as the session starts,
    when a test of this run uses that hub: its first base-image build (minutes) runs
    while the tests that need no Docker engine run (they come first: see
    pytest_collection_modifyitems). `gpulab down` at the end of the session."""
    if not any("hub" in item.fixturenames for item in request.session.items):
        yield None
        return
    request.getfixturevalue("docker_engine")  # test objects of an earlier run removed first
    home = tmp_path_factory.mktemp("gpulab-home")
    launch = HubLaunch(home, hub_env(home))
    _EARLY.append(launch)
    yield launch
    if launch.proc.poll() is None:  # the run ended before any test used the hub
        launch.proc.terminate()
    launch.wait()
    down = subprocess.run([GPULAB, "down"], env=launch.env, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr


@pytest.fixture(scope="session")
def hub(docker_engine, session_hub_launch):
    """A hub started by `gpulab up` on 127.0.0.1, stopped by `gpulab down`."""
    assert session_hub_launch is not None, "name `hub` in the test's arguments, not by request"
    return session_hub_launch.hub()


@pytest.fixture(scope="session")
def shared_cluster(docker_engine):
    """The test cluster (tests/cluster_kit.py, shared_kit) of the modules that share one:
    started at first use, stopped and checked at the session's end."""
    from cluster_kit import shared_kit

    yield from shared_kit(PREFIX)


# The second hub's login rules: locked after 3 wrong passwords, for 6 s.
SECOND_HUB_LOCK_AFTER, SECOND_HUB_LOCK_SECONDS = 3, 6


@pytest.fixture(scope="session")
def second_hub(docker_engine, tmp_path_factory):
    """A hub for what the session hub must not have: accounts deleted, logins locked after
    SECOND_HUB_LOCK_AFTER wrong passwords for SECOND_HUB_LOCK_SECONDS, public links on;
    containers of their own prefix (<prefix>acct). One hub for the modules that need
    these (security/test_accounts.py, test_public_links.py): a hub costs ~15 s."""
    home = tmp_path_factory.mktemp("gpulab-second-home")
    env = hub_env(
        home,
        GPULAB_CONTAINER_PREFIX=PREFIX + "acct",
        GPULAB_LOGIN_ATTEMPTS=str(SECOND_HUB_LOCK_AFTER),
        GPULAB_LOGIN_LOCKOUT_SECONDS=str(SECOND_HUB_LOCK_SECONDS),
        GPULAB_PUBLIC_LINKS="1",
    )
    h = start_hub(home, env)
    yield h
    down = h.gpulab("down")
    assert down.returncode == 0, down.stderr


@pytest.fixture
def show_logs_on_failure(request, docker_engine, hub):
    """Print the hub log tail and the test containers' logs when the test fails."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("\n----- hub log (last 60 lines) -----")
        print("\n".join(hub.log.splitlines()[-60:]))
        print_container_logs(docker_engine)


@pytest.fixture(scope="session")
def local_debian(docker_engine) -> str:
    """The local Debian base image (debootstrap, cached), named with the test prefix."""
    return host.ensure_local_debian(docker_engine, f"{PREFIX}/debian:bookworm", host.cache_dir())


def pytest_collection_modifyitems(config, items):
    """Modules that need no Docker engine run first, while the session hub's first
    base-image build runs (session_hub_launch); the others keep their order. Skip
    `gpu`-marked tests, with the reason shown, where this machine has no NVIDIA GPU."""
    import shutil

    docker_modules = {item.module for item in items if "docker_engine" in item.fixturenames}
    items.sort(key=lambda item: item.module in docker_modules)  # stable: order kept within
    if Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi"):
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU here (no /dev/nvidiactl, no nvidia-smi)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_FILE_SECONDS: dict[tuple[str, str], float] = {}


def pytest_runtest_logreport(report):
    """Add up each test file's setup, call and teardown seconds per worker (below)."""
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    key = (gateway.id if gateway else "main", report.nodeid.split("::")[0])
    _FILE_SECONDS[key] = _FILE_SECONDS.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Where a whole run's minutes went: each worker's busy seconds and the slowest test
    files, printed and written to test-output/file-seconds.json (docs/testing.md)."""
    if not _FILE_SECONDS:
        return
    import json

    workers: dict[str, float] = {}
    files: dict[str, float] = {}
    for (worker, file), seconds in _FILE_SECONDS.items():
        workers[worker] = workers.get(worker, 0.0) + seconds
        files[file] = files.get(file, 0.0) + seconds
    busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(workers.items()))
    terminalreporter.write_sep("-", f"busy per worker: {busy}")
    for file, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:12]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {file}")
    out = Path(__file__).resolve().parents[1] / "test-output"
    out.mkdir(exist_ok=True)
    rows = [{"worker": w, "file": f, "seconds": round(s, 2)} for (w, f), s in _FILE_SECONDS.items()]
    (out / "file-seconds.json").write_text(json.dumps(rows, indent=1))


@pytest.fixture(scope="module")
def localhost_names():
    """``localhost`` and ``*.localhost`` resolve to 127.0.0.1 in this process for the
    module, as browsers resolve them (hubclient.localhost_names)."""
    from hubclient import localhost_names as resolving

    with resolving():
        yield


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright, one per test module (browser_kit.py)."""
    from browser_kit import launch
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = launch(pw)
        yield b
        b.close()


@pytest.fixture(scope="module")
def pg_server():
    """A PostgreSQL server of the tests' own for a module (tests/pg_kit.py); its URL."""
    import shutil

    import pg_kit

    folder = Path(tempfile.mkdtemp(prefix="gpulab-test-pg-"))  # the postgres account's too
    try:
        with pg_kit.server(folder) as url:
            yield url
    finally:
        shutil.rmtree(folder, ignore_errors=True)

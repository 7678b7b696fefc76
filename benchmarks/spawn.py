"""Spawn-to-ready of N projects: gpulab's ProjectSpawner vs a plain DockerSpawner.

Starts everything it needs and stops it again: a Docker engine if none runs, a
gpulab hub (`gpulab up`) and a baseline hub with a plain DockerSpawner
(benchmarks/plain_dockerspawner_config.py), both on 127.0.0.1 with host
networking, running the same image. Every Docker object it makes is named
gpulabbench* and removed at the start and the end. The last line printed is
``spawn_p50_ratio=<gpulab p50 / plain DockerSpawner p50>``.

Usage: .venv/bin/python benchmarks/spawn.py [--n 4] [--rounds 1] [--idle 5]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker.errors
import requests

from gpulab_hub import cli, host

PREFIX = "gpulabbench"
PLAIN_PREFIX = f"{PREFIX}-plain"
USER = "bench"
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PLAIN_CONFIG = Path(__file__).resolve().with_name("plain_dockerspawner_config.py")
POLL = 0.1  # seconds between readiness polls
SPAWN_TIMEOUT = 300
STOP_TIMEOUT = 120
UP_TIMEOUT = 1800  # `gpulab up` builds the base image (pip installs JupyterLab)


class BenchError(Exception):
    """The benchmark cannot go on; the message says why."""


def say(msg: str) -> None:
    print(msg, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cleanup_docker(dk: host.Docker) -> None:
    """Remove this benchmark's containers, images (children first) and volumes.

    Only names this script makes: PREFIX is also the start of other prefixes
    (benchmarks/rebuild.py uses gpulabbench-rebuild), so no bare prefix match.
    """
    ours = (f"/{PREFIX}-{USER}--", f"/{PLAIN_PREFIX}-{USER}--")
    for c in dk.call("containers", all=True, filters={"name": PREFIX}):
        if any(name.startswith(ours) for name in c["Names"]):
            dk.call("remove_container", c["Id"], force=True, v=True)
    host.remove_image_trees(dk, PREFIX)
    for vol in dk.call("volumes").get("Volumes") or []:
        if vol["Name"].startswith(f"{PREFIX}-hf-"):
            dk.call("remove_volume", vol["Name"], force=True)
    for net in dk.call("networks", names=[PREFIX]):
        if net["Name"] in (f"{PREFIX}-net", f"{PLAIN_PREFIX}-net"):
            dk.call("remove_network", net["Id"])


class HubUser:
    """A hub account driven like the browser (forms + XSRF), then by API token."""

    def __init__(self, base_url: str, name: str, password: str):
        self.base = base_url.rstrip("/")
        self.name = name
        self.password = password
        self.http = requests.Session()
        self.token = ""

    def _post_form(self, page: str, target: str, data: dict, **kw) -> requests.Response:
        self.http.get(self.base + page, timeout=10)
        data["_xsrf"] = self.http.cookies.get("_xsrf", path="/hub/")
        return self.http.post(self.base + target, data=data, timeout=10, **kw)

    def signup(self) -> None:
        pw = self.password
        data = {"username": self.name, "signup_password": pw, "signup_password_confirmation": pw}
        r = self._post_form("/hub/signup", "/hub/signup", data)
        if r.status_code != 200:
            raise BenchError(f"sign-up of {self.name} failed: HTTP {r.status_code}")

    def authorize(self, username: str) -> None:
        """Approve a signed-up user as an admin's browser does (a form POST with _xsrf)."""
        r = self._post_form("/hub/authorize", f"/hub/authorize/{username}", {"action": "authorize"})
        if r.status_code != 200:
            raise BenchError(f"approving {username} failed: HTTP {r.status_code}")

    def login(self) -> None:
        data = {"username": self.name, "password": self.password}
        r = self._post_form("/hub/login", "/hub/login?next=", data, allow_redirects=False)
        if r.status_code != 302:
            raise BenchError(f"login of {self.name} at {self.base} failed: HTTP {r.status_code}")
        r = self.http.post(
            f"{self.base}/hub/api/users/{self.name}/tokens",
            headers={"X-XSRFToken": self.http.cookies.get("_xsrf", path="/hub/")},
            json={"note": "gpulab spawn benchmark", "expires_in": 7200},
            timeout=10,
        )
        if r.status_code not in (200, 201):
            raise BenchError(f"token for {self.name} failed: HTTP {r.status_code} {r.text}")
        self.token = r.json()["token"]

    def api(self, method: str, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 30)
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(method, f"{self.base}/hub/api{path}", headers=headers, **kw)

    def servers(self) -> dict:
        r = self.api("GET", f"/users/{self.name}")
        r.raise_for_status()
        return r.json()["servers"]

    def spawn(self, server: str, timeout: float = SPAWN_TIMEOUT) -> float:
        """Start a named server; seconds from the POST until the hub says it is ready."""
        t0 = time.perf_counter()
        r = self.api("POST", f"/users/{self.name}/servers/{server}", json={}, timeout=timeout)
        if r.status_code not in (201, 202):
            raise BenchError(f"start {server} at {self.base}: HTTP {r.status_code} {r.text}")
        while True:
            model = self.servers().get(server)
            if model and model["ready"]:
                return time.perf_counter() - t0
            if not model or not model.get("pending"):
                raise BenchError(f"{server} at {self.base} failed to start (see the hub log)")
            if time.perf_counter() - t0 > timeout:
                raise BenchError(f"{server} at {self.base} not ready after {timeout} s")
            time.sleep(POLL)

    def stop(self, server: str, timeout: float = STOP_TIMEOUT) -> None:
        r = self.api("DELETE", f"/users/{self.name}/servers/{server}")
        if r.status_code not in (202, 204):
            raise BenchError(f"stop {server} at {self.base}: HTTP {r.status_code} {r.text}")
        deadline = time.monotonic() + timeout
        while server in self.servers():
            if time.monotonic() > deadline:
                raise BenchError(f"{server} at {self.base} did not stop within {timeout} s")
            time.sleep(0.25)


class Hub:
    """One hub: its environment, its admin and the benchmark user."""

    def __init__(self, label: str, home: Path, prefix: str, n: int):
        self.label = label
        self.up_tried = False  # `gpulab up` ran (so `gpulab down` must run)
        self.home = home
        self.hub_dir = home / "hub"
        self.proc: subprocess.Popen | None = None
        self.admin_password = secrets.token_urlsafe(16)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.env = dict(os.environ)
        self.env.update(
            {
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "GPULAB_HOME": str(home),
                "GPULAB_BIND_URL": self.url,
                "GPULAB_HUB_PORT": str(free_port()),
                "GPULAB_PROXY_API_PORT": str(free_port()),
                "GPULAB_ADMIN_PASSWORD": self.admin_password,
                "GPULAB_CONTAINER_PREFIX": prefix,
                "GPULAB_IMAGE_REPO": f"{PREFIX}/project",
                "GPULAB_BASE_IMAGE": f"{PREFIX}/base:latest",
                "GPULAB_BASE_FROM": f"{PREFIX}/debian:bookworm",
                "GPULAB_MAX_PROJECTS": str(max(10, n)),
                # no background builds of the starting points: what is timed runs alone
                "GPULAB_PREBUILD": "none",
            }
        )
        self.user: HubUser | None = None
        self.running: set[str] = set()

    def log_tail(self, lines: int = 30) -> str:
        log = self.hub_dir / "hub.log"
        if not log.exists():
            return "(no hub log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def gpulab(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        cmd = [str(BIN / "gpulab"), *args]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start_gpulab(self) -> None:
        self.up_tried = True
        up = self.gpulab("up", timeout=UP_TIMEOUT)
        if up.returncode != 0:
            raise BenchError(f"gpulab up failed:\n{up.stdout}{up.stderr}\n{self.log_tail()}")

    def start_plain(self, image: str) -> None:
        self.hub_dir.mkdir(parents=True, exist_ok=True)
        self.env["GPULAB_BENCH_IMAGE"] = image
        log_path = self.hub_dir / "hub.log"
        cmd = [sys.executable, "-m", "jupyterhub", "-f", str(PLAIN_CONFIG)]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.hub_dir, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        try:
            cli.wait_for_hub(self.url, self.proc, log_path, timeout=120)
        except host.HostError as e:
            raise BenchError(f"the plain DockerSpawner hub did not start: {e}") from e

    def make_user(self) -> HubUser:
        admin = HubUser(self.url, "admin", self.admin_password)
        admin.login()
        user = HubUser(self.url, USER, f"{USER}-{secrets.token_urlsafe(12)}")
        user.signup()
        admin.authorize(USER)
        user.login()
        self.user = user
        return user

    def spawn(self, server: str) -> float:
        self.running.add(server)
        return self.user.spawn(server)

    def stop(self, server: str) -> None:
        self.user.stop(server)
        self.running.discard(server)

    def shutdown(self) -> None:
        """Stop this hub's servers, then the hub (and a proxy it left behind)."""
        problems = []
        for server in sorted(self.running):
            try:
                self.stop(server)
            except (BenchError, requests.RequestException) as e:
                problems.append(str(e))
        if self.up_tried:
            down = self.gpulab("down", timeout=300)
            if down.returncode != 0:
                problems.append(f"gpulab down failed: {down.stdout}{down.stderr}")
        if self.proc is not None and self.proc.poll() is None:
            host.stop_pid(self.proc.pid)
            self.proc.wait(timeout=5)
        proxy_pid = self.hub_dir / "jupyterhub-proxy.pid"
        if proxy_pid.exists() and proxy_pid.read_text().strip().isdigit():
            host.stop_pid(int(proxy_pid.read_text()), timeout=10)
        if problems:
            raise BenchError(f"{self.label}: " + "; ".join(problems))


def container(dk: host.Docker, name: str) -> dict:
    try:
        return dk.call("inspect_container", name)
    except docker.errors.NotFound as e:
        raise BenchError(f"no container {name}") from e


def idle_memory_mib(dk: host.Docker, name: str) -> float:
    """Memory of a container as `docker stats` shows it: usage less inactive page cache."""
    mem = dk.call("stats", container(dk, name)["Id"], stream=False)["memory_stats"]
    if "usage" not in mem:
        raise BenchError(f"Docker reports no memory usage for {name}")
    st = mem.get("stats") or {}
    inactive = st.get("total_inactive_file", st.get("inactive_file", 0))
    return (mem["usage"] - inactive) / 2**20


def project_images(dk: host.Docker) -> set[str]:
    """Tags of the project images gpulab has built in this run."""
    return {t for img in dk.call("images", name=f"{PREFIX}/project") for t in img["RepoTags"]}


def summary(times: list[float]) -> tuple[float, float, float]:
    return statistics.median(times), max(times), statistics.fmean(times)


def fmt(times: list[float]) -> str:
    return " ".join(f"{t:.2f}" for t in times)


def run(args, dk: host.Docker, gp: Hub, plain: Hub) -> dict:
    servers = [f"p{i}" for i in range(1, args.n + 1)]
    res: dict = {"docker": dk.call("version").get("Version", "?")}

    say("Starting the gpulab hub (gpulab up; builds gpulabbench/base the first time)...")
    t0 = time.perf_counter()
    gp.start_gpulab()
    res["up_s"] = time.perf_counter() - t0
    gp.make_user()

    # Each project gets its own Dockerfile (its name is in the header comment), so
    # its image is built on its first start and reused from then on: start every
    # project once (warm-up), stop it, and measure the second starts.
    say(f"Warm-up: first start of {args.n} gpulab projects (each builds its image)...")
    res["gp_first"] = [gp.spawn(s) for s in servers]
    res["image"] = container(dk, f"{PREFIX}-{USER}--{servers[0]}")["Config"]["Image"]
    res["project_images"] = project_images(dk)
    for s in servers:
        gp.stop(s)

    say(f"Starting the plain DockerSpawner hub with the image {res['image']}...")
    plain.start_plain(res["image"])
    plain.make_user()
    say(f"Warm-up: first start of {args.n} plain DockerSpawner servers...")
    res["plain_first"] = [plain.spawn(s) for s in servers]
    for s in servers:
        plain.stop(s)

    say(f"Measuring: {args.n} starts per side x {args.rounds} round(s), alternating sides...")
    res["load_start"] = os.getloadavg()[0]
    res["gp"], res["plain"] = [], []
    hubs = {"gp": gp, "plain": plain}
    for r in range(args.rounds):
        if r:
            for hub in (gp, plain):
                for s in servers:
                    hub.stop(s)
        for i, s in enumerate(servers):
            # ABBA order, so a drift in machine load hits both sides alike.
            for side in ("gp", "plain") if i % 2 == 0 else ("plain", "gp"):
                res[side].append(hubs[side].spawn(s))
    res["load_end"] = os.getloadavg()[0]

    if project_images(dk) != res["project_images"]:
        raise BenchError("a measured gpulab start built a project image; the warm-up missed it")
    say(f"All {2 * args.n} servers ready; idle {args.idle:g} s, then read memory...")
    time.sleep(args.idle)
    res["gp_mem"] = idle_memory_mib(dk, f"{PREFIX}-{USER}--{servers[0]}")
    res["plain_mem"] = idle_memory_mib(dk, f"{PLAIN_PREFIX}-{USER}--{servers[0]}")
    return res


def report(args, res: dict) -> None:
    gp, pl = summary(res["gp"]), summary(res["plain"])
    say("")
    say(
        f"spawn-to-ready, N={args.n} per side x {args.rounds} round(s), "
        f"{os.cpu_count()} CPU cores, Docker {res['docker']}"
    )
    say(f"image (both sides): {res['image']}")
    say(f"gpulab up (incl. base image build): {res['up_s']:.1f} s")
    say(f"warm-up first starts, gpulab (builds each project image): {fmt(res['gp_first'])} s")
    say(
        f"  -> {len(res['project_images'])} project image(s) for {args.n} projects "
        "(a project's Dockerfile names it, so each project has its own image tag)"
    )
    say(f"warm-up first starts, plain DockerSpawner: {fmt(res['plain_first'])} s")
    say("measured: second start of each project, its image already exists (no build);")
    say("          POST /hub/api/users/<u>/servers/<p> until the hub reports ready,")
    say("          sides alternating (ABBA); all servers kept running until the end")
    say(
        f"load average (1 min) at start / end of the measured starts: "
        f"{res['load_start']:.1f} / {res['load_end']:.1f}"
    )
    if max(res["load_start"], res["load_end"]) > (os.cpu_count() or 1):
        say("note: load average above the core count: other work shares this machine,")
        say("      so these times are noisy (more samples: --rounds)")
    say("")
    say(f"{'side':<24}{'p50 s':>8}{'max s':>8}{'mean s':>8}{'idle MiB':>10}  per spawn s")
    for label, (p50, mx, mean), mem, times in (
        ("gpulab ProjectSpawner", gp, res["gp_mem"], res["gp"]),
        ("plain DockerSpawner", pl, res["plain_mem"], res["plain"]),
    ):
        say(f"{label:<24}{p50:>8.2f}{mx:>8.2f}{mean:>8.2f}{mem:>10.1f}  {fmt(times)}")
    say(f"idle memory: one server container each, {args.idle:g} s after all were ready")
    say(f"spawn_p50_ratio={gp[0] / pl[0]:.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4, help="projects per side (default 4)")
    parser.add_argument(
        "--idle", type=float, default=5, help="seconds idle before reading memory (default 5)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="measured starts of the N projects (default 1)"
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be at least 1")

    work = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    dk = host.Docker()
    dockerd_started = None
    gp = plain = None
    res = None
    failed = False
    try:
        dockerd_started = host.ensure_dockerd(dk, work / "dockerd")
        cleanup_docker(dk)
        gp = Hub("gpulab hub", work / "gpulab", PREFIX, args.n)
        plain = Hub("plain hub", work / "plain", PLAIN_PREFIX, args.n)
        res = run(args, dk, gp, plain)
    except (BenchError, host.HostError, OSError, subprocess.SubprocessError) as e:
        failed = True
        print(f"spawn.py: error: {e}", file=sys.stderr)
    except (requests.RequestException, docker.errors.DockerException) as e:
        failed = True
        print(f"spawn.py: error talking to a hub or Docker: {e!r}", file=sys.stderr)
    finally:
        say("Stopping servers and hubs, removing gpulabbench* Docker objects...")
        for hub in (plain, gp):
            if hub is None:
                continue
            if failed:
                print(f"----- {hub.label} log (tail) -----\n{hub.log_tail()}", file=sys.stderr)
            try:
                hub.shutdown()
            except (BenchError, OSError, subprocess.SubprocessError) as e:
                failed = True
                print(f"spawn.py: cleanup: {e}", file=sys.stderr)
        try:
            if dk.reachable():
                cleanup_docker(dk)
        except docker.errors.DockerException as e:
            failed = True
            print(f"spawn.py: cleanup of Docker objects failed: {e}", file=sys.stderr)
        if dockerd_started:
            host.stop_dockerd(work / "dockerd")
        shutil.rmtree(work, ignore_errors=True)
    if failed or res is None:
        return 1
    report(args, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

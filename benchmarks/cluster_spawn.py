"""Projects on a Slurm cluster against one machine, in one run: spawn-to-ready,
queue-to-running and the image's way to a fresh node (docs/cluster.md's figures).

Starts everything itself: the test cluster of tests/cluster_kit.py (slurmctld, two
slurmd nodes with one dummy GPU each, each node with its own Docker engine, a
registry), a gpulab hub on this machine (``gpulab up``) and a hub whose spawner is
ProjectSlurmSpawner on that cluster (tests/cluster_hub.py). Both hubs run the same
project image (one project name, so one Dockerfile; the script checks the image id).
Everything is named gpulabbenchcluster* (the kit's prefixes allow no hyphen) and
removed at the start and the end, even on failure. The last line printed is
``cluster_spawn_ratio=<Slurm start on a node with the image, p50 / one machine, p50>``.

Usage: .venv/bin/python benchmarks/cluster_spawn.py [--n 3] [--keep-base]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import docker.errors
import requests

from gpulab_hub import host, pidfile
from gpulab_hub.cli import HUB_PIDFILE
from gpulab_hub.cluster import batch

PREFIX = "gpulabbenchcluster"
REPO = Path(__file__).resolve().parents[1]
WORK = Path(tempfile.gettempdir()) / f"{PREFIX}-work"
PROJECT = "p1"  # every user's project: one Dockerfile, one image
USERS = ("bench", "bench2", "bench3")
POLL = 0.1  # seconds between polls of the hub and squeue
TIMEOUT = 600


class BenchError(Exception):
    """The benchmark cannot go on; the message says why."""


def say(msg: str = "") -> None:
    print(msg, flush=True)


def tests_modules() -> SimpleNamespace:
    """The tests' cluster kit and hub helpers, for this benchmark's prefix (conftest
    reads GPULAB_TEST_PREFIX as it is imported)."""
    os.environ["GPULAB_TEST_PREFIX"] = PREFIX
    sys.path.insert(0, str(REPO / "tests"))
    import cluster_hub
    import conftest
    from cluster_engines import KitError
    from cluster_kit import SlurmKit
    from security import people

    return SimpleNamespace(hub=cluster_hub, conftest=conftest, SlurmKit=SlurmKit,
                           KitError=KitError, people=people)  # fmt: skip


# --- driving a hub as the spawn page does (every user's project is PROJECT) ------------


def server(user) -> dict | None:
    r = user.api("GET", f"/hub/api/users/{user.name}")
    r.raise_for_status()
    return r.json()["servers"].get(PROJECT)


def ask(user, method: str, gpus: int | None = None, path: str = "", **kw):
    """POST (start, with ``gpus`` unless None), DELETE (stop) or GET the project."""
    body = {"json": {} if gpus is None else {"gpus": gpus}} if method == "POST" else {}
    where = f"/hub/api/users/{user.name}/servers/{PROJECT}{path}"
    r = user.api(method, where, timeout=TIMEOUT, **body, **kw)
    if method != "GET" and r.status_code not in (201, 202, 204):
        raise BenchError(f"{method} {user.name}/{PROJECT}: HTTP {r.status_code} {r.text}")
    return r


def spawn(user, gpus: int | None = None) -> float:
    """POST the start, then poll until the hub says ready: spawn-to-ready in seconds."""
    t0 = time.monotonic()
    ask(user, "POST", gpus)
    while not (model := server(user)) or not model["ready"]:
        if not model or not model.get("pending") or time.monotonic() - t0 > TIMEOUT:
            raise BenchError(f"{user.name}/{PROJECT} did not start (see the hub log)")
        time.sleep(POLL)
    return time.monotonic() - t0


def stop(user) -> None:
    ask(user, "DELETE")
    deadline = time.monotonic() + 120
    while server(user) is not None:
        if time.monotonic() > deadline:
            raise BenchError(f"{user.name}/{PROJECT} did not stop within 120 s")
        time.sleep(0.25)


def traced_start(user, gpus: int) -> dict[str, float]:
    """A start followed as the spawn page follows it: each progress message and the
    seconds from the POST until it arrived (the stream is read as the hub sends it,
    opened as soon as the hub takes the start: older messages arrive at once)."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        post = pool.submit(ask, user, "POST", gpus)
        seen = follow(user, t0)
        post.result(TIMEOUT)
    return seen


def follow(user, t0: float) -> dict[str, float]:
    while (stream := ask(user, "GET", path="/progress", stream=True)).status_code != 200:
        stream.close()
        if time.monotonic() - t0 > 60:
            raise BenchError(f"no progress stream for {user.name}/{PROJECT}")
        time.sleep(0.02)
    seen: dict[str, float] = {}
    with stream:
        for line in stream.iter_lines(chunk_size=None):  # None: each chunk as it comes
            event = json.loads(line[5:]) if line.startswith(b"data:") else {}
            if event.get("failed"):
                raise BenchError(f"{user.name}/{PROJECT} failed: {event.get('message')}")
            seen.setdefault(event.get("message", ""), time.monotonic() - t0)
            if event.get("ready"):
                seen["ready"] = time.monotonic() - t0
                return seen
    raise BenchError(f"{user.name}/{PROJECT}'s progress ended before ready: {list(seen)}")


# The first start's steps, each ending with the progress message that starts the next;
# (*): the hub sees it by asking squeue and reading the job's output once a second.
STEPS = (
    ("the hub checks the image (no build)", "Sending the image to the cluster's registry"),
    ("push to the registry", "The image is in the cluster's registry"),
    ("the batch job made and sent", "Sending the project's job to the cluster"),
    ("queue: sbatch -> RUNNING (*)", "Running on node "),
    ("on the node before the pull (*)", "Fetching the project's image on node"),
    ("pull by digest on the node (*)", "Starting the project's container on node"),
    ("container start -> ready (*)", "ready"),
)


def steps(seen: dict[str, float]) -> list[tuple[str, float]]:
    marks = []
    for _, start in STEPS:
        times = [t for m, t in seen.items() if m.startswith(start)]
        if not times:
            raise BenchError(f"the spawn page never said {start!r}: {list(seen)}")
        marks.append(min(times))
    return [(s[0], b - a) for s, a, b in zip(STEPS, [0.0, *marks[:-1]], marks, strict=True)]


# --- the cluster's side ---------------------------------------------------------------


def job_state(t, kit, user) -> tuple[str, str]:
    """(state, nodes) of the user's project job in squeue, ("", "") if none."""
    name = f"{t.hub.PREFIX}-{user.name}--{PROJECT}"
    found = [(j.state, j.nodes) for j in kit.slurm().queue() if j.name == name]
    return found[0] if found else ("", "")


def node_image_ids(kit, node: str) -> set[str]:
    return {img["Id"] for img in kit.node_engine(node).call("images")}


def pull_on_node(kit, node: str, ref: str) -> float:
    """``docker pull`` by digest on a node's engine, as the batch script pulls."""
    cmd = ["docker", "-H", kit.node_docker_host(node), "--config", kit.node_docker_config,
           "pull", "-q", ref]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise BenchError(f"pull of {ref} on {node} failed: {done.stderr.strip()}")
    return time.monotonic() - t0


def queue_to_running(t, kit, users: list, rounds: int) -> list[tuple[float, float, float]]:
    """Both GPUs taken, a third project waits; ``rounds`` times: stop the project running
    longest and time, from its DELETE, its stop, the waiting job RUNNING (squeue) and the
    waiting project ready; the stopped project then starts again and waits."""
    running, waiting = users[:2], users[2]
    for u in running:
        spawn(u, gpus=1)
    out = []
    with ThreadPoolExecutor(2) as pool:
        starting = pool.submit(ask, waiting, "POST", 1)
        for _ in range(rounds):
            deadline = time.monotonic() + TIMEOUT
            while job_state(t, kit, waiting)[0] != "PENDING":
                if time.monotonic() > deadline:
                    raise BenchError(f"{waiting.name}/{PROJECT}'s job never waited in the queue")
                time.sleep(POLL)
            starting.result(TIMEOUT)
            x = running.pop(0)
            t0 = time.monotonic()
            stopping = pool.submit(ask, x, "DELETE")
            stopped = run = ready = None
            while None in (stopped, run, ready):
                now = time.monotonic() - t0
                if run is None and job_state(t, kit, waiting)[0] == "RUNNING":
                    run = now
                if stopped is None and server(x) is None:
                    stopped = now
                model = server(waiting)
                if not model or not (model["ready"] or model.get("pending")) or now > TIMEOUT:
                    raise BenchError(f"{waiting.name}/{PROJECT} did not start after a stop")
                ready = now if ready is None and model["ready"] else ready
                time.sleep(POLL)
            stopping.result(TIMEOUT)
            out.append((stopped, run, ready))
            running.append(waiting)
            waiting = x
            starting = pool.submit(ask, waiting, "POST", 1)
        starting.result(TIMEOUT)
    for u in users:
        stop(u)
    return out


# --- the run --------------------------------------------------------------------------


def project_tags(dk: host.Docker) -> set[str]:
    return {tag for i in dk.call("images", name=f"{PREFIX}/project") for tag in i["RepoTags"]}


def run(args, t, dk: host.Docker, state: dict) -> dict:
    res: dict = {"docker": dk.call("version").get("Version", "?")}
    say("Starting the one-machine hub (gpulab up) and the test cluster...")
    t0 = time.monotonic()
    state["one_home"] = home = WORK / "one"
    launch = t.conftest.HubLaunch(home, t.conftest.hub_env(home))  # gpulab up, in the background
    state["one_env"] = launch.env
    state["kit"] = kit = t.SlurmKit(PREFIX, gpu_minors=((0,), (1,)), mem_mb=4096)
    kit.epilog = batch.render_epilog(kit.cluster, docker_host=kit.node_docker_host_template)
    kit.start()
    res["kit_s"] = time.monotonic() - t0
    one_hub = launch.hub(timeout=1800)
    res["up_s"] = time.monotonic() - t0
    one = t.people.make_user(one_hub, t.people.log_in_admin(one_hub), USERS[0])

    say("Warm-up on one machine: the project's first start (builds its image)...")
    res["one_first"] = spawn(one)
    box = dk.call("inspect_container", f"{PREFIX}-{USERS[0]}--{PROJECT}")
    res["tag"], res["image_id"] = box["Config"]["Image"], box["Image"]
    res["size_mb"] = dk.call("inspect_image", res["image_id"])["Size"] / 1e6
    tags = project_tags(dk)
    stop(one)

    say("Starting the cluster's hub (ProjectSlurmSpawner)...")
    driver = kit.root / "driver"  # the driver's libraries on the nodes: none here
    (driver / "lib64").mkdir(parents=True)
    state["cluster_home"] = ch_home = WORK / "cluster"
    ch_home.mkdir(parents=True)
    cl_hub, state["cluster_proc"] = t.hub.start(
        ch_home, kit, gpu_isolation="devices", driver_dir=str(driver),
        node_nvidia_proc=str(kit.nvidia_proc), mem_mb=768, cpus=1, queue_timeout=600.0,
    )  # fmt: skip
    admin = t.people.log_in_admin(cl_hub)
    users = [t.people.make_user(cl_hub, admin, name) for name in USERS]
    cl = users[0]

    res["fresh"] = {n.name: len(node_image_ids(kit, n.name)) for n in kit.nodes}
    say("Through Slurm: the first start (an empty registry, nodes without the image)...")
    seen = traced_start(cl, 1)
    res["steps"], res["slurm_first"] = steps(seen), seen["ready"]
    res["node"] = next(m.split()[3] for m in seen if m.startswith("Running on node "))
    (box,) = kit.node_engine(res["node"]).call(
        "containers", filters={"label": f"gpulab.slurm.cluster={kit.cluster}"})  # fmt: skip
    if box["ImageID"] != res["image_id"]:
        raise BenchError(f"not the same image: {res['image_id']} here, {box['ImageID']} on "
                         f"{res['node']}")  # fmt: skip
    stop(cl)

    res["other"] = other = next(n.name for n in kit.nodes if n.name != res["node"])
    say(f"Image distribution: pull by digest on {other}, whose engine never had it...")
    pushed = [d for d in dk.call("inspect_image", res["image_id"])["RepoDigests"]
              if d.startswith(f"{kit.registry}/")]  # fmt: skip
    if not pushed or res["image_id"] in node_image_ids(kit, other):
        raise BenchError(f"no digest of {res['tag']} in the registry, or {other} has it")
    res["ref"] = pushed[0].replace(kit.registry, kit.registry_for_nodes, 1)
    res["pull"] = pull_on_node(kit, other, res["ref"])
    if not all(res["image_id"] in node_image_ids(kit, n.name) for n in kit.nodes):
        raise BenchError("a node does not have the image after its pull")

    say(f"Measuring: {args.n} starts per side (both nodes have the image), sides ABBA...")
    res["load"] = [os.getloadavg()[0]]
    res["one"], res["slurm"], res["warm_nodes"] = [], [], []
    for i in range(args.n):
        for side in ("one", "slurm") if i % 2 == 0 else ("slurm", "one"):
            if side == "one":
                res["one"].append(spawn(one))
                stop(one)
            else:
                res["slurm"].append(spawn(cl, gpus=1))
                res["warm_nodes"].append(job_state(t, kit, cl)[1])
                stop(cl)

    say(f"Queue-to-running: both GPUs taken, a third project waits ({args.n} rounds)...")
    res["queue"] = queue_to_running(t, kit, users, args.n)
    res["load"].append(os.getloadavg()[0])
    if project_tags(dk) != tags:
        raise BenchError("the cluster's hub built a project image: not the same image")
    return res


def row(label: str, value: float | list[float], note: str = "") -> None:
    if isinstance(value, list):
        each = " ".join(f"{x:.1f}" for x in value)
        figures = f"{statistics.median(value):>7.1f}{max(value):>7.1f}   {each}"
    else:
        figures = f"{value:>7.1f}"
    say(f"  {label:<50}{figures}{note}")


def short(node: str) -> str:
    return node.removeprefix(f"{PREFIX}-")


def report(args, res: dict) -> None:
    fresh = ", ".join(f"{short(node)} {count}" for node, count in res["fresh"].items())
    say(f"\nsame image on both sides: {res['tag']} = {res['image_id'][:19]}, "
        f"{res['size_mb']:.0f} MB; the nodes pull {res['ref'].split('/', 1)[1]}")  # fmt: skip
    say(f"{os.cpu_count()} CPU cores, Docker {res['docker']}; load average (1 min) before / "
        f"after the measured starts: {res['load'][0]:.1f} / {res['load'][1]:.1f}")  # fmt: skip
    say(f"set-up, not measured: the cluster {res['kit_s']:.0f} s, with gpulab up "
        f"{res['up_s']:.0f} s; the first start on one machine (its build) "
        f"{res['one_first']:.1f} s")  # fmt: skip
    say(f"\n{'seconds':<52}{'p50':>7}{'max':>7}   each")
    say(f"spawn-to-ready (POST until the hub says ready), {args.n} per side, ABBA:")
    row("one machine (gpulab up)", res["one"])
    row("Slurm, 1 GPU, on a node that has the image", res["slurm"],
        f"   (on {' '.join(map(short, res['warm_nodes']))})")  # fmt: skip
    say(f"Slurm, the first start: empty registry, images on the nodes: {fresh}")
    row(f"total, on {short(res['node'])}", res["slurm_first"])
    for label, took in res["steps"]:
        row(f"  {label}", took)
    say("  the spawn page's stream sends new messages every 0.25 s; (*) the hub asks squeue"
        " and reads the job's output once a second: +-1 s")
    say(f"image distribution to a fresh node ({res['size_mb']:.0f} MB):")
    row("push to the empty registry (the first start's)", res["steps"][1][1])
    row(f"docker pull by digest on {short(res['other'])} (never had it)", res["pull"])
    say(f"queue-to-running, both GPUs taken, a third project waiting; {args.n} times, from "
        "the DELETE of a running project:")  # fmt: skip
    for i, label in enumerate(("the stopped project gone from the hub",
                               "the waiting job RUNNING (squeue)",
                               "the waiting project ready")):  # fmt: skip
        row(label, [q[i] for q in res["queue"]])
    say(f"  (each poll: {POLL:g} s, one squeue, the hub's API)")
    ratio = statistics.median(res["slurm"]) / statistics.median(res["one"])
    say(f"cluster_spawn_ratio={ratio:.2f}")


# --- set-up and clean-up --------------------------------------------------------------


def stop_leftover_hubs() -> None:
    """Hubs and proxies an earlier, killed run left in WORK."""
    for hub_dir in WORK.glob("*/hub"):
        for name, program in ((HUB_PIDFILE, "python"),
                              ("jupyterhub-proxy.pid", "configurable-http-proxy")):  # fmt: skip
            me, _ = pidfile.check(hub_dir / name, program)
            if me is not None:
                host.stop_pid(me.pid, timeout=10, expect=me)


def cleanup_docker(dk: host.Docker, keep_base: bool) -> None:
    for c in dk.call("containers", all=True, filters={"name": PREFIX}):
        if any(n.startswith(f"/{PREFIX}") for n in c["Names"]):
            dk.call("remove_container", c["Id"], force=True, v=True)
    if keep_base:  # by tag: a project whose Dockerfile adds nothing has the base's id
        for tag in project_tags(dk):
            dk.call("remove_image", tag)
    else:
        host.remove_image_trees(dk, PREFIX)
    for vol in dk.call("volumes").get("Volumes") or []:
        if vol["Name"].startswith(PREFIX):
            dk.call("remove_volume", vol["Name"], force=True)
    for net in dk.call("networks", names=[PREFIX]):
        if net["Name"].startswith(PREFIX):
            dk.call("remove_network", net["Id"])


def shut_down(t, state: dict, failed: bool) -> list[str]:
    """Log tails when a step failed; then the cluster's hub, `gpulab down`, the cluster."""
    logs = [state[k] / "hub" / "hub.log" for k in ("one_home", "cluster_home") if k in state]
    logs += sorted((WORK / "cluster/hub/projects/cluster-jobs").glob("*.log"))[-3:]
    for log in logs if failed else []:
        text = log.read_text(errors="replace") if log.exists() else ""
        print(f"----- {log} (tail)\n{text[-3000:]}", file=sys.stderr)
    if failed and "kit" in state:
        print(state["kit"].logs(), file=sys.stderr)
    problems = []
    if "cluster_proc" in state:
        t.hub.stop(state["cluster_proc"])
    if "one_env" in state:
        down = subprocess.run([t.conftest.GPULAB, "down"], env=state["one_env"],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        if down.returncode != 0 and not failed:
            problems.append(f"gpulab down failed: {down.stdout}{down.stderr}")
    if "kit" in state:
        state["kit"].stop()
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3, help="measured starts per side (default 3)")
    parser.add_argument("--keep-base", action="store_true",
                        help=f"keep {PREFIX}/base and /debian for the next run")  # fmt: skip
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    t = tests_modules()
    errors = (BenchError, t.KitError, AssertionError, host.HostError, OSError,
              subprocess.SubprocessError, requests.RequestException,
              docker.errors.DockerException)  # fmt: skip
    dk = host.Docker(timeout=600)
    state: dict = {}
    res, failed = None, False
    try:
        host.ensure_dockerd(dk, WORK.with_name(f"{PREFIX}-dockerd"))  # left running
        stop_leftover_hubs()
        shutil.rmtree(WORK, ignore_errors=True)
        cleanup_docker(dk, args.keep_base)
        res = run(args, t, dk, state)
    except errors as e:
        failed = True
        print(f"cluster_spawn.py: error: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        say(f"Stopping the hubs and the test cluster, removing {PREFIX}* Docker objects...")
        try:
            for problem in shut_down(t, state, failed):
                failed = True
                print(f"cluster_spawn.py: cleanup: {problem}", file=sys.stderr)
            cleanup_docker(dk, args.keep_base)
        except errors as e:
            failed = True
            print(f"cluster_spawn.py: cleanup: {type(e).__name__}: {e}", file=sys.stderr)
        shutil.rmtree(WORK, ignore_errors=True)
    if failed or res is None:
        return 1
    report(args, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Projects on a Slurm cluster, as their users see them: a real hub whose spawner is
ProjectSlurmSpawner (tests/cluster_hub.py), on a real Slurm cluster whose two nodes
run Docker engines of their own and pull images from a registry (tests/cluster_kit.py:
node 1 has one GPU, node 2 two, listed nvidia3 then nvidia2; the GPUs are dummy device
files, so the containers see them but cannot compute).

- Two projects start through Slurm and get the GPUs Slurm gave them: "wide" asks for
  2 (node 2: nvidia3 and nvidia2), "one" for 1 (node 1: nvidia0); inside each
  container, its /dev/nvidia* files and CUDA_VISIBLE_DEVICES (the UUIDs) are its own,
  never the other's. "one" runs code through the hub (the hub reaches the node, the
  container reaches the hub).
- A third waits: its spawn page says "waiting for a GPU" (the hub's progress stream,
  and Chromium: test-output/cluster-spawn-waiting.png); a fourth waits "1 job
  ahead" and is stopped while it waits (its job leaves the queue); stopping "one"
  through the hub leaves no container of it on any node, and the third starts on
  the GPU it freed.
- ``scancel`` of a project's job, and SIGKILL to a job's batch step, leave no container
  on any node engine (the trap; the Epilog).

Printed: spawn-to-ready through Slurm (the first start, whose image goes to the
registry and to node 2; the first start on node 1, whose pull runs beside node 2's; a
start on a node that has the image) against the same image on the one-machine session
hub, and queue-to-running latency. The cluster is the session's (conftest's
shared_cluster): after tests/test_cluster_kit.py, the registry and node 2 already
have the image's Debian layer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import cluster_hub
import pytest
from browser_kit import SHOTS
from cluster_kit import SlurmKit, wait_for
from cluster_multinode_kit import TorchSite, job_network, two_node_job
from playwright.sync_api import expect
from security.people import log_in_admin, make_user, password

from gpulab_hub.cluster import batch

pytestmark = pytest.mark.docker

USER = "ana"
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def torch_site(tmp_path_factory):
    """torch for the multi-node job's containers, unpacked while the rest runs (and
    waited for at the end, so no unpacking outlives the module)."""
    site = TorchSite(tmp_path_factory.mktemp("torch") / "site")
    yield site
    site.finish()


@pytest.fixture(scope="module")
def cluster(shared_cluster, torch_site):
    """The session's test cluster (conftest's shared_cluster), with the Epilog for the
    hub's settings."""
    kit = shared_cluster
    kit.epilog_path.write_text(
        batch.render_epilog(kit.cluster, docker_host=kit.node_docker_host_template)
    )
    return kit


@pytest.fixture(scope="module")
def slurm_hub(hub, cluster, tmp_path_factory):
    """The cluster's hub (the session ``hub`` has built the base image and is the
    one-machine comparison)."""
    driver = cluster.root / "driver"  # the driver's libraries on the nodes: none here
    (driver / "lib64").mkdir(parents=True)
    h, proc = cluster_hub.start(
        tmp_path_factory.mktemp("gpulab-slurm-home"), cluster,
        gpu_isolation="devices", driver_dir=str(driver),
        node_nvidia_proc=str(cluster.nvidia_proc), mem_mb=768, cpus=1, queue_timeout=600.0,
        **job_network(cluster),
    )  # fmt: skip
    yield h
    cluster_hub.stop(proc)


@pytest.fixture(scope="module")
def ana(slurm_hub):
    return make_user(slurm_hub, log_in_admin(slurm_hub), USER)


@pytest.fixture(autouse=True)
def logs_on_failure(request, cluster):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        home = request.getfixturevalue("slurm_hub").home
        print("\n----- cluster hub log (last 60 lines)")
        print("\n".join((home / "hub" / "hub.log").read_text().splitlines()[-60:]))
        for log in sorted((home / "hub" / "projects" / "cluster-jobs").glob("*.log")):
            print(f"----- {log.name}\n{log.read_text()[-2000:]}")
        print(cluster.logs())


# --- driving the hub as the spawn page does ---------------------------------------------


def start(user, project: str, gpus: int) -> float:
    """Ask the hub to start the project (as the spawn form does); when it was asked."""
    asked = time.monotonic()
    r = user.api("POST", f"/hub/api/users/{user.name}/servers/{project}", json={"gpus": gpus})
    assert r.status_code in (201, 202), r.text
    return asked


def follow(user, project: str, until=None, timeout: float = 600) -> list[tuple[float, dict]]:
    """The start's progress events, as the spawn page receives them, with their arrival
    times: until ``until(event)``, else to the end of the stream (the project ready)."""
    r = user.api("GET", f"/hub/api/users/{user.name}/servers/{project}/progress",
                 stream=True, timeout=timeout)  # fmt: skip
    events = []
    try:
        for line in r.iter_lines(chunk_size=None):  # each chunk as it comes, not 512 bytes
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            events.append((time.monotonic(), event))
            assert not event.get("failed"), f"{project} did not start: {event.get('message')}"
            if until and until(event):
                return events
    finally:
        r.close()
    assert events and events[-1][1].get("ready"), f"{project}: {events}"
    return events


def messages(events) -> list[str]:
    return [e.get("message", "") for _, e in events]


def job_of(cluster: SlurmKit, project: str):
    name = f"{cluster_hub.PREFIX}-{USER}--{project}"
    (job,) = [j for j in cluster.slurm().queue() if j.name == name]
    return job


def node_boxes(cluster: SlurmKit, project: str | None = None) -> dict[str, list[dict]]:
    """The project containers (of ``project``, else all of this cluster) on each node."""
    labels = [f"gpulab.slurm.cluster={cluster.cluster}"]
    if project:
        labels.append(f"gpulab.project={project}")
    return {
        n.name: cluster.node_engine(n.name).call("containers", all=True, filters={"label": labels})
        for n in cluster.nodes
    }


def inside(cluster: SlurmKit, node: str, box: dict) -> tuple[list[str], str]:
    """(/dev/nvidia<N> files, CUDA_VISIBLE_DEVICES) inside a running container."""
    dk = cluster.node_engine(node)
    script = 'ls /dev; echo "cuda=$CUDA_VISIBLE_DEVICES"'
    ex = dk.call("exec_create", box["Id"], ["sh", "-c", script])
    out = dk.call("exec_start", ex["Id"]).decode().split()
    gpus = sorted(d for d in out if re.fullmatch(r"nvidia[0-9]+", d))
    cuda = next(w for w in out if w.startswith("cuda=")).removeprefix("cuda=")
    return gpus, cuda


def only_box(cluster: SlurmKit, project: str) -> tuple[str, dict]:
    found = [(node, b) for node, boxes in node_boxes(cluster, project).items() for b in boxes]
    assert len(found) == 1, found
    return found[0]


# --- the tests --------------------------------------------------------------------------


def test_two_projects_get_the_gpus_slurm_gave_them_never_the_same(
    hub, cluster, slurm_hub, ana
):
    n1, n2 = (n.name for n in cluster.nodes)
    uuids = {n.name: n.uuids for n in cluster.nodes}
    FIGURES["n2_debian"] = any("/debian@" in d for i in cluster.node_engine(n2).call("images")
                               for d in i.get("RepoDigests") or [])  # fmt: skip

    t0 = start(ana, "wide", 2)
    running = follow(ana, "wide", until=lambda e: e.get("message", "").startswith("Running on"))
    # "one" starts while wide's image comes to node 2 (its job can only run on node 1,
    # wide has both of node 2's GPUs): the two nodes fetch the image at the same time.
    t1 = start(ana, "one", 1)
    wide = running + follow(ana, "wide")[len(running) :]  # the stream starts again
    FIGURES["slurm_first"] = wide[-1][0] - t0
    said = messages(wide)
    print("\nwide's spawn page:", *said, sep="\n  ")
    assert "Sending the image to the cluster's registry" in said
    assert any(m.startswith(f"Running on node {n2}") for m in said)
    pushed = next(m for m in said if m.startswith("The image is in the cluster's registry"))
    FIGURES["push"] = float(re.search(r"\((\d+) s\)", pushed).group(1))  # the hub's count
    at = {e.get("message", ""): t for t, e in wide}  # live events: the node's steps
    FIGURES["pull_fresh_node"] = (
        at[f"Starting the project's container on node {n2}"]
        - at[f"Fetching the project's image on node {n2}"]
    )

    FIGURES["slurm_fresh_node"] = follow(ana, "one")[-1][0] - t1

    node, box = only_box(cluster, "wide")
    assert node == n2
    assert inside(cluster, node, box) == (
        ["nvidia2", "nvidia3"], f"{uuids[n2][3]},{uuids[n2][2]}"  # Slurm's order: 0, 1
    )
    node, box = only_box(cluster, "one")
    assert node == n1
    assert inside(cluster, node, box) == (["nvidia0"], uuids[n1][0])
    # The hub reaches the container on its node, and the container the hub (its kernel
    # was authorized by the hub's API): the project's own code sees its own GPU.
    code = ("import os; print(sorted(d for d in os.listdir('/dev') if d[6:].isdigit() and "
            "d.startswith('nvidia')), os.environ['CUDA_VISIBLE_DEVICES'])")  # fmt: skip
    assert ana.execute("one", code).split() == ["['nvidia0']", uuids[n1][0]]

    # The same image on one machine (the session hub), for comparison.
    other = make_user(hub, log_in_admin(hub), "slurmcmp")
    t0 = time.monotonic()
    other.start_project("one")
    FIGURES["one_machine"] = time.monotonic() - t0
    other.stop_project("one")


def test_a_third_project_waits_with_the_reason_then_starts_when_one_stops(
    cluster, slurm_hub, ana, browser
):
    n1 = cluster.nodes[0].name
    start(ana, "third", 1)
    waiting = follow(ana, "third", until=lambda e: "waiting for a GPU" in e.get("message", ""))
    print("\nthird's spawn page:", *messages(waiting), sep="\n  ")
    job = job_of(cluster, "third")
    assert (job.state, job.reason) == ("PENDING", "Resources")
    assert waiting[-1][1]["message"] == (
        f"In the cluster's queue (Slurm job {job.id}): waiting for a GPU: next in line"
    )

    # What the user sees: the queue's words, kept in view on the spawn page.
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(f"{slurm_hub.url}/hub/login")
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(password(USER))
    page.get_by_role("button", name="Sign In").click()
    page.wait_for_url(re.compile(r"/hub/(home|spawn)"))
    page.goto(f"{slurm_hub.url}/hub/spawn-pending/{USER}/third")
    note = page.locator("#gpulab-start-note")
    expect(note).to_contain_text("waiting for a GPU: next in line", timeout=20_000)
    expect(page.locator("#progress-message")).to_contain_text("waiting for a GPU")
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / "cluster-spawn-waiting.png", full_page=True)
    context.close()

    # A fourth waits behind it, and its user gives up ("Stop starting" on the spawn
    # page): its job leaves the queue, and the third is still next in line.
    start(ana, "fourth", 1)
    behind = follow(ana, "fourth", until=lambda e: "waiting for a GPU" in e.get("message", ""))
    fourth = job_of(cluster, "fourth")
    assert behind[-1][1]["message"].endswith("waiting for a GPU: 1 job ahead")
    ana.stop_project("fourth")
    gone = {j.id: j.state for j in cluster.slurm().queue()}
    assert fourth.id not in gone and gone[job.id] == "PENDING"

    # "one" stops through the hub: its job ends and no container of it is left anywhere.
    one_job = job_of(cluster, "one").id
    stop_asked = time.monotonic()
    ana.stop_project("one")
    FIGURES["stop"] = time.monotonic() - stop_asked
    assert all(boxes == [] for boxes in node_boxes(cluster, "one").values())
    assert one_job not in {j.id for j in cluster.slurm().queue()}
    wait_for("the waiting job to run", lambda: job_of(cluster, "third").state == "RUNNING",
             every=0.1)  # fmt: skip
    running = time.monotonic()
    FIGURES["queue_to_running"] = running - stop_asked
    FIGURES["slurm_warm_node"] = follow(ana, "third")[-1][0] - running
    node, box = only_box(cluster, "third")
    assert node == n1
    assert inside(cluster, node, box) == (["nvidia0"], cluster.nodes[0].uuids[0])


def batch_step(cluster: SlurmKit, job_id: int) -> int:
    """The PID of a running job's batch script (slurmstepd runs it on the node)."""
    script = f"/job{job_id:05d}/slurm_script".encode()
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes() if p.name.isdigit() else b""
        except OSError:
            continue
        if script in cmd and str(cluster.root).encode() in cmd:
            return int(p.name)
    raise AssertionError(f"job {job_id}'s batch script is not running")


def test_scancel_and_a_killed_step_leave_no_container_on_any_node(cluster, slurm_hub, ana):
    # scancel (an admin, or the job's time limit): the script's trap removes the container.
    job = job_of(cluster, "third")
    cluster.slurm().cancel(job.id)
    wait_for("third's container to go", lambda: not any(node_boxes(cluster, "third").values()))
    # SIGKILL to the batch step (its process group: the script and the Docker CLI), as
    # the OOM killer would: no trap runs; the cluster's Epilog removes the container.
    job = job_of(cluster, "wide")
    assert any(node_boxes(cluster, "wide").values())
    os.killpg(os.getpgid(batch_step(cluster, job.id)), signal.SIGKILL)
    wait_for("wide's container to go", lambda: not any(node_boxes(cluster, "wide").values()))
    # The hub takes both projects as stopped (poll: their jobs ended): stopping them is
    # at once, and they are gone from the user's list.
    for project in ("third", "wide"):
        started = time.monotonic()
        ana.stop_project(project, timeout=30)
        assert time.monotonic() - started < 10
    assert node_boxes(cluster) == {n.name: [] for n in cluster.nodes}
    print_figures()


def test_a_two_node_torchrun_job_through_gpu_job(
    cluster, slurm_hub, ana, docker_engine, torch_site
):
    """``%gpu_job run --follow --nodes 2 --gpus-per-node 0 train.py`` in a kernel of a
    project with torch in its folder: each node's output (WORLD_SIZE 2, ranks 0 and 1 at
    the hub's addresses, the all_reduce across both), "succeeded" in ``gpulab-job list``,
    more nodes than allowed refused in words, a stopped job leaving no container
    (cluster_multinode_kit.two_node_job; docs/cluster.md, "Multi-node jobs")."""
    took = two_node_job(cluster, slurm_hub, ana, docker_engine, torch_site)
    print("\nthe multi-node job's steps:", *(f"{k}: {v:.1f} s" for k, v in took.items()),
          sep="\n  ")  # fmt: skip


def print_figures() -> None:
    f = FIGURES
    # The session's cluster: tests/test_cluster_kit.py, where it ran first, pushed the
    # image's Debian layer to the registry and pulled it on node 2.
    node2 = "node 2, which had the Debian layer" if f["n2_debian"] else "a fresh node"
    print(
        "\nspawn-to-ready of the same image (769 MB):"
        f"\n  one machine (the session hub):                       {f['one_machine']:5.1f} s"
        f"\n  Slurm, first start (push, then pull on {node2}): {f['slurm_first']:5.1f} s"
        f"\n    of which the push to the registry:                  {f['push']:5.0f} s"
        f"\n    and the pull on node 2:                             {f['pull_fresh_node']:5.1f} s"
        f"\n  Slurm, first start on node 1 (its pull, beside node 2's): "
        f"{f['slurm_fresh_node']:5.1f} s"
        f"\n  Slurm, on a node that has the image (RUNNING->ready): {f['slurm_warm_node']:5.1f} s"
        f"\nqueue-to-running: the user stops a project -> the waiting job RUNNING: "
        f"{f['queue_to_running']:.1f} s (the stop itself: {f['stop']:.1f} s)"
    )


def test_gpulab_down_cancels_the_hubs_project_jobs_and_no_others(cluster, slurm_hub, ana):
    """Last (it stops this module's hub): ``gpulab status`` lists a running project's job
    with its node, and ``gpulab down`` cancels it, saying so, leaving no container on any
    node engine; a job of another gpulab on the cluster (prefix ``<hub's>-lab2``), with
    the same user and project names, runs on."""
    t0 = start(ana, "last", 1)
    follow(ana, "last", until=lambda e: e.get("message", "").startswith("Running on node"))
    status = cluster_hub.gpulab(slurm_hub, "status")  # while the container starts
    other = cluster.slurm().submit(
        "#!/bin/sh\nsleep 300\n",
        ["--parsable", "--mem=64M", "--output=/dev/null",
         f"--job-name={cluster_hub.PREFIX}-lab2-{USER}--last"],
    )  # fmt: skip
    follow(ana, "last")
    took = {"the project's start": time.monotonic() - t0}
    job = job_of(cluster, "last")
    node, _ = only_box(cluster, "last")
    out, err = status.communicate(timeout=120)
    print("\ngpulab status:\n" + out + err)
    assert status.returncode == 0
    assert f"  {USER}/last: RUNNING, running on node {node} (Slurm job {job.id})" in (
        out.splitlines()
    )
    assert "cluster: 1 job(s) of this hub" in out

    t0 = time.monotonic()
    down = cluster_hub.gpulab(slurm_hub, "down")
    out, err = down.communicate(timeout=180)
    took["gpulab down"] = time.monotonic() - t0
    print("gpulab down:\n" + out + err)
    assert down.returncode == 0 and err == ""
    assert out.splitlines()[:2] == [
        "Stopped the hub.",
        f"Stopped project {USER}/last on the cluster (Slurm job {job.id})",
    ]
    left = {j.id for j in cluster.slurm().queue()}
    assert job.id not in left and other in left
    assert node_boxes(cluster) == {n.name: [] for n in cluster.nodes}
    cluster.slurm().cancel(other)
    print(*(f"{k}: {v:.1f} s" for k, v in took.items()), sep="\n")

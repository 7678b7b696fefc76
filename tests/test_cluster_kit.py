"""A real Slurm cluster (tests/cluster_kit.py: munged, slurmctld, two slurmd nodes in
namespaces of their own, dummy GPUs as GRES, a Docker engine on each node, a
registry) running what gpulab hands it.

- GPU jobs get Slurm's allocation; gpulab's batch script turns Slurm's GRES index
  into the device at that position on the node (not the device with that minor).
- With every GPU taken, a job waits and gpulab's client says why in a user's words.
- A project container started by gpulab's batch script on its node's own engine is
  gone after ``scancel`` (the script's trap: the Epilog is a no-op then), and after
  the job's batch step is killed outright (SIGKILL to its process group: only the
  Epilog can remove it; without it the container survives, which is checked first).
- Images reach the nodes through the registry: pushed by this machine's engine (the
  hub's), pulled by digest on a node with the password, run there and only there; a
  tag pushed again does not change what a digest gives; the nodes' registry refuses
  anonymous pulls and every push. A container on a node answers HTTP on a port
  published on the node's address, and reaches this host's address.
- When the cluster stops (the session's end: it is conftest's shared_cluster, which the
  cluster hub's and the doctor's modules use too), no daemon, engine, registry or
  container of it is left, and this machine's engine still runs with nothing of the
  kit tagged in it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from cluster_engines import main_tags
from cluster_images import http_answer, tiny_image_tar
from cluster_kit import wait_for
from cluster_procs import batch_script_pid, daemons_left
from conftest import PREFIX

from gpulab_hub import host, pidfile
from gpulab_hub.cluster import batch
from gpulab_hub.projects import objects

pytestmark = pytest.mark.docker
# the project's own data folders (data follows the share), as the hub makes them
DATA = ("models", "outputs", "huggingface")

NOOP_EPILOG = "#!/bin/sh\nexit 0\n"

# A stand-in for the Docker CLI that records what gpulab's script ran, with the
# allocation Slurm gave the job, then stays up like a container would.
FAKE_DOCKER = """#!/bin/bash
if [ "$1" = run ]; then
  env_file=$(cat)
  python3 - "$env_file" "$@" > "@OUT@/$SLURM_JOB_ID.json" <<'EOF'
import json, os, sys
print(json.dumps({"argv": sys.argv[2:], "env_file": sys.argv[1], "slurm": {
    k: os.environ.get(k, "") for k in
    ("SLURMD_NODENAME", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")}}))
EOF
  exec sleep 60
fi
exit 0
"""


# Processes of containers the tests start on node engines: none may outlive the kit.
CONTAINER_PIDS: list[pidfile.Identity] = []


@pytest.fixture(scope="module")
def cluster(docker_engine, shared_cluster):
    """The session's test cluster (conftest's shared_cluster), with this module's Epilog;
    after its stop (the session's end) nothing of the kit may be left (nothing_left)."""
    kit = shared_cluster
    kit.epilog_path.write_text(batch.render_epilog(kit.cluster, kit.node_docker_cli))
    engines_before = main_dockerds()
    print(
        f"\ncluster up in {kit.start_seconds:.2f} s "
        f"(its two node engines and the registry: {kit.engine_seconds:.2f} s)"
    )
    yield kit
    # This module's own images (others' may come and go before the session's end).
    ours = (f"{PREFIX}/slurm-sleep:", f"{PREFIX}/kit-")
    kept = {t for t in main_tags(docker_engine) if t.startswith(ours)}
    kit.after_stop.append(lambda: nothing_left(kit, docker_engine, engines_before, kept))


def nothing_left(kit, docker_engine, engines_before, kept: set[str]) -> None:
    """After the kit's stop: no daemon, container, mount, interface or folder of it, and
    this machine's engine untouched but for the kit's registry tags."""
    left = daemons_left(kit)
    assert left == [], f"daemons outlived the test cluster: {left}"
    alive = [p.describe() for p in CONTAINER_PIDS if pidfile.identity(p.pid) == p]
    assert alive == [], f"node containers outlived the test cluster: {alive}"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(kit.root) not in mounts
    assert subprocess.run(["ip", "link", "show", kit.host_if], capture_output=True).returncode
    assert not kit.root.exists()
    # This machine's engine: the same dockerd still answers, no tag of the kit's
    # registry is left in it, and no job container ever ran there.
    assert engines_before and main_dockerds() == engines_before and docker_engine.reachable()
    tags = main_tags(docker_engine)
    assert [t for t in tags if t.startswith(f"{kit.registry}/")] == []
    assert kept <= tags  # the images it pushed are still there
    boxes = docker_engine.call(
        "containers", all=True, filters={"label": f"gpulab.slurm.cluster={kit.cluster}"}
    )
    assert boxes == []


def main_dockerds() -> set[pidfile.Identity]:
    """This machine's dockerd processes: those in this network namespace (node
    engines, this kit's and other test runs', live in their nodes' namespaces)."""
    here = os.stat("/proc/self/ns/net").st_ino
    found = set()
    for p in Path("/proc").iterdir():
        ident = pidfile.identity(int(p.name)) if p.name.isdigit() else None
        if ident and ident.cmdline and Path(ident.cmdline[0]).name == "dockerd":
            try:
                if os.stat(p / "ns" / "net").st_ino == here:
                    found.add(ident)
            except OSError:
                continue
    return found


def node_docker(kit, node: str, *args: str, config: str | None = None, check: bool = True):
    """The Docker CLI against a node's engine, with the registry's password."""
    argv = ["docker", "-H", kit.node_docker_host(node),
            "--config", config or kit.node_docker_config, *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} on {node} failed: {done.stderr}")
    return done


def test_the_cluster_comes_up_with_both_nodes_idle(cluster, docker_engine):
    nodes = cluster.slurm().nodes()
    print("sinfo:", [(n.name, n.state, n.gres) for n in nodes])
    assert [(n.name, n.state, n.flag, n.gres) for n in nodes] == [
        (f"{PREFIX}-n1", "idle", "", "gpu:h200:1"),
        (f"{PREFIX}-n2", "idle", "", "gpu:h200:2"),
    ]
    # Each node has an engine of its own, in the node's namespaces (its host name is
    # the node's), remapping users as this machine's engine does, trusting the registry.
    roots = {docker_engine.call("info")["DockerRootDir"]}
    for n in cluster.nodes:
        info = cluster.node_engine(n.name).call("info")
        print(n.name, "engine:", cluster.node_docker_host(n.name), info["DockerRootDir"])
        assert info["Name"] == n.name
        assert info["DockerRootDir"].startswith(f"{cluster.root}/{n.name}/")
        assert "name=userns" in info["SecurityOptions"]
        assert info["RegistryConfig"]["IndexConfigs"][cluster.registry_for_nodes]["Secure"] is False
        roots.add(info["DockerRootDir"])
        # Its daemons see the node's /dev: its own GPUs at /dev/nvidia<minor>, as on a
        # GPU node (an engine that remaps users takes a device from that path).
        ls = ["nsenter", f"--mount={cluster.ns(n.name, 'mnt')}", "ls", "/dev"]
        dev = subprocess.run(ls, capture_output=True, text=True, check=True).stdout.split()
        assert [d for d in dev if re.fullmatch(r"nvidia[0-9]+", d)] == sorted(
            f"nvidia{m}" for m in n.minors
        )
        assert {"null", "urandom", "nvidiactl", "nvidia-uvm"} <= set(dev)
    assert len(roots) == 3


def running(client, job_ids) -> bool:
    states = {j.id: j.state for j in client.queue()}
    return all(states.get(j) == "RUNNING" for j in job_ids)


def test_gpu_jobs_get_their_devices_and_a_full_cluster_says_why_it_waits(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("gpujobs")
    fake = work / "docker"
    fake.write_text(FAKE_DOCKER.replace("@OUT@", str(work)))
    fake.chmod(0o755)
    client = cluster.slurm()
    n1, n2 = (n.name for n in cluster.nodes)
    settings = objects.ContainerInputs(
        name=f"{PREFIX}-gpu-project", image=f"{PREFIX}/none:latest", command=["true"],
        env={}, project_dir=str(work), data_root=str(work), hf_cache_volume=f"{PREFIX}-hf",
        network=f"{PREFIX}-net", port=8888, owner="alice",
    )  # fmt: skip
    gpus = batch.SlurmGpus(
        count=1, type="h200", nodes=cluster.gres(), isolation=objects.DEVICES,
        nvidia_proc=str(cluster.nvidia_proc),
    )  # fmt: skip
    script = batch.render_script(batch.BatchJob(cluster.cluster, settings, gpus, str(fake)))
    request = batch.JobRequest(name=f"{PREFIX}-gpu", mem_mb=128, gpus=1, gpu_type="h200")
    options = batch.sbatch_args(request)
    ids = [client.submit(script, [*options, f"--nodelist={node}"]) for node in (n1, n2, n2)]
    wait_for("three GPU jobs running", lambda: running(client, ids))
    def recorded(job: int) -> str:
        # The shell makes the file at once; python writes its one line at exit.
        f = work / f"{job}.json"
        return f.read_text() if f.exists() else ""

    seen = wait_for(
        "each job's docker run",
        lambda: (
            all(recorded(j).endswith("\n") for j in ids)
            and [json.loads(recorded(j)) for j in ids]
        ),
    )
    by_index = {}
    for job in seen:
        slurm = job["slurm"]
        argv = job["argv"]
        devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
        devices = [d for d in devices if d.split(":")[1] not in objects.CONTROL_DEVICES]
        env = dict(e.split("=", 1) for e in job["argv"] if e.startswith("CUDA_VISIBLE_DEVICES="))
        print("job on", slurm, "->", devices, env)
        assert slurm["SLURM_JOB_GPUS"] == slurm["CUDA_VISIBLE_DEVICES"]
        by_index[(slurm["SLURMD_NODENAME"], slurm["SLURM_JOB_GPUS"])] = (devices, env)
    dev = cluster.root / "dev"
    uuids = {n.name: n.uuids for n in cluster.nodes}
    # Slurm's index is the position in the node's GRES list: index 0 on n2 is nvidia3.
    assert by_index == {
        (n1, "0"): (
            [f"{dev}/{n1}/nvidia0:/dev/nvidia0:rwm"],
            {"CUDA_VISIBLE_DEVICES": uuids[n1][0]},
        ),
        (n2, "0"): (
            [f"{dev}/{n2}/nvidia3:/dev/nvidia3:rwm"],
            {"CUDA_VISIBLE_DEVICES": uuids[n2][3]},
        ),
        (n2, "1"): (
            [f"{dev}/{n2}/nvidia2:/dev/nvidia2:rwm"],
            {"CUDA_VISIBLE_DEVICES": uuids[n2][2]},
        ),
    }

    # Every GPU is taken: two more GPU jobs wait, and gpulab says why in words.
    waiting = [client.submit("#!/bin/sh\nsleep 60\n", options) for _ in range(2)]

    def words():
        first, second = (client.status(j) for j in waiting)
        ready = first.reason == "Resources" and second.reason == "Priority"
        return ready and (first, second)

    first, second = wait_for("Slurm's reasons for the waiting jobs", words)
    print("squeue:", [(j.id, j.state, j.reason) for j in client.queue()])
    print("words:", first.words, "|", second.words)
    assert (first.state, first.words) == ("PENDING", "waiting for a GPU: next in line")
    assert (second.state, second.words) == ("PENDING", "waiting for a GPU: 1 job ahead")

    for j in ids + waiting:
        client.cancel(j)
    wait_for("the queue to empty", lambda: not client.queue(), timeout=30)


# --- a real project container on its node's own Docker engine ------------------------


@pytest.fixture(scope="module")
def sleeper(cluster, docker_engine, tmp_path_factory):
    """A tiny image (sleep, perl and their libraries) built on this machine's engine,
    pushed, pulled by digest on both nodes; the project network on both; data folders."""
    work = tmp_path_factory.mktemp("project")
    name = f"{PREFIX}/slurm-sleep:latest"
    tar = tiny_image_tar(work / "rootfs.tar")
    docker_engine.call("import_image", src=str(tar), repository=name.split(":")[0], tag="latest")
    ref, _ = cluster.push(name)
    for n in cluster.nodes:
        node_docker(cluster, n.name, "pull", ref)
        host.ensure_network(cluster.node_engine(n.name), f"{PREFIX}-net")
    (work / "project").mkdir()
    for sub in ("datasets", *(f"projects/alice/project/{d}" for d in DATA)):
        (work / "data" / sub).mkdir(parents=True)
    yield ref, work
    # The module's end: its containers and project networks leave the nodes (the cluster
    # hub's first start makes its network again), but for one container per node that
    # runs on until the kit stops (CONTAINER_PIDS: nothing_left checks it is gone).
    for n in cluster.nodes:
        dk = cluster.node_engine(n.name)
        for c in dk.call("containers", all=True):
            dk.call("remove_container", c["Id"], force=True, v=True)
        for net in dk.call("networks", names=[f"{PREFIX}-net"]):
            dk.call("remove_network", net["Id"])
        box = dk.call("create_container", ref, ["sleep", "3600"], name=f"{PREFIX}-until-stop",
                      host_config=dk.call("create_host_config", network_mode="none"))  # fmt: skip
        dk.call("start", box["Id"])
        pid = dk.call("inspect_container", box["Id"])["State"]["Pid"]
        CONTAINER_PIDS.append(pidfile.identity(pid))


def project_job(cluster, sleeper, name: str, node: str) -> tuple[str, list[str]]:
    image, work = sleeper
    settings = objects.ContainerInputs(
        name=f"{PREFIX}-{name}", image=image, command=["sleep", "300"],
        env={"JUPYTERHUB_API_TOKEN": "s3cret-token"},
        project_dir=str(work / "project"), data_root=str(work / "data"),
        hf_cache_volume=f"{PREFIX}-hf-alice", network=f"{PREFIX}-net", port=8888,
        owner="alice", labels={"gpulab.instance": PREFIX, "gpulab.owner": "alice"},
        pids_limit=256, mem_limit=64 * 2**20, cpu_limit=0.5,
    )  # fmt: skip
    job = batch.BatchJob(cluster.cluster, settings, docker=cluster.node_docker_cli)
    script = batch.render_script(job)
    out = cluster.root / "out" / f"{name}-%j.out"
    options = batch.sbatch_args(
        batch.JobRequest(name=f"{PREFIX}-{name}", mem_mb=128, output=str(out))
    )
    return script, [*options, f"--nodelist={node}"]


def job_containers(dk, cluster, job_id: int) -> list[dict]:
    labels = [f"gpulab.slurm.cluster={cluster.cluster}", f"gpulab.slurm.job={job_id}"]
    return dk.call("containers", all=True, filters={"label": labels})


def start_project(cluster, sleeper, name: str, node: str) -> tuple[int, dict, object]:
    """Submit a project's job pinned to ``node``; (job id, its container, node engine)."""
    script, options = project_job(cluster, sleeper, name, node)
    client = cluster.slurm()
    job_id = client.submit(script, options)
    dk = cluster.node_engine(node)

    def up():
        boxes = [c for c in job_containers(dk, cluster, job_id) if c["State"] == "running"]
        if not boxes and job_ended(client, job_id):
            log = cluster.root / "out" / f"{name}-{job_id}.out"
            text = log.read_text() if log.exists() else "(no output)"
            raise AssertionError(f"job {job_id} ended before its container ran:\n{text}")
        return boxes

    wait_for(f"job {job_id}'s container to run", up, timeout=30)
    (c,) = job_containers(dk, cluster, job_id)
    box = dk.call("inspect_container", c["Id"])
    CONTAINER_PIDS.append(pidfile.identity(box["State"]["Pid"]))
    return job_id, box, dk


def kill_batch_step(cluster, job_id: int) -> None:
    """SIGKILL to the job's batch script and everything in its process group (the
    Docker CLI with it), as the OOM killer or an admin's kill -9 would: no trap runs.
    (``scancel --signal=KILL`` does not do this: Slurm treats it as a cancel, TERM
    first.)"""
    pid = batch_script_pid(cluster, job_id)
    assert pid is not None, f"job {job_id}'s batch script is not running"
    os.killpg(os.getpgid(pid), signal.SIGKILL)


def job_ended(client, job_id: int) -> bool:
    status = client.status(job_id)
    return status is None or status.ended


def test_scancel_stops_and_removes_the_container_through_the_trap(cluster, docker_engine, sleeper):
    cluster.epilog_path.write_text(NOOP_EPILOG)  # the trap alone
    client = cluster.slurm()
    n2 = cluster.nodes[1].name
    job_id, box, dk = start_project(cluster, sleeper, "trap", n2)
    # The one-machine protections, applied by the node's engine.
    hc = box["HostConfig"]
    assert (hc["CapDrop"], hc["SecurityOpt"], hc["PidsLimit"]) == (
        ["ALL"], ["no-new-privileges"], 256,
    )  # fmt: skip
    assert (hc["Memory"], hc["CpuQuota"], hc["NetworkMode"]) == (
        64 * 2**20,
        50_000,
        f"{PREFIX}-net",
    )
    assert box["Config"]["User"] == "1000:100"
    assert "JUPYTERHUB_API_TOKEN=s3cret-token" in box["Config"]["Env"]
    assert box["Image"] == dk.call("inspect_image", sleeper[0])["Id"]  # the pushed digest
    # On the node's engine only: neither this machine's engine nor node 1's has it.
    assert job_containers(docker_engine, cluster, job_id) == []
    assert job_containers(cluster.node_engine(cluster.nodes[0].name), cluster, job_id) == []
    print("running:", client.status(job_id).words, box["Name"])

    started = time.monotonic()
    client.cancel(job_id)
    wait_for("the container to go", lambda: not job_containers(dk, cluster, job_id))
    print(f"container gone {time.monotonic() - started:.2f} s after scancel")
    wait_for("the job to end", lambda: job_ended(client, job_id))


def test_a_job_killed_outright_leaves_its_container_to_the_epilog(cluster, sleeper):
    client = cluster.slurm()
    n1 = cluster.nodes[0].name
    # Without gpulab's Epilog, SIGKILL leaves the container running: the pitfall.
    cluster.epilog_path.write_text(NOOP_EPILOG)
    job_id, _, dk = start_project(cluster, sleeper, "orphan", n1)
    kill_batch_step(cluster, job_id)
    wait_for("the killed job to end", lambda: job_ended(client, job_id))
    time.sleep(1)
    orphans = job_containers(dk, cluster, job_id)
    assert [c["State"] for c in orphans] == ["running"]
    for c in orphans:
        dk.call("remove_container", c["Id"], force=True)

    # With it (running the node's engine's CLI), the same kill leaves nothing.
    cluster.epilog_path.write_text(batch.render_epilog(cluster.cluster, cluster.node_docker_cli))
    job_id, _, dk = start_project(cluster, sleeper, "killed", n1)
    started = time.monotonic()
    kill_batch_step(cluster, job_id)
    wait_for("the Epilog to remove the container",
             lambda: not job_containers(dk, cluster, job_id))  # fmt: skip
    print(f"container gone {time.monotonic() - started:.2f} s after the SIGKILL")
    wait_for("the job to end", lambda: job_ended(client, job_id))


# --- images through the registry, ports published on a node ---------------------------


def image_ids(dk) -> set[str]:
    return {i["Id"] for i in dk.call("images", all=True)}


def test_an_image_pushed_by_this_machines_engine_runs_on_a_node_by_digest(
    cluster, docker_engine, local_debian
):
    n1, n2 = (n.name for n in cluster.nodes)
    size = docker_engine.call("inspect_image", local_debian)["Size"]
    ref, pushed = cluster.push(local_debian)
    assert re.fullmatch(
        rf"{re.escape(cluster.registry_for_nodes)}/{PREFIX}/debian@sha256:[0-9a-f]{{64}}", ref
    )
    started = time.monotonic()
    node_docker(cluster, n2, "pull", ref)
    pulled = time.monotonic() - started
    ran = node_docker(cluster, n2, "run", "--rm", ref, "cat", "/etc/debian_version")
    print(
        f"image distribution ({local_debian}, {size / 1e6:.0f} MB): pushed in {pushed:.1f} s, "
        f"pulled on a fresh node in {pulled:.1f} s; it runs there: Debian {ran.stdout.strip()}"
    )
    assert re.fullmatch(r"12\.\d+", ran.stdout.strip())
    on_n2 = cluster.node_engine(n2).call("inspect_image", ref)["Id"]
    assert on_n2 in image_ids(cluster.node_engine(n2))
    assert on_n2 not in image_ids(cluster.node_engine(n1))  # each node has its own engine


def test_a_digest_keeps_what_was_pushed_when_the_tag_is_pushed_again(
    cluster, docker_engine, sleeper
):
    n1 = cluster.nodes[0].name
    tar = sleeper[1] / "rootfs.tar"
    repo = f"{PREFIX}/kit-retag"
    refs = {}
    for build in ("first", "second"):
        docker_engine.call("import_image", src=str(tar), repository=repo, tag="v1",
                           changes=[f"LABEL gpulab.kit.build={build}"])  # fmt: skip
        refs[build], _ = cluster.push(f"{repo}:v1")
    assert refs["first"] != refs["second"]

    def build_of(ref: str) -> str:
        node_docker(cluster, n1, "pull", ref)
        labels = cluster.node_engine(n1).call("inspect_image", ref)["Config"]["Labels"]
        return labels["gpulab.kit.build"]

    tag = f"{cluster.registry_for_nodes}/{repo}:v1"
    assert (build_of(refs["first"]), build_of(tag)) == ("first", "second")


def test_the_nodes_registry_wants_the_password_and_takes_no_push(
    cluster, docker_engine, sleeper, tmp_path
):
    n2 = cluster.nodes[1].name
    repo = f"{PREFIX}/kit-private"
    docker_engine.call("import_image", src=str(sleeper[1] / "rootfs.tar"), repository=repo,
                       tag="v1", changes=["LABEL gpulab.kit.build=private"])  # fmt: skip
    ref, _ = cluster.push(f"{repo}:v1")
    digest = ref.split("@")[1]
    # A pull with no password: refused; with the kit's config.json: done.
    anonymous = node_docker(cluster, n2, "pull", ref, config=str(tmp_path), check=False)
    print("anonymous pull:", anonymous.stderr.strip())
    assert anonymous.returncode != 0 and "no basic auth credentials" in anonymous.stderr
    url = f"http://{cluster.registry_for_nodes}/v2/{repo}/manifests/{digest}"
    assert requests.get(url, timeout=10).status_code == 401
    node_docker(cluster, n2, "pull", ref)
    # A push with the password: refused, and nothing new in the registry.
    intruder = f"{cluster.registry_for_nodes}/{PREFIX}/intruder:x"
    node_docker(cluster, n2, "tag", ref, intruder)
    push = node_docker(cluster, n2, "push", intruder, check=False)
    print("push to the nodes' registry:", push.stderr.strip())
    assert push.returncode != 0
    listed = requests.get(f"http://{cluster.registry}/v2/{PREFIX}/intruder/tags/list", timeout=10)
    assert listed.status_code == 404


def test_a_container_published_on_a_node_answers_from_this_host(cluster, sleeper):
    n1 = cluster.nodes[0].name
    address = cluster.node_address(n1)
    dk = cluster.node_engine(n1)
    box = dk.call(
        "create_container", sleeper[0], http_answer(8080, f"hello from {n1}"),
        name=f"{PREFIX}-web", ports=[8080],
        host_config=dk.call("create_host_config", port_bindings={8080: (address,)},
                            network_mode=f"{PREFIX}-net"),
    )  # fmt: skip
    dk.call("start", box["Id"])
    seen = dk.call("inspect_container", box["Id"])
    CONTAINER_PIDS.append(pidfile.identity(seen["State"]["Pid"]))
    (published,) = seen["NetworkSettings"]["Ports"]["8080/tcp"]
    url = f"http://{published['HostIp']}:{published['HostPort']}/"
    assert published["HostIp"] == address

    def answer():
        try:
            return requests.get(url, timeout=2)
        except requests.exceptions.ConnectionError:
            return None

    reply = wait_for(f"{url} to answer", answer, timeout=10)
    print(f"{url} -> {reply.status_code} {reply.text.strip()!r}")
    assert (reply.status_code, reply.text) == (200, f"hello from {n1}\n")
    # And the container reaches this host's address on the fabric (the registry there).
    reach = node_docker(cluster, n1, "exec", box["Id"], "perl", "-MIO::Socket::INET", "-e",
                        REACH.format(address=cluster.registry_for_nodes))  # fmt: skip
    print("from the container:", reach.stdout.strip())
    assert re.match(r"HTTP/1\.[01] 401 Unauthorized", reach.stdout)


# Perl in the container: one HTTP request to the nodes' registry, its status line.
REACH = (
    'my $c = IO::Socket::INET->new(PeerAddr => "{address}", Timeout => 5) or die "connect: $!";'
    ' print $c "GET /v2/ HTTP/1.0\\r\\n\\r\\n"; print scalar <$c>;'
)

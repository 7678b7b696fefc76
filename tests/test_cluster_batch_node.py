"""The batch script on a node with a Docker engine of its own (no Slurm, no Docker):
its DOCKER_HOST, the project network it makes there, the image it pulls by digest
from the cluster's registry, the port it publishes on the node's cluster address and
the ``gpulab-ready`` line it prints, and the ``gpulab:`` lines a failed start leaves
for the spawn page. Compared whole (tests/golden/cluster-batch-node.sh), then run
under bash with a recording ``docker``.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time
from dataclasses import replace

import docker.errors
import pytest
from test_cluster_batch import golden, run_script, settings

from gpulab_hub import host
from gpulab_hub.cluster import ClusterError, batch
from gpulab_hub.projects import objects

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"10.0.0.1:5001/gpulab/project@{DIGEST}"
HOST = "unix:///run/gpulab-nodes/{node}/docker.sock"
NODES = (batch.NodeAddress("gpu-01", "10.0.0.11"), batch.NodeAddress("gpu-02", "10.0.0.12"))
ENGINE = batch.NodeEngine(host=HOST, config="/etc/gpulab/docker", pull=True, network=True)


def node_job(**changes) -> batch.BatchJob:
    job = batch.BatchJob("lab", settings(image=IMAGE), engine=ENGINE, publish=NODES)
    return replace(job, **changes)


def test_node_script_matches_golden():
    text = batch.render_script(node_job())
    assert text == golden("cluster-batch-node", text)
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    # The network's options are the one machine's (objects.NETWORK_*), word for word.
    assert "--driver bridge --opt com.docker.network.bridge.enable_icc=false" in text
    assert "--label gpulab.network=projects" in text
    # The container's output goes to a file of its own, never to the job's log.
    assert "<<'GPULAB_ENV' >\"$out\" 2>&1 &\n" in text


def test_the_epilog_cleans_the_nodes_own_engine(fake_node):
    docker, calls, _ = fake_node
    text = batch.render_epilog("lab", docker=docker, docker_host=HOST)
    assert run_script(text, {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-02"}).returncode == 0
    assert [(c["argv"][0], c["host"]) for c in calls()] == [
        ("ps", "unix:///run/gpulab-nodes/gpu-02/docker.sock"),
        ("rm", "unix:///run/gpulab-nodes/gpu-02/docker.sock"),
    ]
    before = len(calls())
    assert run_script(text, {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "../x"}).returncode == 0
    assert len(calls()) == before  # a node name it cannot use: nothing asked of any engine


HOSTILE = {
    "docker-host-scheme": {"engine": replace(ENGINE, host="ssh://{node}")},
    "docker-host-two-nodes": {"engine": replace(ENGINE, host="unix:///{node}/{node}.sock")},
    "docker-host-brace": {"engine": replace(ENGINE, host="unix:///run/{x}/{node}.sock")},
    "docker-host-space": {"engine": replace(ENGINE, host="unix:///run/a b/{node}.sock")},
    "config": {"engine": replace(ENGINE, config="/etc/../root")},
    "tag-not-digest": {"container": settings(image="10.0.0.1:5001/gpulab/project:latest")},
    "address": {"publish": (batch.NodeAddress("gpu-01", "10.0.0.11; id"),)},
    "address-name": {"publish": (batch.NodeAddress("gpu-01", "gpu-01.lab"),)},
    "node": {"publish": (batch.NodeAddress("gpu-01) x", "10.0.0.11"),)},
    "network": {"container": settings(image=IMAGE, network="net;id")},
    "ready-timeout": {"ready_timeout": 0},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_node_settings_are_refused(name):
    with pytest.raises(ClusterError):
        batch.render_script(node_job(**HOSTILE[name]))


# A recording docker for one node: each call as a JSON line with the DOCKER_HOST it saw.
FAKE_NODE_DOCKER = """#!/bin/bash
state=@STATE@
config=
if [ "$1" = --config ]; then config=$2; shift 2; fi
log() { python3 -c 'import json, os, sys; print(json.dumps({"argv": sys.argv[2:],
  "config": sys.argv[1], "host": os.environ.get("DOCKER_HOST", "")}))' "$config" "$@" \
  >> "$state/log"; }
case "$1" in
  network)
    log "$@"
    if [ "$2" = create ]; then touch "$state/net"; exit 0; fi
    if [ "${FAKE_NET:-}" = foreign ]; then [ "$3" = --format ] && echo "bridge true"; exit 0; fi
    [ -e "$state/net" ] || exit 1
    if [ "$3" = --format ]; then echo "bridge false"; fi ;;
  pull)
    log "$@"
    if [ -n "${FAKE_PULL_FAIL:-}" ]; then echo "Error: manifest unknown" >&2; exit 1; fi
    echo "$3" ;;
  run)
    cat > "$state/env"
    log "$@"
    echo "${FAKE_RUN_SAYS:-serving}"
    echo "gpulab-ready 10.0.0.12:1"
    touch "$state/running"
    sleep "${FAKE_RUN_SECONDS:-30}"
    exit "${FAKE_RUN_EXIT:-0}" ;;
  port)
    log "$@"
    if [ -e "$state/running" ] && [ -z "${FAKE_NO_PORT:-}" ]; then
      echo "0.0.0.0:40000"; echo "10.0.0.12:49153"
    fi ;;
  *)
    log "$@"
    if [ "$1" = ps ]; then echo c0ffee; fi ;;
esac
"""


@pytest.fixture
def fake_node(tmp_path):
    state = tmp_path / "node"
    state.mkdir()
    path = tmp_path / "docker"
    path.write_text(FAKE_NODE_DOCKER.replace("@STATE@", str(state)))
    path.chmod(0o755)

    def calls() -> list[dict]:
        log = state / "log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return str(path), calls, state


NODE_ENV = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-02", "FAKE_RUN_SECONDS": "1"}


def test_the_script_prepares_the_node_publishes_the_port_and_says_ready(fake_node):
    docker, calls, state = fake_node
    done = run_script(batch.render_script(node_job(docker=docker)), NODE_ENV)
    assert done.returncode == 0, done.stderr
    seen = calls()
    # Every call went to node gpu-02's own engine.
    assert {c["host"] for c in seen} == {"unix:///run/gpulab-nodes/gpu-02/docker.sock"}
    steps = [c["argv"][:2] for c in seen]
    # The network was missing: made once, with the one machine's options, then checked.
    create = next(c["argv"] for c in seen if c["argv"][:2] == ["network", "create"])
    assert create == [
        "network", "create", "--driver", "bridge",
        "--opt", "com.docker.network.bridge.enable_icc=false",
        "--label", "gpulab.network=projects", "gpulab-net",
    ]  # fmt: skip
    (pull,) = [c for c in seen if c["argv"][0] == "pull"]
    assert (pull["argv"], pull["config"]) == (["pull", "-q", IMAGE], "/etc/gpulab/docker")
    run = next(c["argv"] for c in seen if c["argv"][0] == "run")
    assert run[run.index("-p") + 1] == "10.0.0.12::8888"
    assert run[-3:] == [IMAGE, "jupyterhub-singleuser", "--notebook-dir=/workspace"]
    assert steps.index(["network", "create"]) < steps.index(["pull", "-q"]) < steps.index(
        ["run", "--rm"]
    )
    assert ["port", "gpulab-alice--vision"] in steps
    # What the hub reads: progress, then the address on the node's cluster address (not
    # 0.0.0.0, and not the line the container printed: its output is not in the log).
    assert done.stdout.splitlines() == [
        "gpulab-progress: Fetching the project's image on node gpu-02",
        "gpulab-progress: Starting the project's container on node gpu-02",
        "gpulab-ready 10.0.0.12:49153",
    ]
    assert (state / "env").read_text().startswith("JUPYTERHUB_API_TOKEN=")


@pytest.mark.parametrize(
    "env,words",
    [
        ({"FAKE_PULL_FAIL": "1"}, "gpulab: node gpu-02 could not fetch the project's image from"
                                  " the cluster's registry: Error: manifest unknown"),
        ({"FAKE_NET": "foreign"}, "gpulab: the network gpulab-net on node gpu-02 is not gpulab's"),
        ({"SLURMD_NODENAME": "gpu-09"}, "gpulab: node gpu-09 has no cluster address in gpulab's"),
        ({"FAKE_RUN_SAYS": "ImportError: no jupyterhub", "FAKE_RUN_EXIT": "1"},
         "gpulab: the project's container on node gpu-02 stopped before it was ready; its last"
         " lines:\ngpulab:   ImportError: no jupyterhub\ngpulab:   gpulab-ready 10.0.0.12:1"),
    ],
)  # fmt: skip
def test_a_start_that_fails_on_the_node_leaves_words_and_no_ready_line(env, words, fake_node):
    docker, calls, _ = fake_node
    done = run_script(
        batch.render_script(node_job(docker=docker)), {**NODE_ENV, "FAKE_NO_PORT": "1", **env}
    )
    assert done.returncode != 0
    assert words in done.stderr
    assert not any(line.startswith("gpulab-ready") for line in done.stdout.splitlines())
    if env.get("FAKE_RUN_EXIT"):
        # The container printed a ready line of its own: it reached the log only as a
        # quoted line of a failure, never as a line of its own.
        assert "\ngpulab-ready" not in "\n" + done.stdout + done.stderr


def test_term_while_waiting_for_the_port_removes_the_container(fake_node):
    docker, calls, state = fake_node
    proc = subprocess.Popen(
        ["bash", "-c", batch.render_script(node_job(docker=docker))],
        env={"PATH": "/usr/bin:/bin", **NODE_ENV, "FAKE_RUN_SECONDS": "30", "FAKE_NO_PORT": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not (state / "running").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert proc.returncode == 143
    assert [c["argv"] for c in calls()][-2:] == [
        ["ps", "-aq", "--filter", "label=gpulab.slurm.cluster=lab",
         "--filter", "label=gpulab.slurm.job=42"],
        ["rm", "-f", "c0ffee"],
    ]  # fmt: skip
    assert {c["host"] for c in calls()} == {"unix:///run/gpulab-nodes/gpu-02/docker.sock"}


def test_the_node_makes_the_network_this_machine_makes():
    """host.ensure_network here and the script on a node create the same network."""
    made = []

    class Engine:
        def call(self, method, *args, **kw):
            if method == "inspect_network" and not made:
                raise docker.errors.NotFound("no such network")
            if method == "create_network":
                made.append((args, kw))
            return {"Driver": "bridge", "IPAM": {"Config": [{"Gateway": "172.30.0.1"}]}}

    host.ensure_network(Engine(), "gpulab-net")
    ((args, kw),) = made
    text = batch.render_script(node_job())
    line = next(x for x in text.splitlines() if "network create" in x)
    words = shlex.split(line)[1:-5]  # after "$docker", before "$net" >/dev/null ... true
    assert words == [
        "network", "create", "--driver", kw["driver"],
        *(w for k, v in kw["options"].items() for w in ("--opt", f"{k}={v}")),
        *(w for k, v in kw["labels"].items() for w in ("--label", f"{k}={v}")),
    ]  # fmt: skip
    assert args == ("gpulab-net",) and kw["options"] == objects.NETWORK_OPTIONS

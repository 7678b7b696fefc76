"""The environment a project gets: the hub writes it through one function, the
project reads it through one, and every variable's name is written down once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpulab_contract import environment
from gpulab_hub import culling
from gpulab_hub.cluster import multinode
from gpulab_hub.projects import objects
from gpulab_jupyter import handlers, hubpeers, idle
from gpulab_jupyter.jobs import cli, cluster
from gpulab_jupyter.magics import install

ROOT = Path(__file__).resolve().parent.parent
# The hub's own site setting of the same name (the culler's timeout, read from the
# hub's environment), which it then hands to projects through environment.build.
SITE_SETTINGS = {("spawner/gpulab_hub/settings.py", environment.IDLE_TIMEOUT)}


def test_what_the_hub_writes_the_project_reads_back():
    env = environment.build(
        workspace="/workspace",
        data="/data",
        project="alice-first",
        display_name="Alice First",
        owner="alice",
        image_state="last-good",
        image_note="Its last build failed.",
        build_log_url="/hub/gpulab/build-log/alice/first",
        idle_timeout_s=3600,
        jobs_engine=environment.CLUSTER,
        hub_peers="10.1.0.7",
    )
    read = environment.read(env)
    assert read == environment.ProjectEnv(
        workspace="/workspace",
        project_dir="/workspace",
        data="/data",
        project="alice-first",
        display_name="Alice First",
        owner="alice",
        image_state="last-good",
        image_note="Its last build failed.",
        build_log_url="/hub/gpulab/build-log/alice/first",
        idle_timeout_s=3600,
        cluster_jobs=True,
        hub_peers="10.1.0.7",
    )
    # and each reader of the user side sees it
    assert cli.project_dir is install.project_dir is environment.project_dir
    assert environment.project_dir(env) == Path("/workspace")
    assert handlers.project_info(env)["display_name"] == "Alice First"
    assert handlers.image_state(env)["state"] == "last-good"
    assert idle.idle_timeout(env) == 3600
    assert isinstance(cluster.engine_for(Path("/workspace"), env), cluster.ClusterEngine)


def test_the_hub_writers_go_through_the_contract():
    settings = objects.ContainerInputs(
        name="c",
        image="i",
        command=[],
        env={},
        project_dir="/p",
        data_root="/srv/data",
        hf_cache_volume="hf",
        network="gpulab",
        port=8888,
        owner="alice",
        workspace="/w",
        data_mount="/d",
    )
    env = objects.container_env(settings)
    assert env[environment.PROJECT_DIR] == env[environment.WORKSPACE] == "/w"
    assert environment.read(env).data == "/d"

    class Config(dict):
        def __getattr__(self, name):
            return self.setdefault(name, type(self)())

        def __setattr__(self, name, value):
            self[name] = value

    c = Config()
    culling.configure(c, 600)
    assert environment.read(c.Spawner.environment).idle_timeout_s == 600
    req = multinode.TrainRequest(job_id="20261123-141502-a1b2", script="train.py", nodes=2)
    job = multinode.job_env(req, 8, {})
    assert job[environment.JOB_ID] == "20261123-141502-a1b2" and job[environment.JOB_NODES] == "2"


@pytest.mark.parametrize(
    ("name", "value", "field", "read_as"),
    [
        (environment.IMAGE_STATE, "broken", "image_state", "latest"),
        (environment.BUILD_LOG_URL, "//evil.example/x", "build_log_url", ""),
        (environment.BUILD_LOG_URL, "https://evil.example/", "build_log_url", ""),
        (environment.IMAGE_NOTE, "one\nline\x1b[31m", "image_note", "one line\x1b[31m"),
        (environment.IDLE_TIMEOUT, "1e9", "idle_timeout_s", 0),
        (environment.IDLE_TIMEOUT, "\u00b2", "idle_timeout_s", 0),  # a digit, not ASCII
        (environment.IDLE_TIMEOUT, "9" * 10, "idle_timeout_s", 0),
        (environment.JOBS_ENGINE, "Cluster", "cluster_jobs", False),
        (environment.PROJECT_DISPLAY_NAME, "x" * 500, "display_name", "x" * 100),
    ],
)
def test_a_value_the_project_set_itself_reads_as_the_default(name, value, field, read_as):
    """The project's Dockerfile (ENV) can set any of these: the reader checks each whole."""
    assert getattr(environment.read({name: value}), field) == read_as


def test_the_hub_refuses_to_write_what_the_project_would_not_read():
    with pytest.raises(ValueError, match="GPULAB_IMAGE_STATE"):
        environment.build(image_state="broken")
    with pytest.raises(ValueError, match="GPULAB_JOBS_ENGINE"):
        environment.build(jobs_engine="local")


def test_hub_peers_unset_means_no_check():
    assert environment.read({}).hub_peers is None
    assert hubpeers.allowed_peers(environment.read({}).hub_peers) is None


def test_every_name_is_written_down_once():
    """No module of either side spells a variable's name itself: each goes through
    gpulab_contract.environment (a string equal to a name anywhere else fails)."""
    names = set(environment.NAMES)
    spelled = []
    for top in ("spawner/gpulab_hub", "extensions/gpulab_jupyter"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Constant) and node.value in names:
                    if (rel, node.value) not in SITE_SETTINGS:
                        spelled.append(f"{rel}:{node.lineno}: {node.value}")
    assert spelled == []

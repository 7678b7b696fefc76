"""The environment a project's container gets from the hub: the variables' names, the
one function the hub builds them with (:func:`build`), and the one the project reads
them with (:func:`read`).

Both sides import the names from here and nowhere else. The project's own Dockerfile
(``ENV``) and its users can set any of these variables too, so :func:`read` treats
every value as untrusted: each is checked whole against what the hub writes, and
anything else is dropped for the default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProjectEnv", "build", "project_dir", "read"]

# What the hub sets in every project's container.
WORKSPACE = "GPULAB_WORKSPACE"  # the project's folder inside the container
PROJECT_DIR = "GPULAB_PROJECT_DIR"  # the same folder: where gpulab-job and %gpu_install look
DATA = "GPULAB_DATA"  # where the data folders are mounted
PROJECT = "GPULAB_PROJECT"  # the project's id (its folder name)
PROJECT_DISPLAY_NAME = "GPULAB_PROJECT_DISPLAY_NAME"  # the name its people know it by
OWNER = "GPULAB_OWNER"
IMAGE_STATE = "GPULAB_IMAGE_STATE"  # which image this start runs: IMAGE_STATES
IMAGE_NOTE = "GPULAB_IMAGE_NOTE"  # one line about it, for the user
BUILD_LOG_URL = "GPULAB_BUILD_LOG_URL"  # the hub's page of the failed build's log
IDLE_TIMEOUT = "GPULAB_IDLE_TIMEOUT"  # seconds without activity before the hub stops it
# What the hub sets where it runs a cluster.
JOBS_ENGINE = "GPULAB_JOBS_ENGINE"  # "cluster": jobs go through the hub's API
HUB_PEERS = "GPULAB_HUB_PEERS"  # the hub's addresses: the only peers the server answers
# What the hub sets in each container of a multi-node job.
JOB_ID = "GPULAB_JOB_ID"
JOB_NODES = "GPULAB_JOB_NODES"

NAMES = (
    WORKSPACE, PROJECT_DIR, DATA, PROJECT, PROJECT_DISPLAY_NAME, OWNER, IMAGE_STATE,
    IMAGE_NOTE, BUILD_LOG_URL, IDLE_TIMEOUT, JOBS_ENGINE, HUB_PEERS, JOB_ID, JOB_NODES,
)  # fmt: skip

DEFAULT_WORKSPACE = "/workspace"
CLUSTER = "cluster"  # JOBS_ENGINE's one value
# "latest": the image of the project's Dockerfile as it is; "last-good": its build
# failed, so the project runs the last image that built.
IMAGE_STATES = ("latest", "last-good")
NOTE_MAX = 300
DISPLAY_NAME_MAX = 100  # as the hub bounds a project's display name
# A path on the hub (no scheme, no host, no "//"): the only build-log links read.
HUB_PATH = re.compile(r"/(?!/)[A-Za-z0-9._~%/-]*(\?[A-Za-z0-9._~%=&-]*)?")
_SECONDS = re.compile(r"[0-9]{1,9}")


def build(
    *,
    workspace: str | None = None,
    data: str | None = None,
    project: str | None = None,
    display_name: str | None = None,
    owner: str | None = None,
    image_state: str | None = None,
    image_note: str | None = None,
    build_log_url: str | None = None,
    idle_timeout_s: int | None = None,
    jobs_engine: str | None = None,
    hub_peers: str | None = None,
    job_id: str | None = None,
    job_nodes: int | None = None,
) -> dict[str, str]:
    """The hub's one writer: these facts as the container's variables. Each part of the
    hub passes what it knows; a fact left out (None) is not written."""
    values = {
        WORKSPACE: workspace,
        PROJECT_DIR: workspace,  # the same folder, under the name the tools read
        DATA: data,
        PROJECT: project,
        PROJECT_DISPLAY_NAME: display_name,
        OWNER: owner,
        IMAGE_STATE: image_state,
        IMAGE_NOTE: image_note,
        BUILD_LOG_URL: build_log_url,
        IDLE_TIMEOUT: None if idle_timeout_s is None else str(int(idle_timeout_s)),
        JOBS_ENGINE: jobs_engine,
        HUB_PEERS: hub_peers,
        JOB_ID: job_id,
        JOB_NODES: None if job_nodes is None else str(int(job_nodes)),
    }
    if image_state is not None and image_state not in IMAGE_STATES:
        raise ValueError(f"{IMAGE_STATE} is one of {IMAGE_STATES}, not {image_state!r}")
    if jobs_engine is not None and jobs_engine != CLUSTER:
        raise ValueError(f"{JOBS_ENGINE} is {CLUSTER!r} or unset, not {jobs_engine!r}")
    return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True)
class ProjectEnv:
    """What a project's container knows from the hub, each value checked (see :func:`read`)."""

    workspace: str = ""  # "" where the hub set none (outside a hub)
    project_dir: str = ""
    data: str = ""
    project: str = ""
    display_name: str = ""  # the project's id where the hub gave no name
    owner: str = ""
    image_state: str = "latest"
    image_note: str = ""
    build_log_url: str = ""
    idle_timeout_s: int = 0  # 0: never stopped for idleness
    cluster_jobs: bool = False
    hub_peers: str | None = None  # None: unset (no check), as hubpeers reads it


def _line(value: str, limit: int) -> str:
    """One line: runs of whitespace (line breaks too) as one space, at most ``limit``."""
    return " ".join(value.split())[:limit]


def read(environ: Mapping[str, str] | None = None) -> ProjectEnv:
    """The project's one reader: the hub's variables from ``environ`` (the process's own
    by default), each checked whole; a missing or malformed value reads as its default."""
    env = os.environ if environ is None else environ
    project = env.get(PROJECT, "")
    state = env.get(IMAGE_STATE, "")
    url = env.get(BUILD_LOG_URL, "")
    idle = env.get(IDLE_TIMEOUT, "")
    return ProjectEnv(
        workspace=env.get(WORKSPACE, ""),
        project_dir=env.get(PROJECT_DIR, ""),
        data=env.get(DATA, ""),
        project=project,
        display_name=_line(env.get(PROJECT_DISPLAY_NAME, ""), DISPLAY_NAME_MAX) or project,
        owner=env.get(OWNER, ""),
        image_state=state if state in IMAGE_STATES else "latest",
        image_note=_line(env.get(IMAGE_NOTE, ""), NOTE_MAX),
        build_log_url=url if HUB_PATH.fullmatch(url) else "",
        idle_timeout_s=int(idle) if _SECONDS.fullmatch(idle) else 0,
        cluster_jobs=env.get(JOBS_ENGINE) == CLUSTER,
        hub_peers=env.get(HUB_PEERS),
    )


def project_dir(
    environ: Mapping[str, str] | None = None, default: str | os.PathLike[str] = DEFAULT_WORKSPACE
) -> Path:
    """The project's folder in this container: ``GPULAB_PROJECT_DIR``, else ``default``
    (/workspace, where the hub mounts it)."""
    return Path(read(environ).project_dir or default)

"""A gpulab hub whose projects run on the test cluster (tests/cluster_kit.py) through
ProjectSlurmSpawner: gpulab's own jupyterhub_config.py plus the lines an administrator
adds below it (docs/cluster.md shows the same lines), started the way ``gpulab up``
starts a hub (same command, folder, environment and umask), with its API on the
cluster address of this machine (GPULAB_HUB_IP), where containers on the nodes reach
it.

It is a gpulab of its own beside the session hub: its own prefix (PREFIX, the session
hub's followed by "slurm": ``gpulab down`` on it must leave the session hub's
containers alone), the session hub's images and network (GPULAB_NETWORK: its builds
join it). ``gpulab(hub, ...)`` runs the gpulab command for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cluster_kit import SlurmKit
from conftest import PREFIX as SESSION_PREFIX
from conftest import REPO, Hub, hub_env

from gpulab_hub import cli, host, hubfiles, hubsettings, pidfile

ADMIN_PASSWORD = "cluster-admin-Passw0rd"
PREFIX = f"{SESSION_PREFIX}slurm"  # GPULAB_CONTAINER_PREFIX: its projects' job names


def admin_lines(kit: SlurmKit, **spawner) -> str:
    """What an administrator adds to jupyterhub_config.py for this cluster."""
    values = {
        "slurm_conf": str(kit.conf),
        "cluster_name": kit.cluster,
        "registry": kit.registry,
        "registry_for_nodes": kit.registry_for_nodes,
        "node_docker_host": kit.node_docker_host_template,
        "node_docker_config": kit.node_docker_config,
        "node_gpus": {n.name: list(n.files) for n in kit.nodes},
        "gpu_type": "h200",
        **spawner,
    }
    lines = ['c.JupyterHub.spawner_class = "gpulab_hub.cluster.spawner.ProjectSlurmSpawner"']
    lines += [f"c.ProjectSlurmSpawner.{k} = {v!r}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def start(home: Path, kit: SlurmKit, **spawner) -> tuple[Hub, subprocess.Popen]:
    """The hub, running (as ``gpulab up`` would run it with these lines added)."""
    config = home / "jupyterhub_config.py"
    config.write_text(
        "# gpulab's configuration, then the cluster's lines (docs/cluster.md)\n"
        f"load_subconfig({str(REPO / 'jupyterhub_config.py')!r})\n" + admin_lines(kit, **spawner)
    )
    env = hub_env(
        home, GPULAB_HUB_IP=kit.host_address, GPULAB_ADMIN_PASSWORD=ADMIN_PASSWORD,
        GPULAB_CONTAINER_PREFIX=PREFIX, GPULAB_NETWORK=f"{SESSION_PREFIX}-net",
    )  # fmt: skip
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    where = hubsettings.default_layout(home)
    hub_dir = Path(home) / "hub"
    hub_dir.mkdir(parents=True, exist_ok=True)
    host.ensure_data_root(where.data_root)
    where.projects_root.mkdir(exist_ok=True)
    log_path = hub_dir / "hub.log"
    umask = os.umask(hubfiles.UMASK)
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config)],
                cwd=hub_dir, env=env, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
    finally:
        os.umask(umask)
    pidfile.write(hub_dir / cli.HUB_PIDFILE, proc.pid)
    url = env["GPULAB_BIND_URL"]
    try:
        cli.wait_for_hub(url, proc, log_path)
    except host.HostError:
        stop(proc)
        raise
    return Hub(url, home, env, ADMIN_PASSWORD, ""), proc


def stop(proc: subprocess.Popen) -> None:
    host.stop_pid(proc.pid, timeout=20)
    proc.wait(timeout=30)


# The gpulab command, with the hub's jupyterhub_config.py from its home (the command
# reads the checkout's; everything else is the command's own code).
_GPULAB = (
    "import sys; from pathlib import Path; from gpulab_hub import cli, hubsettings; "
    "hubsettings.config_file = lambda: Path(sys.argv[1]); sys.exit(cli.main(sys.argv[2:]))"
)


def gpulab(hub: Hub, *args: str) -> subprocess.Popen:
    """``gpulab <args>`` for this hub, as its administrator runs it (its environment),
    started: ``.communicate()`` gives its output."""
    config = str(hub.home / "jupyterhub_config.py")
    return subprocess.Popen([sys.executable, "-c", _GPULAB, config, *args], env=hub.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

"""``gpulab down`` and ``gpulab status`` on a Slurm cluster (the hub's spawner is
ProjectSlurmSpawner): this hub's jobs there (cluster/hubjobs.py), cancelled or listed.

Slurm not answering never stops ``gpulab down``: it says so, with what is left running
and what to do, and goes on with the rest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpulab_hub import hubsettings, pidfile
from gpulab_hub.cluster import ClusterError, hubjobs
from gpulab_hub.cluster.traits import ClusterTraits


def hub_spawner():
    """The hub's spawner, as its jupyterhub_config.py makes it (its settings: the traits)."""
    return hubsettings.spawner_of(hubsettings.read_config(hubsettings.config_file()))


def on_cluster(spawner) -> bool:
    return isinstance(spawner, ClusterTraits)


def hub_user(hub: pidfile.Identity | None) -> int:
    """The user id the hub submits jobs as: the hub's process's owner while it runs, else
    this command's user (the one who ran gpulab up)."""
    if hub is not None:
        try:
            return os.stat(f"/proc/{hub.pid}").st_uid
        except FileNotFoundError:
            pass
    return os.getuid()


def _find(spawner, uid: int) -> list[hubjobs.HubJob]:
    return hubjobs.find(spawner.slurm, spawner.prefix, spawner.escape, uid,
                        Path(spawner.records_dir))  # fmt: skip


def stop_jobs(spawner, uid: int, timeout: float = hubjobs.STOP_WAIT) -> None:
    """Cancel this hub's jobs on the cluster, one line each; Slurm's silence is said."""
    try:
        found = _find(spawner, uid)
        outcomes = hubjobs.stop(spawner.slurm, found, uid, timeout=timeout)
    except ClusterError as e:
        print(
            f"gpulab: the cluster's Slurm does not answer ({e}), so this hub's projects "
            "there may still run. Run gpulab down again once it answers (gpulab doctor "
            f"checks it), or cancel their jobs with scancel (named {spawner.prefix}-<user>"
            "--<project>).",
            file=sys.stderr,
        )
        return
    for o in outcomes:
        what, job = o.found.what, o.found.job.id
        if o.error:
            print(f"gpulab: could not stop {what} on the cluster (Slurm job {job}): "
                  f"{o.error}", file=sys.stderr)  # fmt: skip
        elif o.state:
            print(
                f"gpulab: {what}: Slurm job {job} was cancelled and is still {o.state} after "
                f"{timeout:.0f} s; its node's Epilog removes the container when it ends "
                "(squeue shows it).",
                file=sys.stderr,
            )
        else:
            print(f"Stopped {what} on the cluster (Slurm job {job})")


def show_jobs(spawner, uid: int) -> bool:
    """Print this hub's jobs on the cluster; False when Slurm does not answer."""
    try:
        found = _find(spawner, uid)
        queue = spawner.slurm.queue() if found else []
    except ClusterError as e:
        print(f"cluster: Slurm does not answer: {e}")
        return False
    print(f"cluster: {len(found)} job(s) of this hub")
    for f in found:
        who = f"{f.owner}/{f.project}" + (f" job {f.multinode}" if f.multinode else "")
        state = hubjobs.describe(f, queue)
        print(f"  {who}: {f.job.state}, {state} (Slurm job {f.job.id})")
    return True

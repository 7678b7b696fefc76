"""gpulab on a Slurm cluster: pure builders of what gpulab hands to Slurm, and a small
client of Slurm's commands (docs/cluster.md).

``dockerargs`` turns the project container spec (projects/objects.py, the one source
of its protections) into ``docker run`` arguments; ``batch`` renders the batch
script that runs a project's container on the node Slurm chose, with the GPUs Slurm
gave it, and the Epilog that removes what a killed job left; ``slurm`` runs
sbatch/squeue/scancel/sinfo with argument lists and an explicit environment and
parses their fixed-format output; ``reasons`` puts Slurm's pending reasons in a
user's words. Nothing here runs at import time.
"""

from __future__ import annotations

import re

# Slurm names gpulab writes into commands and scripts (cluster, node, partition,
# GRES type): letters, digits, "_" and "-", starting with a letter or digit.
_SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# A GRES type such as "h200" or "a100_80gb" (Slurm compares it as a plain word).
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


class ClusterError(Exception):
    """A problem with the cluster or a request to it, in words a user can act on."""


def slurm_name(value: str, what: str) -> str:
    """``value`` if it is a safe Slurm name (full match), else ClusterError."""
    if not isinstance(value, str) or _SLURM_NAME.fullmatch(value) is None:
        raise ClusterError(f"{what} {value!r} is not a Slurm name gpulab accepts")
    return value


def gres_type(value: str) -> str:
    """``value`` if it is a safe GRES type (full match), else ClusterError."""
    if not isinstance(value, str) or _GRES_TYPE.fullmatch(value) is None:
        raise ClusterError(f"GPU type {value!r} is not a GRES type gpulab accepts")
    return value

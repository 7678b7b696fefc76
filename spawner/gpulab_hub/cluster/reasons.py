"""A Slurm job's state and pending reason, in the words gpulab shows its users.

Slurm says ``PENDING (Resources)``; the spawn page says "waiting for a GPU: 3 jobs
ahead". Pure functions of what squeue printed (slurm.py parses it).
"""

from __future__ import annotations

# Reasons that mean "the cluster is busy": the job starts when others end.
_BUSY = ("None", "Resources", "Priority")
# States of a job that has ended, and what ended it.
ENDED = {
    "COMPLETED": "ended",
    "CANCELLED": "was stopped",
    "FAILED": "failed",
    "TIMEOUT": "reached its time limit",
    "NODE_FAIL": "ended because its node failed",
    "OUT_OF_MEMORY": "ran out of memory",
    "PREEMPTED": "was preempted by another job",
    "BOOT_FAIL": "ended because its node did not boot",
    "DEADLINE": "passed its deadline",
    "REVOKED": "was revoked",
    "SPECIAL_EXIT": "ended",
}
# States of a job that is still there (squeue's %T, long form).
ACTIVE = (
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "RESV_DEL_HOLD",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
)


def _ahead(n: int) -> str:
    if n <= 0:
        return "next in line"
    return f"{n} job ahead" if n == 1 else f"{n} jobs ahead"


def waiting(reason: str, wants_gpu: bool, ahead: int, partition: str = "") -> str:
    """Why a pending job waits, in a user's words."""
    if reason in _BUSY:
        what = "a GPU" if wants_gpu else "resources"
        return f"waiting for {what}: {_ahead(ahead)}"
    if reason == "JobHeldUser":
        return "held: it starts once released (scontrol release)"
    if reason == "JobHeldAdmin":
        return "held by the cluster's administrator"
    if reason in ("PartitionDown", "PartitionInactive"):
        where = f" {partition}" if partition else ""
        return (
            f"the partition{where} is down: it starts when the cluster's administrator brings it up"
        )
    if reason.startswith(("ReqNodeNotAvail", "NodeDown")):
        return "waiting: the nodes it needs are down or drained"
    if reason == "BeginTime":
        return "waiting for its start time"
    if reason.startswith("Dependency"):
        return "waiting for another job to finish"
    if reason.startswith(("QOS", "Assoc")) and "Limit" in reason:
        return f"waiting: your share of the cluster is in use (Slurm's limit {reason})"
    if reason.startswith(("PartitionTimeLimit", "PartitionNodeLimit", "BadConstraints")):
        return f"cannot start: it asks for more than the partition allows ({reason})"
    return f"waiting in the cluster's queue (Slurm says: {reason})"


def describe(
    state: str, reason: str, wants_gpu: bool, ahead: int, node: str = "", partition: str = ""
) -> str:
    """A job's state in a user's words."""
    if state == "PENDING":
        return waiting(reason, wants_gpu, ahead, partition)
    if state == "CONFIGURING":
        return f"starting on node {node}"
    if state == "RUNNING":
        return f"running on node {node}"
    if state == "COMPLETING":
        return "stopping"
    if state == "SUSPENDED":
        return "suspended by the cluster"
    if state in ENDED:
        return ENDED[state]
    return f"{state.lower()} (Slurm's state)"

"""Job ids: made in the project (``gpulab-job``, ``%gpu_job``), named by the hub's
cluster API, its Slurm jobs and its Home page. Anything that names one is matched
whole against :data:`JOB_ID` (ASCII digits and lower-case letters only)."""

from __future__ import annotations

import re
import secrets
import time

__all__ = ["EXAMPLE", "JOB_ID", "new_id"]

JOB_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[a-z0-9]{4}")
EXAMPLE = "20261123-141502-a1b2"  # what one looks like, for messages
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def new_id(now: float | None = None) -> str:
    """A new job id: the local time to the second and four random characters."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{''.join(secrets.choice(_ALPHABET) for _ in range(4))}"

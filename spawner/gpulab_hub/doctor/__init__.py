"""``gpulab doctor``: the host (driver, Docker, GPUs, memory, disk) and, with
``--project``, a project's container, checked for the failures the platform
notes lived through; each finding says what was seen and the fix.

Importing this package is cheap (hubconfig.py does, to wire the hub page): the
checks live in the modules below and load NVML only when they run.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
PAGE = "/gpulab/doctor"


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers``: the last report at /hub/gpulab/doctor, for admins
    (where the hub's layout keeps it: gpulab_hub.hubsettings)."""
    return [(PAGE, "gpulab_hub.doctor.web.DoctorHandler", {})]

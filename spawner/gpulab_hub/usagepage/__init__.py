"""The admin's GPU usage page, /hub/gpulab/usage: GPU-hours by user, by project and by
GPU over a chosen window (holdings under way counted), and its CSV export
/hub/gpulab/usage.csv. The figures come from the usage ledger (gpus/usage.py) and the
allocation record; this package only reads them.

Importing it is cheap (hubconfig.py does, to wire the pages).
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
PAGE = "/gpulab/usage"
CSV = "/gpulab/usage.csv"


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers``: the usage page and its CSV export, for admins."""
    return [
        (PAGE, "gpulab_hub.usagepage.web.UsageHandler", {}),
        (CSV.replace(".", r"\."), "gpulab_hub.usagepage.web.UsageCsvHandler", {}),
    ]

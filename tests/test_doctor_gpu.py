"""gpulab doctor on a GPU host (`pytest -m gpu`): the full report is all ok, or explains
each warning; NVML and nvidia-smi agree. Set GPULAB_BASE_IMAGE (or pass nothing and
let the report say the base image is missing) before running it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from conftest import GPULAB

from gpulab_hub.doctor import gpu

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def inventory() -> gpu.Inventory:
    inv = gpu.inventory()
    if not inv.present:
        pytest.skip("no NVIDIA driver on this machine")
    return inv


def test_full_report_on_this_gpu_host(inventory, tmp_path):
    env = dict(os.environ, GPULAB_HOME=os.environ.get("GPULAB_HOME") or str(tmp_path))
    started = time.monotonic()
    done = subprocess.run(
        [GPULAB, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    secs = time.monotonic() - started
    items = json.loads(done.stdout)
    print(json.dumps(items, indent=2))  # the report, for whoever reads this run
    assert secs < 60, f"gpulab doctor --json took {secs:.1f} s"
    (driver,) = [i for i in items if "driver" in i["id"]]
    assert driver["status"] == "ok", driver
    assert inventory.driver_version in driver["seen"]
    for g in inventory.gpus:
        assert f"cc {g.cc[0]}.{g.cc[1]}" in driver["seen"]
    unexplained = [i for i in items if i["status"] == "warn" and not i["fix"].strip()]
    assert not unexplained, unexplained
    failures = [i for i in items if i["status"] == "fail"]
    # The GPU machine's engine is the suite's Docker kit, started without gpulab's build
    # runtime (no builds run there): the doctor must say so, with the fix, and nothing else.
    builds = [i for i in failures if i["id"] == "security.builds"]
    if builds:
        assert "gpulab-build-runtime" in builds[0]["fix"], builds
    failures = [i for i in failures if i["id"] != "security.builds"]
    # Nor can that kit's iptables run here (its engine starts with --iptables=false): the
    # doctor must then say gpulab's egress rules could not be read, and only where
    # `iptables -S` really fails on this host.
    unread = [
        i for i in failures if i["id"] == "security.metadata" and "could not be read" in i["seen"]
    ]
    if unread:
        tool = shutil.which("iptables")
        listing = tool and subprocess.run([tool, "-S"], capture_output=True, timeout=30)
        assert not listing or listing.returncode != 0, unread
        assert "gpulab up" in unread[0]["fix"], unread
        failures = [i for i in failures if i not in unread]
    assert not failures, json.dumps(failures, indent=2)


def test_nvml_and_nvidia_smi_agree(inventory):
    smi = shutil.which("nvidia-smi") or "/usr/local/nvidia/bin/nvidia-smi"
    if not os.access(smi, os.X_OK):
        pytest.skip("no nvidia-smi on this machine")
    by_smi = gpu.smi_inventory(smi)
    assert by_smi.driver_version == inventory.driver_version
    assert by_smi.cuda_version == inventory.cuda_version
    # (nvidia-smi orders by minor number, NVML by PCI bus: compare as sets)
    assert sorted((g.name, g.cc) for g in by_smi.gpus) == sorted(
        (g.name, g.cc) for g in inventory.gpus
    )

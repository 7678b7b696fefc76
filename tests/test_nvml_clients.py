"""One way to NVML per side, on a machine without an NVIDIA driver (CI's case), for real:
gpulab's binding (gpulab_contract.nvml) opens a library that is not there, and every
reader says so in the words it always has. On a GPU host, tests/test_nvml_clients_gpu.py
checks the same readers against nvidia-ml-py.
"""

from __future__ import annotations

import ctypes.util
import json
import shutil
import subprocess
import sys

import pytest

from gpulab_hub.doctor import gpu as doctor_gpu
from gpulab_hub.gpus import nvml as hub_nvml
from gpulab_jupyter import devices
from gpulab_jupyter import nvml as user_nvml

ABSENT = "libnvidia-ml-gpulabnvm-absent.so.1"


def has_driver() -> bool:
    try:
        with user_nvml.opened():
            return True
    except user_nvml.NVMLError:
        return False


no_driver_here = pytest.mark.skipif(
    has_driver(), reason="this machine has an NVIDIA driver (tests/test_nvml_clients_gpu.py)"
)

READ_EVERYTHING = """
import json, sys
from gpulab_hub import gpus
from gpulab_hub.doctor import gpu
from gpulab_hub.gpus import utilmeter
from gpulab_jupyter.diagnosis import why_no_gpu
from gpulab_jupyter.jobs.engine import this_machine
from gpulab_jupyter.magics import buildenv
from gpulab_jupyter.sampler import GPUSampler

gpus.inventory(); utilmeter.utilisation(); gpu.inventory(); buildenv.detect_gpus()
this_machine(); why_no_gpu()
s = GPUSampler(environ={"CUDA_VISIBLE_DEVICES": "0"}); s._setup()
libs = ("nvitop", "pynvml", "psutil")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in libs)))
"""


def test_every_reader_reaches_nvml_through_gpulabs_binding_alone():
    """The hub's inventory, meter and doctor, and the user side's sampler, diagnosis, jobs
    and magics, all asked once: neither nvitop nor nvidia-ml-py is imported."""
    done = subprocess.run(
        [sys.executable, "-c", READ_EVERYTHING], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@no_driver_here  # (on a GPU host the hub process keeps the NVML it loaded)
def test_the_hub_without_a_driver_library_says_projects_run_on_the_cpu():
    inv = hub_nvml.inventory(ABSENT)
    assert (inv.devices, inv.driver, inv.cuda) == ([], "", "")
    assert inv.problem == "no NVIDIA driver on this host: projects run on the CPU"


@no_driver_here
def test_the_hub_with_a_library_that_is_not_nvml_says_what_nvml_lacks():
    inv = hub_nvml.inventory(ctypes.util.find_library("c"))
    assert inv.devices == []
    assert inv.problem == (
        "NVML could not list the GPUs (nvmlInit_v2 not in this driver): projects run on the CPU"
    )


@no_driver_here
def test_the_hubs_inventory_and_meter_on_this_driverless_machine():
    from gpulab_hub import gpus
    from gpulab_hub.gpus import utilmeter

    assert gpus.inventory().problem == "no NVIDIA driver on this host: projects run on the CPU"
    assert utilmeter.utilisation() == {}
    assert hub_nvml._nvml is None  # nothing kept: a driver installed later is found


@no_driver_here
def test_the_doctor_tells_a_found_library_that_does_not_load(tmp_path, monkeypatch):
    broken = tmp_path / "libnvidia-ml.so.1"
    broken.write_bytes(b"not a shared object")
    monkeypatch.setattr(doctor_gpu, "find_nvml_library", lambda: str(broken))
    inv = doctor_gpu.nvml_inventory()
    assert not inv.present and inv.error_kind == "no-library"
    assert inv.error.startswith(f"{broken} does not load: ")


@no_driver_here
def test_the_doctor_on_this_driverless_machine():
    inv = doctor_gpu.nvml_inventory()
    assert (inv.present, inv.error_kind) == (False, "no-library")
    assert inv.error == "libnvidia-ml.so.1 not found"


def test_the_user_side_opens_nvml_once_per_question():
    with pytest.raises(user_nvml.NVMLError_LibraryNotFound) as e:
        with user_nvml.opened(ABSENT):
            pass
    assert e.value.value == 12 and ABSENT in str(e.value)


@no_driver_here
@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="nvidia-smi answers here")
def test_gpu_install_without_a_driver_keeps_its_words():
    from gpulab_jupyter.magics import buildenv

    report = buildenv.detect_gpus({})
    assert report.gpus == []
    assert report.problem == (
        "the NVIDIA driver could not be reached through NVML (NVML Shared Library Not Found)"
    )


@no_driver_here
def test_a_job_without_a_driver_runs_on_the_cpu_and_says_why():
    from gpulab_jupyter.jobs.engine import this_machine

    machine = this_machine()
    assert machine.capabilities == () and machine.gpus == 0
    assert machine.why_no_gpu.reason == "no_driver"
    assert "libnvidia-ml.so.1" in machine.why_no_gpu.message


def test_cuda_version_as_cuda_writes_it():
    assert [user_nvml.cuda_version(v) for v in (12040, 13000, 11080, 12021)] == [
        "12.4",
        "13.0",
        "11.8",
        "12.2.1",
    ]


def dev(index: str, uuid: str, parent: str | None = None) -> devices.Device:
    return devices.Device(index, uuid, "GPU", parent_uuid=parent)


def test_cuda_visible_devices_one_rule_for_the_sampler_and_the_magics():
    a, b = dev("0", "GPU-aaaa-1111"), dev("1", "GPU-bbbb-2222")
    b.mig_enabled = True
    m = dev("1:0", "MIG-cccc-3333", parent=b.uuid)
    found = [a, b, m]

    def uuids(mask):
        from gpulab_jupyter.sampler import GPUSampler

        return GPUSampler(environ={})._cuda_uuids(found, mask)

    assert uuids(None) is None  # unset: no limit
    assert uuids("") == []  # set and empty: no GPU
    assert uuids("1") == [b.uuid]  # an index: NVML's, of a whole GPU
    assert uuids(f"{b.uuid},{a.uuid}") == [b.uuid, a.uuid]  # gpulab's full UUIDs, in order
    assert uuids("GPU-bbbb,0") == [b.uuid, a.uuid]  # the start of a UUID
    assert uuids("MIG-cccc") == [m.uuid]
    assert uuids("0,7,1") == [a.uuid]  # CUDA stops at the first it does not know
    sel = devices.select(found, None, uuids("1"))
    assert [d.uuid for d in sel.devices] == [m.uuid]  # a GPU in MIG mode stands for its slice


def test_importing_the_clients_loads_nothing():
    code = (
        "import gpulab_contract.nvml, gpulab_hub.gpus.nvml, gpulab_hub.doctor.gpu, "
        "gpulab_jupyter.nvml, gpulab_jupyter.sampler\n"
        "print(any('libnvidia-ml' in line for line in open('/proc/self/maps')), "
        "gpulab_hub.gpus.nvml._nvml)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "None"], done.stderr

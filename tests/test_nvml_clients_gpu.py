"""On a GPU host (``gpu`` marker): every NVML reader of both sides, through gpulab's own
binding (gpulab_contract.nvml) and its side's client, reads what nvidia-ml-py reads.
The driverless path of the same readers: tests/test_nvml_clients.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.gpu


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.fixture(scope="module")
def witness():
    """What nvidia-ml-py reads of this host's GPUs."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"no usable NVIDIA driver here: {e}")
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mig = pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                mig = False
            gpus.append(
                SimpleNamespace(
                    index=i,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    name=_text(pynvml.nvmlDeviceGetName(h)),
                    cc=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                    memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    minor=pynvml.nvmlDeviceGetMinorNumber(h),
                    mig=mig,
                )
            )
        found = SimpleNamespace(
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda=pynvml.nvmlSystemGetCudaDriverVersion_v2(),
            gpus=gpus,
        )
    finally:
        pynvml.nvmlShutdown()
    if not found.gpus:
        pytest.skip("the NVIDIA driver lists no GPU")
    return found


def test_the_hubs_inventory_reads_what_nvidia_ml_py_reads(witness):
    from gpulab_contract.nvml import cuda_version
    from gpulab_hub import gpus

    inv = gpus.inventory()
    print(inv.as_dict())
    assert inv.problem == "" and inv.driver == witness.driver
    assert inv.cuda == cuda_version(witness.cuda)
    whole = [d for d in inv.devices if not d.parent_uuid]
    sliced = {d.parent_uuid for d in inv.devices if d.parent_uuid}
    plain = [g for g in witness.gpus if g.uuid not in sliced]
    assert [(d.index, d.uuid, d.name, d.capability, d.memory_total, d.minor) for d in whole] == [
        (str(g.index), g.uuid, g.name, f"{g.cc[0]}.{g.cc[1]}", g.memory_total, g.minor)
        for g in plain
    ]
    for g in witness.gpus:
        if g.uuid in sliced:  # a GPU in MIG mode: its slices, each named with its profile
            slices = [d for d in inv.devices if d.parent_uuid == g.uuid]
            assert g.mig and all(d.mig_profile and d.minor == g.minor for d in slices)


def test_the_hubs_meter_reads_every_gpus_utilisation(witness):
    from gpulab_hub.gpus import utilmeter

    utils = utilmeter.utilisation()
    print(utils)
    assert set(utils) == {g.uuid for g in witness.gpus}
    assert all(u is None or 0.0 <= u <= 100.0 for u in utils.values())
    assert any(u is not None for u in utils.values())  # a whole GPU is measured


def test_the_doctor_reads_the_driver_through_the_hubs_client(witness):
    from gpulab_hub.doctor import gpu

    inv = gpu.nvml_inventory()
    assert (inv.source, inv.driver_version) == ("nvml", witness.driver)
    assert inv.cuda_version == (witness.cuda // 1000, witness.cuda % 1000 // 10)
    assert [(g.uuid, g.cc) for g in inv.gpus] == [(g.uuid, g.cc) for g in witness.gpus]


def test_the_user_sides_readers_agree_with_nvidia_ml_py(witness):
    from gpulab_jupyter import nvml
    from gpulab_jupyter.jobs.engine import this_machine
    from gpulab_jupyter.magics import buildenv

    with nvml.opened() as lib:
        ours = nvml.gpus(lib)
    assert [(g.index, g.uuid, g.name, g.capability, g.memory_total) for g in ours] == [
        (g.index, g.uuid, g.name, g.cc, g.memory_total) for g in witness.gpus
    ]
    report = buildenv.detect_gpus({})
    print(report)
    assert (report.driver, report.cuda, report.problem) == (
        witness.driver,
        nvml.cuda_version(witness.cuda),
        "",
    )
    assert [(g.uuid, g.capability) for g in report.gpus] == [
        (g.uuid, f"{g.cc[0]}.{g.cc[1]}") for g in witness.gpus
    ]
    machine = this_machine()
    assert machine.capabilities == tuple(g.cc for g in witness.gpus)
    assert machine.why_no_gpu is None


def test_cuda_visible_devices_by_index_picks_that_gpu(witness):
    from gpulab_jupyter.sampler import GPUSampler

    last = witness.gpus[-1]
    s = GPUSampler(environ={"CUDA_VISIBLE_DEVICES": str(last.index)})
    s._setup()
    try:
        if last.mig:  # a GPU in MIG mode stands for its slices
            assert s._devices and all(d.parent_uuid == last.uuid for d in s._devices)
        else:
            assert [d.uuid for d in s._devices] == [last.uuid], s._state
    finally:
        s.stop()

"""Pure parts of the GPU status: which devices are this container's, and whose processes.

No NVML here: the device lists are plain data, and /proc is a folder made to
look like one (its fd links point at /dev/nvidia* paths that need not exist).
"""

import os

from gpulab_jupyter import devices, processes
from gpulab_jupyter.devices import Device

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
C = "GPU-cccccccc-1111-2222-3333-444444444444"
M1 = "MIG-11111111-2222-3333-4444-555555555555"
M2 = "MIG-22222222-2222-3333-4444-555555555555"


def host():
    """Three GPUs; the third is in MIG mode with two slices."""
    return [
        Device("0", A, "H100", minor=0),
        Device("1", B, "H100", minor=1),
        Device("2", C, "A100", minor=2, mig_enabled=True),
        Device("2:0", M1, "A100 MIG 3g.40gb", parent_uuid=C, minor=2),
        Device("2:1", M2, "A100 MIG 3g.40gb", parent_uuid=C, minor=2),
    ]


def uuids(sel):
    return [d.uuid for d in sel.devices]


def test_unset_or_all_means_every_gpu_and_mig_slices_stand_for_their_gpu():
    assert uuids(devices.select(host(), None)) == [A, B, M1, M2]
    assert uuids(devices.select(host(), "all")) == [A, B, M1, M2]


def test_void_none_and_empty_mean_no_gpu():
    for value in ("void", "none", "", "  "):
        sel = devices.select(host(), value)
        assert sel.devices == [] and sel.reason == "none_allocated"
        assert "NVIDIA_VISIBLE_DEVICES" in sel.message


def test_by_uuid_prefix_and_mig_uuid():
    assert uuids(devices.select(host(), f"{B},{M2}")) == [B, M2]
    assert uuids(devices.select(host(), "GPU-aaaaaaaa")) == [A]
    assert uuids(devices.select(host(), C)) == [M1, M2]
    assert uuids(devices.select(host(), "GPU-ffffffff")) == []


def test_indices_select_when_the_driver_sees_more_gpus_than_were_given():
    assert uuids(devices.select(host(), "1")) == [B]
    assert uuids(devices.select(host(), "2:1")) == [M2]
    # The runtime already hid the others (NVML sees as many GPUs as were given):
    two = host()[:2]
    assert uuids(devices.select(two, "5,7")) == [A, B]


def test_cuda_visible_devices_narrows_further():
    assert uuids(devices.select(host(), None, [B])) == [B]
    assert uuids(devices.select(host(), None, [C])) == [M1, M2]
    sel = devices.select(host(), A, [B])
    assert sel.devices == [] and "CUDA_VISIBLE_DEVICES" in sel.message


def fake_proc(tmp_path, procs):
    """procs: pid -> (name, ppid, cmdline, [fd targets])."""
    for pid, (name, ppid, cmd, fds) in procs.items():
        d = tmp_path / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({name}) S {ppid} 1 1 0 -1")
        (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode() + b"\0")
        for i, target in enumerate(fds):
            os.symlink(target, d / "fd" / str(i))
    return str(tmp_path)


KID = "0f6a2c1e-4b1d-4d53-9d7e-0123456789ab"


def test_scan_finds_gpu_processes_and_their_kernel(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            10: ("jupyter-server", 1, "jupyter server", ["/dev/nvidiactl", "/dev/nvidia0"]),
            20: ("python", 10, f"python -m ipykernel_launcher -f /r/kernel-{KID}.json", []),
            30: ("pt_worker", 20, "python worker", ["/dev/nvidia-uvm", "/dev/nvidia0"]),
            40: ("bash", 1, "bash", ["/dev/null"]),
            50: ("nvidia-smi", 1, "nvidia-smi", ["/dev/nvidiactl", "/dev/nvidia1"]),
        },
    )
    found = {p.pid: p for p in processes.scan(proc, exclude={10})}
    assert set(found) == {30, 50}  # the server itself (the sampler) is excluded
    assert found[30].uvm and found[30].minors == {0}
    assert found[30].kernel_id == KID and found[30].ancestors == [20, 10]
    assert not found[50].uvm  # NVML only (no CUDA context)


def lp(pid, minors=(0,), uvm=True):
    return processes.LocalProcess(pid, 1, f"p{pid}", f"cmd {pid}", set(minors), uvm)


def test_same_pid_namespace_matches_by_pid_and_trusts_the_driver():
    rows, others = processes.attribute(
        [lp(100), lp(101), lp(102, minors=(1,))],
        {A: [(100, 2 << 30), (999, 1 << 30)], B: []},
        {A: 0, B: 1},
    )
    assert [(r["pid"], r["gpus"]) for r in rows] == [
        (100, [{"uuid": A, "memory_used": 2 << 30, "match": "pid"}])
    ]
    assert others == [{"uuid": A, "count": 1, "memory_used": 1 << 30}]


def test_own_pid_namespace_pairs_by_order_when_counts_agree():
    rows, others = processes.attribute(
        [lp(7), lp(9)], {A: [(40123, 3 << 30), (40007, 1 << 30)]}, {A: 0}
    )
    assert [(r["pid"], r["driver_pid"], r["gpus"][0]["match"]) for r in rows] == [
        (7, 40007, "order"),
        (9, 40123, "order"),
    ]
    assert rows[0]["gpus"][0]["memory_used"] == 1 << 30
    assert others == []


def test_unmatchable_processes_keep_unknown_memory_and_the_rest_is_grouped():
    rows, others = processes.attribute(
        [lp(7)], {A: [(40001, 1 << 30), (40002, 2 << 30), (40003, None)]}, {A: 0}
    )
    assert rows[0]["pid"] == 7
    assert rows[0]["gpus"] == [{"uuid": A, "memory_used": None, "match": None}]
    # Other tenants: how many and how much, nothing else.
    assert others == [{"uuid": A, "count": 3, "memory_used": 3 << 30}]

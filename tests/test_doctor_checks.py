"""gpulab doctor's checks on recorded inputs (tests/fixtures/doctor/, origins in its README):
what CI cannot produce for real (a GPU, a driver, WSL2, another CUDA layout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulab_contract import arch
from gpulab_hub.doctor import (
    answer,
    cuda,
    docker_checks,
    findings,
    gpu,
    libs,
    project,
    resources,
    sandbox,
)
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding
from gpulab_hub.projects import objects

FIX = Path(__file__).parent / "fixtures" / "doctor"
PROBES = sandbox.ProbeInputs("gl", "gl-net", "1000:100", "8g", 2 << 30, 3.0, 4096, str.lower)


def read(name: str) -> str:
    return (FIX / name).read_text()


def smi(name: str) -> gpu.Inventory:
    """An inventory as nvidia-smi's two outputs give it (the NVML-less fallback)."""
    inv = gpu.parse_smi_xml(read(f"nvidia-smi-q-x-{name}.xml"))
    query = {"h100-550": "h100", "rtx5090-570": "rtx5090", "2xt4-470": "2xt4"}[name]
    return gpu.merge_query(inv, gpu.parse_smi_csv(read(f"nvidia-smi-query-{query}.csv")))


def facts(name: str) -> dict:
    """A recorded answer of the probe, read as the doctor reads every answer."""
    return answer.check(json.loads(read(f"probe-project-{name}.json")), "project")


def by_id(items: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in items}


# --- nvidia-smi and NVML values ---


def test_nvidia_smi_outputs_of_an_h100():
    inv = smi("h100-550")
    assert (inv.driver_version, inv.cuda_version, inv.source) == (
        "550.54.15",
        (12, 4),
        "nvidia-smi",
    )
    (g,) = inv.gpus
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert g.uuid == "GPU-5f2c8a3e-9d41-7b6e-2c0a-81f4d7e3b912"
    assert (g.cc, g.memory_mib, g.pci_bus_id) == ((9, 0), 81559, "00000000:19:00.0")


def test_nvidia_smi_outputs_of_two_t4_and_a_blackwell_card():
    t4 = smi("2xt4-470")
    assert t4.cuda_version == (11, 4)
    assert [(g.index, g.cc) for g in t4.gpus] == [(0, (7, 5)), (1, (7, 5))]
    assert smi("rtx5090-570").gpus[0].cc == (12, 0)


def test_query_csv_header_loses_its_units():
    (row,) = gpu.parse_smi_csv(read("nvidia-smi-query-h100.csv"))
    assert row["memory.total"] == "81559"
    assert row["compute_cap"] == "9.0"


def test_driver_finding_with_a_driver():
    f = gpu.check_driver(smi("h100-550"), [], wsl=False, cpu_only=False)
    assert f.status == OK
    assert "550.54.15" in f.seen and "CUDA up to 12.4" in f.seen and "H100" in f.seen


def test_driver_finding_without_one():
    none = gpu.Inventory(error="no libnvidia-ml.so.1 on this machine", error_kind="no-library")
    f = gpu.check_driver(none, [], wsl=False, cpu_only=False)
    assert f.status == WARN and "no NVIDIA driver" in f.seen and "--cpu-only" in f.fix
    assert gpu.check_driver(none, [], wsl=False, cpu_only=True).status == OK
    # A GPU on the PCI bus without a driver is broken, not CPU-only.
    f = gpu.check_driver(none, ["0000:19:00.0"], wsl=False, cpu_only=True)
    assert f.status == FAIL and "0000:19:00.0" in f.seen and "driver" in f.fix


def test_driver_upgraded_without_reboot():
    inv = gpu.Inventory(error="NVML: Driver/library version mismatch", error_kind="mismatch")
    f = gpu.check_driver(inv, [], wsl=False, cpu_only=False)
    assert f.status == FAIL and "reboot" in f.fix


def test_nvidia_gpus_are_found_on_the_pci_bus_without_a_driver(tmp_path):
    for name, vendor, cls in [
        ("0000:19:00.0", "0x10de", "0x030200"),
        ("0000:19:00.1", "0x10de", "0x040300"),  # its audio function
        ("0000:00:02.0", "0x8086", "0x030000"),
    ]:
        d = tmp_path / "bus/pci/devices" / name
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
    assert gpu.nvidia_pci_devices(str(tmp_path)) == ["0000:19:00.0"]


# --- driver vs CUDA, GPU vs arch lists ---


def test_driver_older_than_the_images_cuda():
    f = cuda.check_image_cuda("img", (12, 4), None, smi("2xt4-470"), cpu_only=False)
    assert f.status == FAIL
    assert "470.182.03" in f.seen and "insufficient" in f.seen
    assert ">= 550.54.14" in f.fix


def test_driver_newer_than_the_image_and_torch():
    f = cuda.check_image_cuda("img", (12, 1), (12, 1), smi("h100-550"), cpu_only=False)
    assert f.status == OK and "supports CUDA 12.4" in f.seen


def test_same_major_newer_minor_runs_by_minor_version_compatibility():
    f = cuda.check_image_cuda("img", None, (12, 8), smi("h100-550"), cpu_only=False)
    assert f.status == WARN and "minor version compatibility" in f.seen
    assert "570.26" in f.fix


def test_image_and_torch_with_different_cuda_majors():
    f = cuda.check_image_cuda("img", (11, 8), (12, 1), smi("h100-550"), cpu_only=False)
    assert f.status == WARN and "undefined symbol" in f.fix


def test_cuda_image_on_a_host_without_driver():
    f = cuda.check_image_cuda("img", (12, 4), None, gpu.Inventory(), cpu_only=False)
    assert f.status == WARN and "550.54.14" in f.fix
    assert cuda.check_image_cuda("img", None, None, gpu.Inventory(), False).status == OK


def test_image_cuda_from_nvidia_image_variables():
    assert cuda.image_cuda_version({"CUDA_VERSION": "12.4.1"}) == (12, 4)
    require = "cuda>=12.1 brand=tesla,driver>=470,driver<471"
    assert cuda.image_cuda_version({"NVIDIA_REQUIRE_CUDA": require}) == (12, 1)
    assert cuda.image_cuda_version({}) is None


TORCH_CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def test_blackwell_with_a_torch_built_up_to_hopper():
    f = cuda.check_torch_arch("t", "2.5.1+cu124", TORCH_CU124, smi("rtx5090-570").gpus)
    assert f.status == FAIL
    assert "no kernel image is available" in f.seen and "sm_120" in f.seen
    assert "cu128" in f.fix


def test_torch_arch_list_covers_hopper_and_ampere_minors():
    assert cuda.check_torch_arch("t", "2.5.1", TORCH_CU124, smi("h100-550").gpus).status == OK
    a10 = [gpu.Gpu(0, "NVIDIA A10", cc=(8, 6))]
    assert cuda.check_torch_arch("t", "2", ["sm_80"], a10).status == OK  # sm_80 SASS runs on 8.6
    a100 = [gpu.Gpu(0, "NVIDIA A100", cc=(8, 0))]
    assert cuda.check_torch_arch("t", "2", ["sm_86"], a100).status == FAIL
    ptx_only = cuda.check_torch_arch("t", "2", ["sm_80", "compute_90"], smi("rtx5090-570").gpus)
    assert ptx_only.status == WARN and "only PTX" in ptx_only.seen


def test_cpu_torch_and_no_torch_are_fine():
    assert cuda.check_torch_arch("t", "", None, smi("h100-550").gpus).status == OK
    assert cuda.check_torch_arch("t", "2.5.1+cpu", [], smi("h100-550").gpus).status == OK


def test_build_arch_list():
    h100 = smi("h100-550").gpus
    unset = cuda.check_build_arch_list("b", None, "2.5.1", h100)
    assert unset.status == WARN and 'TORCH_CUDA_ARCH_LIST="9.0+PTX"' in unset.fix
    wrong = cuda.check_build_arch_list("b", "8.0;8.6", "2.5.1", h100)
    assert wrong.status == FAIL and "sm_90" in wrong.fix
    assert cuda.check_build_arch_list("b", "Hopper", "2.5.1", h100).status == OK
    blackwell = smi("rtx5090-570").gpus
    assert cuda.check_build_arch_list("b", "8.9;12.0", "2.7", blackwell).status == OK
    assert cuda.check_build_arch_list("b", "9.0+PTX", "2.7", blackwell).status == WARN
    assert cuda.check_build_arch_list("b", None, "", blackwell).status == OK  # no torch


# --- libraries: ldconfig -p, two libcudart ---


def test_ldconfig_of_this_vm_finds_its_cuda_13_runtime_and_no_nvml():
    text = read("ldconfig-p-debian12-cuda13-toolkit-no-driver.txt")
    entries = libs.parse_ldconfig(text)
    # As many as its header says ("615 libs found in cache"); the trailer line is skipped.
    assert len(entries) == int(text.split()[0]) == 615
    cudart = [e for e in entries if libs.family(e[1]) == "cudart"]
    assert ("libcudart.so.13", "/usr/local/cuda-13.0/lib/libcudart.so.13") in cudart
    assert not [e for e in entries if e[0] == gpu.NVML_SONAME]


def test_ldconfig_of_a_cuda_image_and_of_a_two_toolkit_workstation():
    image = libs.parse_ldconfig(read("ldconfig-p-nvidia-cuda-12.4-cudnn-runtime.txt"))
    fams = [libs.family(p) for _, p in image]
    assert fams.count("cudart") == 1 and fams.count("cudnn") == 1  # not libcudnn_ops & co
    two = libs.parse_ldconfig(read("ldconfig-p-two-cuda-toolkits-cudnn8.txt"))
    assert ("libnvidia-ml.so.1", "/lib/x86_64-linux-gnu/libnvidia-ml.so.1") in two
    assert (
        gpu.find_nvml_library(read("ldconfig-p-two-cuda-toolkits-cudnn8.txt"))
        == gpu.find_nvml_library("")  # that path is not on this machine
    )


def test_two_cuda_runtimes_on_the_library_path():
    text = read("ldconfig-p-two-cuda-toolkits-cudnn8.txt")
    lines = "\n".join(line for line in text.splitlines() if "libcudart" in line)
    f = libs.check_copies(project.normalize({"ldconfig": lines}), "cudart")
    assert f.status == WARN and "2 versions" in f.seen and "undefined symbol" in f.fix


def test_two_cuda_runtimes_loaded_in_one_process():
    found = by_id(project.analyze(facts("two-cudart")))
    assert found["project.cudart"].status == FAIL
    assert "2 copies" in found["project.cudart"].seen
    assert "LD_LIBRARY_PATH" in found["project.cudart"].fix
    assert found["project.cudnn"].status == OK  # 8.9.7 and 8.9.2: one major
    assert found["project.alloc_conf"].status == WARN


def test_torchs_private_renamed_runtime_does_not_clash():
    one = {
        "libs": [
            {"path": "/t/lib/libcudart-9335f6a2.so.12", "where": "loaded"},
            {"path": "/cuda/lib64/libcudart.so.12", "where": "loaded"},
        ]
    }
    assert libs.check_copies(one, "cudart").status == OK


# --- inside a project ---


def test_healthy_h100_project_is_all_ok():
    found = project.analyze(facts("h100-healthy"))
    assert all(f.status == OK for f in found), [f for f in found if f.status != OK]
    ids = by_id(found)
    assert "bf16" in ids["project.precision"].seen and "bfloat16" in ids["project.precision"].fix
    assert "2.5.1+cu124" in ids["project.torch"].seen


def test_cuda_visible_devices_hiding_the_allocated_gpu():
    found = by_id(project.analyze(facts("cvd-hides-gpu")))
    assert found["project.visible_devices"].status == FAIL
    assert "'1'" in found["project.visible_devices"].seen
    assert found["project.torch"].status == FAIL


@pytest.mark.parametrize(
    ("cvd", "nodes", "status"),
    [
        (None, 2, OK),
        ("", 1, FAIL),
        ("-1", 1, FAIL),
        ("0,1", 2, OK),
        ("0", 2, WARN),
        ("GPU-5f2c8a3e", 1, OK),
        ("3", 0, OK),
    ],
)
def test_visible_devices_rules(cvd, nodes, status):
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    f = project.check_visible_devices(
        {"env": env, "device_nodes": [f"/dev/nvidia{i}" for i in range(nodes)]}
    )
    assert f.status == status


def test_blackwell_project_with_old_torch():
    found = by_id(project.analyze(facts("rtx5090-torch-cu124")))
    assert found["project.torch_arch"].status == FAIL
    assert found["project.build_arch_list"].status == WARN
    assert '"12.0+PTX"' in found["project.build_arch_list"].fix


def test_cpu_project_recorded_in_gpulab_base_image():
    found = project.analyze(facts("gpulab-base-cpu"))
    assert [f.status for f in found] == [OK] * len(found)
    assert "project.precision" not in by_id(found)  # no GPU, no advice


def test_precision_advice_before_ampere():
    f = project.check_precision({"torch": {"devices": [{"name": "Tesla T4", "cc": [7, 5]}]}})
    assert f.status == OK and "GradScaler" in f.fix


# --- memory, MAX_JOBS, WSL2 ---


def test_memory_of_this_vm():
    f = resources.check_memory(read("proc-meminfo-debian12-vm-24g.txt"), cpus=2)
    assert f.status == OK
    assert f.seen.startswith("22.3 GiB of 23.5 GiB memory available, swap 0.0 GiB, 2 CPUs")
    assert f.seen.endswith("MAX_JOBS=2")
    more_cpus = resources.check_memory(read("proc-meminfo-debian12-vm-24g.txt"), cpus=16)
    assert more_cpus.seen.endswith("MAX_JOBS=5")  # memory, not CPUs, sets the limit
    wsl = resources.check_memory(read("proc-meminfo-wsl2-8gb.txt"), cpus=8)
    assert wsl.status == OK and wsl.seen.endswith("MAX_JOBS=1")
    assert arch.max_jobs(23 * resources.GIB, 2) == 2
    assert arch.max_jobs(23 * resources.GIB, 64) == 5  # 4 GiB a job
    assert arch.max_jobs(1 * resources.GIB, 8) == 1


def test_low_memory_warns():
    meminfo = "MemTotal: 4000000 kB\nMemAvailable: 3000000 kB\nSwapTotal: 0 kB\n"
    f = resources.check_memory(meminfo, cpus=8)
    assert f.status == WARN and "swap" in f.fix and "MAX_JOBS=1" in f.seen


def test_wsl2_is_recognised():
    assert resources.is_wsl2(read("proc-version-wsl2.txt"), {})
    assert not resources.is_wsl2(read("proc-version-debian12-vm.txt"), {})


def test_wslconfig_files():
    eight = resources.parse_wslconfig(read("wslconfig-memory-8gb.ini"))
    assert eight["memory"] == "8GB"
    assert eight["processors"] == "4" and eight["swap"] == "2GB"
    big = resources.parse_wslconfig(read("wslconfig-memory-48gb-swap-16gb.ini"))
    assert (big["memory"], big["swap"]) == ("48GB", "16GB")
    assert "automemoryreclaim" not in big  # another section
    assert "memory" not in resources.parse_wslconfig(read("wslconfig-no-memory-key.ini"))


def test_wsl2_with_8gb_says_how_to_lift_it():
    f = resources.check_wsl2(
        read("proc-meminfo-wsl2-8gb.txt"),
        read("wslconfig-memory-8gb.ini"),
        "/mnt/c/Users/ana/.wslconfig",
    )
    assert f.status == WARN and "memory=8GB" in f.seen and "7.7 GiB" in f.seen
    assert ".wslconfig" in f.fix and "wsl --shutdown" in f.fix and "memory=16GB" in f.fix
    default = resources.check_wsl2(read("proc-meminfo-wsl2-8gb.txt"), None, "x")
    assert "no .wslconfig found" in default.seen and "half of Windows' memory" in default.seen


def test_wsl2_with_enough_memory():
    meminfo = "MemTotal: 49283072 kB\nMemAvailable: 48000000 kB\nSwapTotal: 16777216 kB\n"
    conf = read("wslconfig-memory-48gb-swap-16gb.ini")
    assert resources.check_wsl2(meminfo, conf, "x").status == OK


def test_wslconfig_is_found_under_the_windows_users(tmp_path):
    (tmp_path / "Public").mkdir()
    (tmp_path / "ana").mkdir()
    (tmp_path / "ana" / ".wslconfig").write_text(read("wslconfig-memory-8gb.ini"))
    assert resources.find_wslconfig(str(tmp_path), {"USER": "ana"}) == tmp_path / "ana/.wslconfig"
    assert resources.find_wslconfig(str(tmp_path / "none"), {}) is None


# --- Docker's ways to give GPUs (device trees made here) ---


def fake_host(tmp_path: Path, nodes: list[str], libs: list[str]) -> tuple[str, str]:
    """A /dev with these nodes and a driver folder whose lib64/ has these libraries."""
    dev, drivers = tmp_path / "dev", tmp_path / "nvidia"
    (drivers / "lib64").mkdir(parents=True)
    dev.mkdir()
    for n in nodes:
        (dev / n).touch()
    for lib in libs:
        (drivers / "lib64" / lib).touch()
    return str(dev), str(drivers)


ALL_NODES = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
DRIVER_LIBS = ["libcuda.so.1", "libnvidia-ml.so.1"]


def test_explicit_devices_path_as_gpulab_uses_it(tmp_path):
    dev, drivers = fake_host(tmp_path, ALL_NODES, DRIVER_LIBS)
    assert docker_checks.device_nodes(dev) == [f"{dev}/nvidia0", f"{dev}/nvidia1"]
    info = {"Runtimes": {"runc": {}}}
    inv = smi("2xt4-470")
    f = docker_checks.check_gpu_access(info, inv, drivers, False, dev)
    assert f.status == OK and drivers in f.seen
    assert "could not select device driver" in f.seen
    # The test container gets every GPU the way a project gets its own (objects.py).
    g = docker_checks.all_gpus(inv, info, drivers, dev)
    assert (g.isolation, g.minors, g.uuids) == ("devices", (0, 1), tuple(x.uuid for x in inv.gpus))
    spec = sandbox.probe_spec(PROBES, "img", ["python3"], g)
    host_config, env = spec["host_config"], spec["environment"]
    assert "/dev/nvidia1:/dev/nvidia1:rwm" in host_config["devices"]
    assert host_config["binds"] == {drivers: {"bind": drivers, "mode": "ro"}}
    assert spec["volumes"] == [drivers]
    assert env["LD_LIBRARY_PATH"] == f"{drivers}/lib64"
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(g.uuids)


def test_explicit_devices_without_the_driver_folder(tmp_path):
    dev, drivers = fake_host(tmp_path, ALL_NODES, ["libnvidia-ml.so.1"])
    f = docker_checks.check_gpu_access({}, smi("h100-550"), drivers, False, dev)
    assert f.status == FAIL and "libcuda.so.1" in f.seen
    assert "GPULAB_DRIVER_DIR" in f.fix and "nvidia-ctk" in f.fix


def test_nvidia_runtime(tmp_path):
    dev, drivers = fake_host(tmp_path, [], [])
    info = {"Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}
    inv = smi("h100-550")
    f = docker_checks.check_gpu_access(info, inv, drivers, False, dev)
    assert f.status == OK and "device_requests" in f.seen
    g = docker_checks.all_gpus(inv, info, drivers)
    host_config = sandbox.probe_spec(PROBES, "img", ["python3"], g)["host_config"]
    assert host_config["device_requests"][0]["device_ids"] == [inv.gpus[0].uuid]
    assert host_config["binds"] == {}


def test_driver_without_device_nodes_cannot_give_gpus(tmp_path):
    dev, drivers = fake_host(tmp_path, [], DRIVER_LIBS)
    f = docker_checks.check_gpu_access({}, smi("h100-550"), drivers, False, dev)
    assert f.status == FAIL and "nvidia-modprobe" in f.fix
    assert docker_checks.all_gpus(smi("h100-550"), {}, drivers, dev) is None


def test_a_probe_container_is_a_project_container_without_the_projects_folders(tmp_path):
    """The probe's spec is objects.container_spec's (not a copy): whatever a project
    container gets, a probe gets, less the project's folders, data, cache and port."""
    dev, drivers = fake_host(tmp_path, ALL_NODES, DRIVER_LIBS)
    g = docker_checks.all_gpus(smi("2xt4-470"), {}, drivers, dev)
    probe_spec = sandbox.probe_spec(PROBES, "img", ["python3", "-c", "x"], g)
    project_spec = objects.container_spec(
        objects.ContainerInputs(
            name="gl-alice--one",
            image="img",
            command=["python3", "-c", "x"],
            env={},
            project_dir="/srv/projects/alice/one",
            data_root="/srv/data",
            hf_cache_volume="gl-hf-alice",
            network=PROBES.network,
            port=8888,
            owner="alice",
            user=PROBES.user,
            shm_size=PROBES.shm_size,
            mem_limit=PROBES.mem_limit,
            cpu_limit=PROBES.cpu_limit,
            pids_limit=PROBES.pids_limit,
            gpus=g,
        )
    )
    probe_hc, project_hc = probe_spec.pop("host_config"), project_spec.pop("host_config")
    assert probe_hc.pop("binds") == {drivers: {"bind": drivers, "mode": "ro"}}
    assert probe_hc.pop("log_config") == sandbox.LOG_CONFIG
    del project_hc["binds"]
    assert probe_hc == project_hc  # capabilities, privileges, network, limits, devices
    assert probe_hc["cap_drop"] == ["ALL"] and probe_hc["security_opt"] == ["no-new-privileges"]
    assert (probe_hc["network_mode"], probe_hc["pids_limit"]) == ("gl-net", 4096)
    assert probe_spec["name"].startswith("gl-doctor-") and probe_spec["labels"] == {
        "gpulab.doctor": "gl"
    }
    assert probe_spec["volumes"] == [drivers] and "ports" not in probe_spec
    assert "hostname" not in probe_spec and project_spec["hostname"] == "one"  # no project's
    for key in ("name", "hostname", "labels", "volumes", "ports"):
        probe_spec.pop(key, None)
        project_spec.pop(key)
    assert probe_spec == project_spec  # image, command, user, environment, working folder
    assert sandbox.container_name(PROBES, "Al.ice", "One") == "gl-al.ice--one"


# --- findings, rendering, exit codes ---


def test_exit_codes_and_json_shape():
    ok, warn, fail = (
        Finding("a", OK, "s"),
        Finding("b", WARN, "s", "f"),
        Finding("c", FAIL, "s", "f"),
    )
    assert findings.exit_code([ok]) == 0
    assert findings.exit_code([ok, warn]) == 0  # warnings are printed, not an error
    assert findings.exit_code([ok, warn], strict=True) == 1
    assert findings.exit_code([warn, fail, ok]) == 1
    assert "gpulab can run" in findings.render_table([ok, warn])
    assert "fix the failures" in findings.render_table([ok, warn, fail])
    items = json.loads(findings.to_json([ok, fail]))
    assert items[1] == {"id": "c", "status": "fail", "seen": "s", "fix": "f"}


def test_a_problem_needs_a_fix():
    with pytest.raises(ValueError):
        Finding("x", WARN, "seen", "")
    with pytest.raises(ValueError):
        Finding("x", "bad", "seen", "fix")


def test_table_for_people():
    rows = [Finding("host.driver", WARN, "no NVIDIA driver " * 8, "Install it.")]
    plain = findings.render_table(rows, color=False, width=80)
    assert "\033[" not in plain
    assert all(len(line) <= 80 for line in plain.splitlines())
    assert "-> Install it." in plain and "0 ok, 1 warnings, 0 failures" in plain
    assert "\033[33mwarn" in findings.render_table(rows, color=True)


DOCUMENTED_IDS = (
    "host.driver host.memory host.wsl2 host.hf_cache disk.gpulab_home disk.docker docker.engine "
    "docker.gpu_access docker.gpu_container images.in_use image.<ref>.present image.<ref>.probe "
    "image.<ref>.cuda image.<ref>.torch_arch image.<ref>.build_arch_list project.container "
    "project.cudart project.cudnn project.visible_devices project.torch project.torch_arch "
    "project.build_arch_list project.precision project.alloc_conf"
).split()


def test_every_check_is_documented_and_made_by_the_code():
    doc = (Path(__file__).parents[1] / "docs" / "doctor.md").read_text()
    source = "".join(p.read_text() for p in Path(findings.__file__).parent.glob("*.py"))
    for fid in DOCUMENTED_IDS:
        assert f"`{fid}`" in doc, f"docs/doctor.md does not describe {fid}"
        if "<ref>" in fid:  # f"image.{ref}.cuda"
            made = fid.rpartition(".")[2] + '"' in source
        elif fid in ("project.cudart", "project.cudnn"):  # f"project.{fam}"
            made = f'"{fid.rpartition(".")[2]}"' in source and 'f"project.{fam}"' in source
        else:
            made = f'"{fid}"' in source
        assert made, f"no check makes {fid}"

"""The host's NVIDIA driver and GPUs: NVML first, ``nvidia-smi`` second.

NVML through the hub's one client (``gpulab_hub.gpus.nvml``, gpulab's binding), from
the library this module finds (also where it is not on the loader's path);
``nvidia-smi`` where NVML cannot be loaded, and as a second witness in the GPU tests.
Nothing here touches NVML at import: :func:`inventory` loads it when called, and
a machine with no driver gets an :class:`Inventory` whose ``error`` says why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding, gpu_absent
from gpulab_hub.gpus import nvml, wsl

NVML_SONAME = nvml.SONAME

# Where drivers put NVML when it is not on the loader's path: the NVIDIA
# container images' convention (and the lent GPU hosts), WSL2, distributions.
NVML_DIRS = (
    "/usr/local/nvidia/lib64",
    wsl.WSL_LIB,
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib/aarch64-linux-gnu",
)
NVIDIA_PCI_VENDOR = "0x10de"
DRIVER_URL = "https://www.nvidia.com/drivers"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str = ""
    cc: tuple[int, int] | None = None  # compute capability
    memory_mib: int | None = None
    pci_bus_id: str = ""


@dataclass
class Inventory:
    source: str = ""  # "nvml", "nvidia-smi" or "" (nothing answered)
    driver_version: str = ""
    cuda_version: tuple[int, int] | None = None  # the newest CUDA the driver supports
    gpus: list[Gpu] = field(default_factory=list)
    error: str = ""  # why nothing answered
    error_kind: str = ""  # "no-library", "not-loaded", "mismatch", "other"

    @property
    def present(self) -> bool:
        return bool(self.driver_version)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def cuda_str(v: tuple[int, ...] | None) -> str:
    return ".".join(str(p) for p in v) if v else "none"


# --- nvidia-smi outputs (parsers tested on recorded outputs) ---


def parse_smi_xml(text: str) -> Inventory:
    """``nvidia-smi -q -x``: driver version, the CUDA it supports, each GPU."""
    # nvidia-smi prints a DOCTYPE naming a DTD file; ElementTree ignores it.
    root = ET.fromstring(text.encode())
    cuda = version_tuple(root.findtext("cuda_version", ""))
    inv = Inventory(
        source="nvidia-smi",
        driver_version=(root.findtext("driver_version") or "").strip(),
        cuda_version=cuda[:2] if len(cuda) >= 2 else None,
    )
    for i, g in enumerate(root.findall("gpu")):
        mem = version_tuple(g.findtext("fb_memory_usage/total", ""))
        cc = version_tuple(g.findtext("compute_cap", ""))
        minor = g.findtext("minor_number", "").strip()
        inv.gpus.append(
            Gpu(
                index=int(minor) if minor.isdigit() else i,
                name=(g.findtext("product_name") or "").strip(),
                uuid=(g.findtext("uuid") or "").strip(),
                cc=(cc[0], cc[1]) if len(cc) >= 2 else None,
                memory_mib=mem[0] if mem else None,
                pci_bus_id=(g.findtext("pci/pci_bus_id") or g.get("id", "")).strip(),
            )
        )
    return inv


def parse_smi_csv(text: str) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=... --format=csv``: one dict per GPU, keys from the header
    with units dropped (``memory.total [MiB]`` -> ``memory.total``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    keys = [re.sub(r"\s*\[.*\]$", "", k.strip()) for k in lines[0].split(",")]
    rows = []
    for line in lines[1:]:
        values = [v.strip() for v in line.split(",")]
        rows.append(dict(zip(keys, values, strict=False)))
    return rows


SMI_QUERY = "index,name,uuid,driver_version,compute_cap,memory.total,pci.bus_id"


def merge_query(inv: Inventory, rows: list[dict[str, str]]) -> Inventory:
    """Add compute capabilities (only the CSV query has them on older drivers)."""
    by_uuid = {r.get("uuid", ""): r for r in rows}
    gpus = []
    for i, g in enumerate(inv.gpus):
        row = by_uuid.get(g.uuid) or (rows[i] if i < len(rows) else {})
        cc = version_tuple(row.get("compute_cap", ""))
        if g.cc is None and len(cc) >= 2:
            g = Gpu(g.index, g.name, g.uuid, (cc[0], cc[1]), g.memory_mib, g.pci_bus_id)
        gpus.append(g)
    inv.gpus = gpus
    return inv


def smi_inventory(nvidia_smi: str, timeout: float = 20) -> Inventory:
    xml = subprocess.run([nvidia_smi, "-q", "-x"], capture_output=True, text=True, timeout=timeout)
    if xml.returncode != 0:
        msg = (xml.stdout + xml.stderr).strip().splitlines()
        return Inventory(error=f"nvidia-smi failed: {msg[0] if msg else xml.returncode}")
    inv = parse_smi_xml(xml.stdout)
    query = [nvidia_smi, f"--query-gpu={SMI_QUERY}", "--format=csv,nounits"]
    csv = subprocess.run(query, capture_output=True, text=True, timeout=timeout)
    return merge_query(inv, parse_smi_csv(csv.stdout) if csv.returncode == 0 else [])


# --- NVML ---


def find_nvml_library(ldconfig_text: str | None = None) -> str | None:
    """Path of the driver's NVML library on this machine, or None."""
    from gpulab_hub.doctor.libs import parse_ldconfig

    if ldconfig_text is None:
        ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
        try:
            done = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10)
            ldconfig_text = done.stdout
        except (OSError, subprocess.TimeoutExpired):
            ldconfig_text = ""
    for soname, path in parse_ldconfig(ldconfig_text):
        if soname == NVML_SONAME and Path(path).exists():
            return path
    for d in NVML_DIRS:
        if (Path(d) / NVML_SONAME).exists():
            return str(Path(d) / NVML_SONAME)
    return None


def nvml_inventory() -> Inventory:
    """The driver and GPUs through NVML (the hub's inventory), loaded only now."""
    lib = find_nvml_library()
    if lib is None:
        return Inventory(error=f"{NVML_SONAME} not found", error_kind="no-library")
    try:
        nvml.loaded(lib)  # the copy found here, also where it is not on the loader's path
    except nvml.NVMLError_LibraryNotFound as e:
        return Inventory(error=f"{lib} does not load: {e}", error_kind="no-library")
    except nvml.NVMLError:
        pass  # the inventory says what NVML answered
    found = nvml.inventory(lib)
    if not found.driver:
        problem = found.problem
        kind = "other"
        if "mismatch" in problem.lower():
            kind = "mismatch"
        elif "no NVIDIA driver" in problem:
            kind = "not-loaded"  # the library is here, the kernel module does not answer
        return Inventory(error=f"NVML: {problem}", error_kind=kind)
    cuda = version_tuple(found.cuda)
    inv = Inventory("nvml", found.driver, (cuda[0], cuda[1]) if len(cuda) >= 2 else None)
    physical: dict[str, Gpu] = {}
    for d in found.devices:  # whole GPUs, or the MIG slices of a GPU in MIG mode
        index = int(d.index.split(":")[0])
        key = d.parent_uuid or d.uuid
        if key not in physical:
            name = d.name.split(" MIG ")[0]
            cc = version_tuple(d.capability)
            memory = None if d.parent_uuid else d.memory_total // 2**20
            physical[key] = Gpu(index, name, key, (cc[0], cc[1]), memory)
    inv.gpus = sorted(physical.values(), key=lambda g: g.index)
    return inv


def inventory() -> Inventory:
    """NVML, else nvidia-smi, else an empty inventory saying why."""
    inv = nvml_inventory()
    if inv.present:
        return inv
    smi = shutil.which("nvidia-smi") or next(
        (
            p
            for p in ("/usr/local/nvidia/bin/nvidia-smi", "/usr/lib/wsl/lib/nvidia-smi")
            if os.access(p, os.X_OK)
        ),
        None,
    )
    if smi and inv.error_kind in ("other", "no-library"):
        try:
            by_smi = smi_inventory(smi)
        except (OSError, subprocess.TimeoutExpired, ET.ParseError) as e:
            by_smi = Inventory(error=f"nvidia-smi: {e}")
        if by_smi.present:
            return by_smi
    return inv


def nvidia_pci_devices(sys_root: str = "/sys") -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers, driver or not."""
    found = []
    for dev in sorted(Path(sys_root, "bus/pci/devices").glob("*")):
        try:
            vendor = (dev / "vendor").read_text().strip()
            cls = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR and cls.startswith("0x03"):
            found.append(dev.name)
    return found


def gpu_summary(inv: Inventory) -> str:
    names: dict[str, int] = {}
    for g in inv.gpus:
        label = g.name + (f" (cc {g.cc[0]}.{g.cc[1]})" if g.cc else "")
        names[label] = names.get(label, 0) + 1
    return ", ".join(f"{n}x {label}" for label, n in names.items()) or "no GPU"


def check_driver(inv: Inventory, pci: list[str], wsl: bool, cpu_only: bool) -> Finding:
    """host.driver: the NVIDIA driver answers, its version and the CUDA it supports."""
    fid = "host.driver"
    if inv.present:
        seen = (
            f"NVIDIA driver {inv.driver_version} (supports CUDA up to "
            f"{cuda_str(inv.cuda_version)}), via {inv.source}: {gpu_summary(inv)}"
        )
        if not inv.gpus:
            return Finding(
                fid,
                WARN,
                seen,
                "No GPU is visible to the driver: check "
                "`nvidia-smi` and that the GPUs are not disabled or passed elsewhere.",
            )
        return Finding(fid, OK, seen)
    if inv.error_kind == "mismatch":
        return Finding(
            fid,
            FAIL,
            f"NVIDIA driver installed but unusable: {inv.error}",
            "The driver was upgraded without a reboot (library and kernel module "
            "differ): reboot the machine.",
        )
    if inv.error_kind == "not-loaded" or pci:
        where = f"NVIDIA GPU(s) at PCI {', '.join(pci)}" if pci else "NVIDIA's library is here"
        return Finding(
            fid,
            FAIL,
            f"{where}, but no NVIDIA driver answers ({inv.error})",
            f"Install or load the NVIDIA driver ({DRIVER_URL}, or your distribution's "
            "nvidia-driver package) and reboot; `nvidia-smi` must list the GPUs.",
        )
    if wsl and Path("/dev/dxg").exists():
        return Finding(
            fid,
            FAIL,
            f"WSL2 with GPU paravirtualisation but no NVIDIA driver library ({inv.error})",
            "Install the NVIDIA driver for Windows (not inside WSL); it provides "
            "/usr/lib/wsl/lib/libnvidia-ml.so.1.",
        )
    return gpu_absent(
        fid,
        f"no NVIDIA driver on this machine ({inv.error}) and no NVIDIA GPU on its PCI bus: "
        "projects run on the CPU",
        "Nothing to do for a CPU-only hub (run `gpulab doctor --cpu-only` to say so); for GPUs, "
        f"install an NVIDIA GPU and its driver ({DRIVER_URL}).",
        cpu_only,
    )


def check_gpu_sharing(host: wsl.GpuHost) -> Finding | None:
    """host.gpu_sharing: on WSL2 (gpus/wsl.py) every GPU project shares every GPU;
    None on a host whose GPUs gpulab pins to projects (or that has none)."""
    if not host.shared:
        return None
    libs = host.lib_dir or f"no {wsl.WSL_LIB}"
    return Finding(
        "host.gpu_sharing",
        WARN,
        f"WSL2 shared GPU ({host.dxg}, driver libraries: {libs}): all GPU projects on this "
        f"computer share every GPU. Works: {wsl.WORKS}. Does not work: {wsl.DOES_NOT}; "
        "a GPU project can slow down or run another out of GPU memory",
        "Nothing to fix for one person's computer; for projects that each get their own GPU, "
        "measured and reclaimed, run gpulab on Linux without WSL.",
    )

"""Runs INSIDE a container (``python3 -c <this file> MODE [ARG]``) and prints one JSON
object of facts; the hub side judges them. Standard library only, Python >= 3.6,
so it runs in any image with a python3.

Modes:
  nvml PATH  load the driver's NVML from PATH: driver, GPUs it sees (five ctypes calls
             of its own: the image under test need not have gpulab's NVML binding,
             gpulab_contract.nvml, nor a Python that runs it; the hub's inventory,
             read through that binding, is what the probe's answer is compared with)
  image      torch's version, CUDA and compiled architectures
  project    image + environment, GPU device nodes, CUDA/cuDNN copies on the
             library path and those a process has mapped after importing torch
"""

import ctypes
import glob
import json
import os
import re
import subprocess
import sys

ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "TORCH_CUDA_ARCH_LIST",
    "LD_LIBRARY_PATH",
    "CUDA_VERSION",
    "CUDA_HOME",
)
LIB_RE = re.compile(r"lib(cudart|cudnn)(-[0-9a-f]{8})?\.so")


def nvml(path):
    out = {"gpus": []}
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        out["error"] = f"cannot load {path}: {e}"
        return out
    rc = lib.nvmlInit_v2()
    if rc != 0:
        out["error"] = f"nvmlInit_v2 returned {rc}"
        return out
    buf = ctypes.create_string_buffer(96)
    lib.nvmlSystemGetDriverVersion(buf, 96)
    out["driver_version"] = buf.value.decode()
    count = ctypes.c_uint(0)
    lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    for i in range(count.value):
        handle = ctypes.c_void_p()
        lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
        lib.nvmlDeviceGetName(handle, buf, 96)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
        out["gpus"].append(
            {"index": i, "name": buf.value.decode(), "cc": [major.value, minor.value]}
        )
    lib.nvmlShutdown()
    return out


def torch_facts(full):
    facts = {"version": ""}
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            facts["error"] = f"{type(e).__name__}: {e}"
        return facts
    except (ImportError, OSError, RuntimeError, AttributeError) as e:
        facts["error"] = f"{type(e).__name__}: {e}"  # a broken torch is a fact
        return facts
    facts["version"] = torch.__version__
    facts["cuda"] = torch.version.cuda or ""
    flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)()
    facts["arch_flags"] = flags.split() if flags else []
    if not full:
        return facts
    try:
        facts["available"] = bool(torch.cuda.is_available())
        facts["device_count"] = torch.cuda.device_count() if facts["available"] else 0
        facts["devices"] = []
        for i in range(facts["device_count"]):
            p = torch.cuda.get_device_properties(i)
            facts["devices"].append({"name": p.name, "cc": [p.major, p.minor]})
        if facts["available"]:
            facts["bf16"] = bool(torch.cuda.is_bf16_supported())
        facts["cudnn"] = torch.backends.cudnn.version() if facts["cuda"] else None
    except (RuntimeError, AssertionError, AttributeError, OSError) as e:
        # e.g. "CUDA driver version is insufficient for CUDA runtime version"
        facts["cuda_error"] = f"{type(e).__name__}: {e}"
    return facts


def _lib(path, where, version=None):
    entry = {"path": path, "real": os.path.realpath(path), "where": where}
    if version:
        entry["version"] = [int(p) for p in re.findall(r"\d+", version)]
    return entry


def libraries():
    libs, ldconfig_text = [], ""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real"):
        if os.path.exists(ldconfig):
            try:
                ldconfig_text = subprocess.check_output([ldconfig, "-p"]).decode(errors="replace")
            except (OSError, subprocess.CalledProcessError):
                continue
            break
    lines = [line for line in ldconfig_text.splitlines() if LIB_RE.search(line)]
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        for path in sorted(glob.glob(os.path.join(d, "lib*.so*"))) if d else []:
            if LIB_RE.search(os.path.basename(path)):
                libs.append(_lib(path, "LD_LIBRARY_PATH"))
    try:
        from importlib import metadata

        for dist in metadata.distributions():
            name = (dist.metadata["Name"] or "").lower()
            if name.startswith(("nvidia-cuda-runtime", "nvidia-cudnn")):
                for f in dist.files or []:
                    if LIB_RE.search(os.path.basename(str(f))):
                        libs.append(_lib(str(dist.locate_file(f)), "pip", dist.version))
    except ImportError:
        pass
    return libs, lines


def mapped():
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if LIB_RE.search(os.path.basename(path)):
                found.add(path)
    return [_lib(p, "loaded") for p in sorted(found)]


def project():
    libs, ldconfig_lines = libraries()
    facts = {
        "python": sys.version.split()[0],
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "device_nodes": sorted(glob.glob("/dev/nvidia[0-9]*")),
        "ldconfig": "\n".join(ldconfig_lines),
        "realpaths": {},
        "torch": torch_facts(full=True),
    }
    for line in ldconfig_lines:
        path = line.rsplit("=>", 1)[-1].strip()
        facts["realpaths"][path] = os.path.realpath(path)
    facts["libs"] = libs + mapped()
    return facts


def main(argv):
    mode = argv[0] if argv else "image"
    if mode == "nvml":
        facts = nvml(argv[1])
    elif mode == "project":
        facts = project()
    else:
        facts = {"python": sys.version.split()[0], "torch": torch_facts(full=False)}
    sys.stdout.write("\n@@gpulab-doctor@@" + json.dumps(facts) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

"""``%gpu_info``: the GPUs this kernel sees, the driver, and the torch build."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

from gpulab_contract import arch

from . import buildenv

_TORCH = r"""
import json, torch
c = torch.cuda
info = {"version": torch.__version__, "cuda": torch.version.cuda, "arch_list": [],
        "available": False, "bf16": None}
try:
    info["arch_list"] = c.get_arch_list()
    info["available"] = c.is_available()
    if info["available"]:
        info["bf16"] = c.is_bf16_supported()
except Exception as e:
    info["error"] = f"{type(e).__name__}: {e}"
print("@@gpulab-torch@@" + json.dumps(info))
"""


def torch_info(timeout: float = 120) -> dict | None:
    """torch's version, CUDA and arch list (in a fresh interpreter unless already imported)."""
    try:
        importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TORCH], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"import torch took over {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("@@gpulab-torch@@"):
            return json.loads(line.removeprefix("@@gpulab-torch@@"))
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"import torch failed: {tail[0]}"}


def gather() -> dict:
    report = buildenv.detect_gpus()
    return {
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "capability": g.capability,
                "sm": g.sm,
                "generation": arch.generation(g.capability),
                "bf16": arch.key(g.capability) >= (8, 0),
                "memory_total": g.memory_total,
                "memory_used": g.memory_used,
            }
            for g in report.gpus
        ],
        "driver": report.driver,
        "cuda_driver": report.cuda,
        "problem": report.problem,
        # The same words as the GPU panel's (one diagnosis: gpulab_jupyter/diagnosis.py).
        "no_gpu": _why_no_gpu() if not report.gpus else None,
        "torch": torch_info(),
    }


def _why_no_gpu() -> dict | None:
    from gpulab_jupyter.diagnosis import why_no_gpu

    found = why_no_gpu()
    return found.as_dict() if found is not None else None


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f}"


def render(info: dict) -> str:
    out = []
    if not info["gpus"]:
        why = info.get("no_gpu")
        if why:
            out.append(f"No NVIDIA GPU is visible here: {why['message']}")
            out.append(why["hint"])
        else:
            out.append(f"No NVIDIA GPU is visible here: {info['problem']}.")
    for g in info["gpus"]:
        gen = f", {g['generation']}" if g["generation"] else ""
        out.append(
            f"GPU {g['index']}: {g['name']}: compute capability {g['capability']} "
            f"({g['sm']}{gen}), bf16: {'yes' if g['bf16'] else 'no'}, "
            f"memory {_gib(g['memory_used'])} / {_gib(g['memory_total'])} GiB used"
        )
    if info["driver"]:
        cuda = f", supports CUDA up to {info['cuda_driver']}" if info["cuda_driver"] else ""
        out.append(f"NVIDIA driver {info['driver']}{cuda}")
    t = info["torch"]
    if t is None:
        out.append("torch: not installed in this environment")
    elif "version" not in t:
        out.append(f"torch: {t.get('error', 'unknown')}")
    else:
        cuda = f"CUDA {t['cuda']}" if t.get("cuda") else "CPU only"
        built_for = " ".join(t.get("arch_list") or []) or "none"
        out.append(f"torch {t['version']} ({cuda}), built for: {built_for}")
        sass, ptx = arch.split_arch_list(t.get("arch_list") or [])
        for g in info["gpus"]:
            if arch.key(g["capability"]) < arch.key(arch.OLDEST):
                verdict = "older than Volta (7.0), which gpulab's builds do not target"
            elif arch.runs_on(g["capability"], sass, ptx):
                verdict = "yes"
            else:
                verdict = "NO: kernels would fail with 'no kernel image is available'"
            out.append(f"  runs on GPU {g['index']} ({g['sm']}): {verdict}")
        if info["gpus"] and not t.get("available"):
            out.append(f"  torch.cuda.is_available() is False {t.get('error', '')}".rstrip())
        if t.get("bf16") is not None:
            out.append(f"  torch bf16 support: {'yes' if t['bf16'] else 'no'}")
    return "\n".join(out)


def gpu_info(line: str = "") -> dict:
    info = gather()
    print(render(info))
    return info

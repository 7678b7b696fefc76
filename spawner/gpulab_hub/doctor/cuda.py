"""CUDA versions and GPU architectures: driver vs image, GPU vs arch lists.

Pure functions of what was read elsewhere (driver, image, torch); the tables
and the SASS/PTX rules are gpulab's one architecture module,
:mod:`gpulab_contract.arch`, which ``%gpu_install`` uses too.
"""

from __future__ import annotations

import re

from gpulab_contract import arch
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding, gpu_absent
from gpulab_hub.doctor.gpu import Gpu, Inventory, cuda_str, version_tuple

# torch.utils.cpp_extension's names for TORCH_CUDA_ARCH_LIST entries.
NAMED_ARCHES = {
    "volta": "7.0+PTX",
    "turing": "7.5+PTX",
    "ampere": "8.0;8.6+PTX",
    "ada": "8.9+PTX",
    "hopper": "9.0+PTX",
    "blackwell": "10.0;12.0+PTX",
}


def min_driver(cuda: tuple[int, ...]) -> str:
    return arch.min_driver(cuda_str(cuda[:2])) or "?"


def expand_names(value: str) -> str:
    """'Ampere;9.0' -> '8.0;8.6+PTX;9.0' (other entries unchanged)."""
    items = re.split(r"[;\s,]+", value.strip())
    return ";".join(NAMED_ARCHES.get(i.lower(), i) for i in items if i)


def _arch_text(sass: set[str], ptx: set[str]) -> str:
    def key(c: str) -> tuple[int, ...]:
        return version_tuple(c)

    names = [arch.sm(c) for c in sorted(sass, key=key)]
    names += ["compute_" + arch.sm(c)[3:] for c in sorted(ptx, key=key)]
    return " ".join(names) or "no architecture"


# --- checks ---


def check_image_cuda(
    image: str,
    image_cuda: tuple[int, ...] | None,
    torch_cuda: tuple[int, ...] | None,
    inv: Inventory,
    cpu_only: bool,
) -> Finding:
    """image.<ref>.cuda: the driver supports the image's CUDA and torch's CUDA."""
    fid = f"image.{image}.cuda"
    needs = [v[:2] for v in (image_cuda, torch_cuda) if v]
    parts = []
    if image_cuda:
        parts.append(f"image CUDA {cuda_str(image_cuda)}")
    if torch_cuda:
        parts.append(f"torch built for CUDA {cuda_str(torch_cuda)}")
    if not needs:
        return Finding(fid, OK, "no CUDA in this image (no CUDA_VERSION, no CUDA build of torch)")
    seen = ", ".join(parts)
    if image_cuda and torch_cuda and image_cuda[0] != torch_cuda[0]:
        return Finding(
            fid,
            WARN,
            seen + ": two CUDA major versions in one image",
            f"Start FROM a CUDA {torch_cuda[0]}.x image or install torch built for "
            f"CUDA {image_cuda[0]}.x, or extensions built with the image's nvcc fail "
            "with 'undefined symbol' against torch.",
        )
    need = max(needs)
    if not inv.present:
        return gpu_absent(
            fid,
            seen + "; no NVIDIA driver here to run it",
            f"Install NVIDIA driver >= {min_driver(need)} to run this image on a GPU.",
            cpu_only,
        )
    have = inv.cuda_version or (0, 0)
    seen += f"; driver {inv.driver_version} supports CUDA {cuda_str(have)}"
    if have >= need:
        return Finding(fid, OK, seen)
    fix = (
        f"Upgrade the NVIDIA driver to >= {min_driver(need)} (CUDA {cuda_str(need)}), or use "
        f"an image and torch built for CUDA <= {cuda_str(have)}."
    )
    if have[0] < need[0]:
        return Finding(fid, FAIL, seen + ": 'CUDA driver version is insufficient'", fix)
    return Finding(
        fid,
        WARN,
        seen + ": runs only through CUDA minor version compatibility "
        "(no PTX JIT; the NVIDIA runtime refuses images requiring a newer CUDA)",
        fix,
    )


def check_torch_arch(
    fid: str, torch_version: str, arch_flags: list[str] | None, gpus: list[Gpu]
) -> Finding:
    """<scope>.torch_arch: each GPU's capability is in torch's compiled arch list."""
    if not torch_version:
        return Finding(fid, OK, "torch is not installed")
    if not arch_flags:
        return Finding(fid, OK, f"torch {torch_version} is a CPU build: nothing to run on a GPU")
    sass, ptx = arch.split_arch_list(arch_flags)
    cudas = [arch.min_cuda(arch.normalize(g.cc)) for g in gpus if g.cc]
    cuda = max(filter(None, cudas), key=version_tuple, default=None)
    wheels = f": a CUDA {cuda}+ build, e.g. the cu{cuda.replace('.', '')} wheels" if cuda else ""
    return _arch_finding(
        fid,
        f"torch {torch_version} has {_arch_text(sass, ptx)}",
        sass,
        ptx,
        gpus,
        "Install a torch build that includes {need}" + wheels + ".",
    )


def check_build_arch_list(
    fid: str, value: str | None, torch_version: str, gpus: list[Gpu]
) -> Finding:
    """<scope>.build_arch_list: TORCH_CUDA_ARCH_LIST that CUDA extension builds will use."""
    rec = arch.torch_cuda_arch_list([f"{g.cc[0]}.{g.cc[1]}" for g in gpus if g.cc])
    if not torch_version:
        return Finding(fid, OK, "torch is not installed: no CUDA extension builds here")
    if not value:
        return Finding(
            fid,
            WARN,
            "TORCH_CUDA_ARCH_LIST is not set: a `docker build` sees no GPU, "
            "so CUDA extensions get nvcc's default architecture",
            f'Add `ENV TORCH_CUDA_ARCH_LIST="{rec}"` to the Dockerfile.',
        )
    sass, ptx = arch.split_arch_list(expand_names(value))
    return _arch_finding(
        fid,
        f"TORCH_CUDA_ARCH_LIST={value!r}",
        sass,
        ptx,
        gpus,
        f'Set `ENV TORCH_CUDA_ARCH_LIST="{rec}"` (it lacks {{need}}).',
    )


def _arch_finding(
    fid: str, seen: str, sass: set[str], ptx: set[str], gpus: list[Gpu], fix: str
) -> Finding:
    missing, jit, old = [], [], []
    for g in gpus:
        if g.cc is None:
            continue
        label = f"{g.name} (sm_{g.cc[0]}{g.cc[1]})"
        if g.cc < (7, 0):
            old.append(label)
            continue
        how = arch.how_it_runs(arch.normalize(g.cc), sass, ptx)
        if how is None:
            missing.append(label)
        elif how == "ptx":
            jit.append(label)
    need = ", ".join(sorted({f"sm_{g.cc[0]}{g.cc[1]}" for g in gpus if g.cc})) or "these GPUs"
    if missing:
        return Finding(
            fid,
            FAIL,
            f"{seen}: no kernel image for {', '.join(missing)} ('no kernel "
            "image is available for execution on the device')",
            fix.format(need=need),
        )
    if jit:
        return Finding(
            fid,
            WARN,
            f"{seen}: only PTX for {', '.join(jit)} (JIT-compiled at each first start, minutes)",
            fix.format(need=need),
        )
    if old:
        return Finding(
            fid,
            WARN,
            f"{seen}; {', '.join(old)} is older than Volta (7.0), which "
            "gpulab's builds do not target",
            "Use a GPU of compute capability 7.0 or newer for gpulab projects.",
        )
    return Finding(fid, OK, f"{seen}: covers {need}")


def image_cuda_version(env: dict[str, str]) -> tuple[int, ...] | None:
    """The CUDA an image carries, from NVIDIA images' CUDA_VERSION (or NVIDIA_REQUIRE_CUDA)."""
    v = version_tuple(env.get("CUDA_VERSION", ""))
    if len(v) >= 2:
        return v[:2]
    m = re.search(r"cuda>=(\d+\.\d+)", env.get("NVIDIA_REQUIRE_CUDA", ""))
    return version_tuple(m.group(1)) if m else None

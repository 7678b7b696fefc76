"""NVIDIA architectures: compute capability -> build flags, and the traps.

Pure functions and tables; GPU discovery lives in gpus.py.
"""

from __future__ import annotations

from dataclasses import dataclass

# Compute capability -> (generation, example GPUs). Volta 7.0 to Blackwell 12.0.
GENERATIONS: dict[str, tuple[str, str]] = {
    "7.0": ("Volta", "V100"),
    "7.2": ("Volta", "Jetson AGX Xavier"),
    "7.5": ("Turing", "T4, RTX 20xx"),
    "8.0": ("Ampere", "A100, A30"),
    "8.6": ("Ampere", "A10, A40, RTX 30xx"),
    "8.7": ("Ampere", "Jetson Orin"),
    "8.9": ("Ada Lovelace", "L4, L40, RTX 40xx"),
    "9.0": ("Hopper", "H100, H200, GH200"),
    "10.0": ("Blackwell", "B200, GB200"),
    "10.3": ("Blackwell", "B300, GB300"),
    "12.0": ("Blackwell", "RTX 50xx, RTX PRO 6000"),
    "12.1": ("Blackwell", "DGX Spark GB10"),
}

# Oldest CUDA toolkit that can compile for a capability.
MIN_CUDA_FOR_ARCH: dict[str, str] = {
    "7.0": "9.0",
    "7.2": "10.0",
    "7.5": "10.0",
    "8.0": "11.0",
    "8.6": "11.1",
    "8.7": "11.4",
    "8.9": "11.8",
    "9.0": "11.8",
    "10.0": "12.8",
    "10.3": "12.9",
    "12.0": "12.8",
    "12.1": "12.9",
}

# CUDA major.minor -> minimum Linux driver (NVIDIA's CUDA Toolkit release notes,
# table 3: "toolkit driver version", x86_64).
MIN_DRIVER_FOR_CUDA: dict[str, str] = {
    "11.0": "450.36.06",
    "11.1": "455.23",
    "11.2": "460.27.03",
    "11.3": "465.19.01",
    "11.4": "470.42.01",
    "11.5": "495.29.05",
    "11.6": "510.39.01",
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}


def _key(cap: str) -> tuple[int, int]:
    major, _, minor = cap.partition(".")
    return int(major), int(minor or 0)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def normalize(cap: str | tuple[int, int]) -> str:
    """'9.0', (9, 0), '90' or 'sm_90' -> '9.0'. Raises ValueError otherwise."""
    if isinstance(cap, tuple):
        major, minor = cap
    else:
        text = cap.strip().lower().removeprefix("sm_").removeprefix("compute_")
        text = text.removesuffix("+ptx")
        if "." in text:
            major_s, _, minor_s = text.partition(".")
        elif text.isdigit() and len(text) >= 2:
            major_s, minor_s = text[:-1], text[-1]
        else:
            raise ValueError(f"not a compute capability: {cap!r}")
        if not (major_s.isdigit() and minor_s.isdigit()):
            raise ValueError(f"not a compute capability: {cap!r}")
        major, minor = int(major_s), int(minor_s)
    result = f"{major}.{minor}"
    if _key(result) < (7, 0):
        raise ValueError(f"compute capability {result} is older than Volta (7.0): unsupported")
    return result


def sm(cap: str) -> str:
    """'9.0' -> 'sm_90'."""
    major, minor = _key(normalize(cap))
    return f"sm_{major}{minor}"


def torch_cuda_arch_list(capabilities) -> str:
    """TORCH_CUDA_ARCH_LIST for these GPUs: each capability once, +PTX on the highest.

    PTX of the highest lets a newer GPU JIT the code instead of failing with
    "no kernel image is available for execution on the device".
    """
    caps = sorted({normalize(c) for c in capabilities}, key=_key)
    if not caps:
        return ""
    return ";".join(caps[:-1] + [caps[-1] + "+PTX"])


def cuda_arch_flags(capabilities) -> dict[str, str]:
    """The variables builds read, all derived from the same capabilities."""
    caps = sorted({normalize(c) for c in capabilities}, key=_key)
    if not caps:
        return {}
    nums = [c.replace(".", "") for c in caps]
    gencode = [f"-gencode=arch=compute_{n},code=sm_{n}" for n in nums]
    gencode.append(f"-gencode=arch=compute_{nums[-1]},code=compute_{nums[-1]}")
    return {
        "TORCH_CUDA_ARCH_LIST": torch_cuda_arch_list(caps),
        # CMake >= 3.18 (CMAKE_CUDA_ARCHITECTURES): "90-real;90-virtual" style
        "CMAKE_CUDA_ARCHITECTURES": ";".join([f"{n}-real" for n in nums] + [f"{nums[-1]}-virtual"]),
        # flash-attn's setup.py reads this (semicolon or comma separated numbers)
        "FLASH_ATTN_CUDA_ARCHS": ";".join(nums),
        "NVCC_GENCODE": " ".join(gencode),
    }


def _tokens(arch_list) -> list[str]:
    if isinstance(arch_list, str):
        arch_list = arch_list.replace(",", ";").replace(" ", ";").split(";")
    return [t.strip() for t in arch_list if t and t.strip()]


def split_arch_list(arch_list) -> tuple[set[str], set[str]]:
    """(SASS capabilities, PTX capabilities) named by an arch list.

    Accepts TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX") or torch.cuda.get_arch_list()
    (["sm_80", "sm_90", "compute_90"]). Architectures older than Volta are dropped.
    """
    sass, ptx = set(), set()
    for token in _tokens(arch_list):
        try:
            cap = normalize(token)
        except ValueError:
            continue
        if token.lower().startswith("compute_"):
            ptx.add(cap)
        else:
            sass.add(cap)
            if token.upper().endswith("+PTX"):
                ptx.add(cap)
    return sass, ptx


def runs_on(cap: str, sass: set[str], ptx: set[str] = frozenset()) -> bool:
    """Can code with SASS for ``sass`` and PTX for ``ptx`` run on a GPU of ``cap``?

    SASS runs on the same major with an equal or higher minor; PTX of an equal
    or lower capability can be JIT-compiled by the driver.
    """
    major, minor = _key(normalize(cap))
    if any(_key(b)[0] == major and _key(b)[1] <= minor for b in sass):
        return True
    return any(_key(p) <= (major, minor) for p in ptx)


@dataclass(frozen=True)
class Finding:
    code: str
    message: str


def compatibility_warnings(
    gpu_caps, torch_arch_list=None, image_cuda: str | None = None, driver: str | None = None
) -> list[Finding]:
    """The traps: a GPU that torch was not built for, a CUDA newer than the driver."""
    out = []
    if torch_arch_list is not None:
        sass, ptx = split_arch_list(torch_arch_list)
        for cap in sorted({normalize(c) for c in gpu_caps}, key=_key):
            if not runs_on(cap, sass, ptx):
                built = ", ".join(sorted(map(sm, sass | ptx), key=lambda a: int(a[3:])))
                out.append(
                    Finding(
                        "torch-arch",
                        f"The image's torch is built for {built or 'no architecture'} and "
                        f"cannot run on this GPU ({sm(cap)}, {GENERATIONS.get(cap, ('?',))[0]}): "
                        "kernels would fail with 'no kernel image is available for execution "
                        "on the device'. Use a torch build that lists this architecture.",
                    )
                )
    if image_cuda and driver:
        need = min_driver(image_cuda)
        if need and _version(driver) < _version(need):
            out.append(
                Finding(
                    "driver-too-old",
                    f"The image's CUDA {image_cuda} needs NVIDIA driver {need} or newer; this "
                    f"host has {driver}. Upgrade the driver or use an image with an older CUDA.",
                )
            )
    return out


def min_driver(cuda: str) -> str | None:
    """Minimum driver for a CUDA version (major.minor; newest known minor not above it)."""
    want = _version(cuda)[:2]
    known = [c for c in MIN_DRIVER_FOR_CUDA if _version(c) <= want and _version(c)[0] == want[0]]
    if not known:
        return None
    return MIN_DRIVER_FOR_CUDA[max(known, key=_version)]

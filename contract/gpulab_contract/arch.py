"""NVIDIA GPU architectures: the one place gpulab keeps what it knows about them.

Compute capability -> SM name and generation, which CUDA can compile for which
architecture, the oldest driver for each CUDA, the build variables for a set of
GPUs (TORCH_CUDA_ARCH_LIST, CMake, flash-attn), whether code with given SASS
and PTX runs on a GPU, and how much memory one parallel compile job needs
(MAX_JOBS). Used by both sides: the hub's doctor and base image builds and the
magics in every project image (``%gpu_install``, ``%gpu_info``), which is why it
lives in the contract both install. Standard library only, pure functions and
tables; finding the GPUs lives elsewhere.

A capability is written "9.0" (major.minor); "90", "sm_90", "compute_90" and
(9, 0) are read too. Code is built for a *target*: a capability with NVIDIA's
variant suffix, if any: "9.0" (plain), "9.0a" (architecture-specific, sm_90a,
CUDA 12.0+) or "10.0f" (family-specific, sm_100f, CUDA 12.9+); "sm_90a",
"compute_100f", "100f" and "9.0a+PTX" are read too. Which GPUs each runs on:
:func:`target_runs_on`.
"""

from __future__ import annotations

GIB = 1024**3

# Compute capability -> (generation, example GPUs). Volta 7.0 to Blackwell 12.1.
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
OLDEST = "7.0"  # gpulab's builds target Volta and newer

# Oldest CUDA toolkit that can compile for a capability (and so the oldest CUDA
# build of torch that can carry it).
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

# Memory one parallel compile job (one nvcc or c++ process under ninja/make) may
# peak at, for MAX_JOBS. 4 GiB: a torch CUDA extension translation unit
# (pytorch3d, nvdiffrast, torchmcubes: ATen headers plus nvcc's cicc/ptxas for
# each target architecture) peaks at about 2-3 GiB: pytorch3d's maintainers
# answer failed builds with "the build is running out of memory, set MAX_JOBS"
# (facebookresearch/pytorch3d#801, #1958), and a pytorch3d build that was killed
# on 16 GiB with 20 cores went through with MAX_JOBS=6 (facebookresearch/fast3r#46).
# 4 GiB leaves room for a second architecture and for the notebook's own memory.
JOB_GIB = 4.0
# Packages whose jobs need more. flash-attn's setup.py sets MAX_JOBS from free
# memory itself: "each JOB peak memory cost is ~8-9GB when threads = 4"
# (NVCC_THREADS defaults to 4); xformers and vllm compile flash-attention's
# kernels among theirs.
PACKAGE_JOB_GIB: dict[str, float] = {"flash-attn": 9.0, "xformers": 9.0, "vllm": 9.0}


# Target variants (NVIDIA's suffixes of sm_XY / compute_XY).
PLAIN, ARCH_SPECIFIC, FAMILY_SPECIFIC = "", "a", "f"
VARIANT_WORDS = {
    PLAIN: "",
    ARCH_SPECIFIC: "architecture-specific",
    FAMILY_SPECIFIC: "family-specific",
}


def key(cap: str) -> tuple[int, int]:
    """'9.0' -> (9, 0), for sorting and comparing ('9.0a' -> (9, 0) too)."""
    major, _, minor = cap.rstrip(ARCH_SPECIFIC + FAMILY_SPECIFIC).partition(".")
    return int(major), int(minor or 0)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def from_number(number: int) -> str:
    """90 (as in sm_90) -> '9.0'; 120 -> '12.0'."""
    return f"{number // 10}.{number % 10}"


def normalize(cap: str | tuple[int, int]) -> str:
    """'9.0', (9, 0), '90', 'sm_90', 'compute_90' or '9.0+PTX' -> '9.0'.

    Raises ValueError for anything else.
    """
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
    if major < 1:
        raise ValueError(f"not a compute capability: {cap!r}")
    return f"{major}.{minor}"


def target(name: str | tuple[int, int]) -> str:
    """'sm_90a' -> '9.0a', 'compute_100f' -> '10.0f', '9.0+PTX' -> '9.0', (9, 0) -> '9.0'.

    Raises ValueError for anything else (one variant letter at most, 'a' or 'f').
    """
    if isinstance(name, tuple):
        return normalize(name)
    text = name.strip().lower().removesuffix("+ptx")
    variant = text[-1:] if text[-1:] in (ARCH_SPECIFIC, FAMILY_SPECIFIC) else PLAIN
    return normalize(text.removesuffix(variant) if variant else text) + variant


def split_target(t: str) -> tuple[str, str]:
    """'9.0a' -> ('9.0', 'a'); '9.0' -> ('9.0', '')."""
    t = target(t)
    variant = t[-1] if t[-1] in (ARCH_SPECIFIC, FAMILY_SPECIFIC) else PLAIN
    return t.removesuffix(variant) if variant else t, variant


def sm(cap: str) -> str:
    """'9.0' -> 'sm_90'; '9.0a' -> 'sm_90a'."""
    cap, variant = split_target(cap)
    major, minor = key(cap)
    return f"sm_{major}{minor}{variant}"


def compute(cap: str) -> str:
    """'9.0' -> 'compute_90'; '10.0f' -> 'compute_100f' (the PTX's name)."""
    return "compute_" + sm(cap).removeprefix("sm_")


def generation(cap: str) -> str:
    """'9.0' -> 'Hopper'; '' when unknown."""
    return GENERATIONS.get(cap, ("", ""))[0]


def min_cuda(cap: str) -> str | None:
    """The oldest CUDA that compiles for ``cap`` ('12.0' -> '12.8'), None if unknown."""
    return MIN_CUDA_FOR_ARCH.get(cap)


def min_driver(cuda: str) -> str | None:
    """Minimum driver for a CUDA version (major.minor; newest known minor not above it)."""
    want = _version(cuda)[:2]
    known = [c for c in MIN_DRIVER_FOR_CUDA if _version(c) <= want and _version(c)[0] == want[0]]
    if not known:
        return None
    return MIN_DRIVER_FOR_CUDA[max(known, key=_version)]


def _sorted(capabilities) -> list[str]:
    """The capabilities (variants dropped: build variables name plain ones), sorted."""
    return sorted({split_target(target(c))[0] for c in capabilities}, key=key)


def torch_cuda_arch_list(capabilities) -> str:
    """TORCH_CUDA_ARCH_LIST for these GPUs: each capability once, +PTX on the highest.

    PTX of the highest lets a newer GPU JIT the code instead of failing with
    "no kernel image is available for execution on the device".
    """
    caps = _sorted(capabilities)
    if not caps:
        return ""
    return ";".join(caps[:-1] + [caps[-1] + "+PTX"])


def build_env(capabilities) -> dict[str, str]:
    """The variables CUDA builds read, all from the same capabilities ({} for none)."""
    caps = _sorted(capabilities)
    if not caps:
        return {}
    nums = [c.replace(".", "") for c in caps]
    # CMake >= 3.18 style: SASS for each, PTX of the highest; CMake reads CUDAARCHS
    # from the environment, and projects pass CMAKE_CUDA_ARCHITECTURES on.
    cmake = ";".join([f"{n}-real" for n in nums] + [f"{nums[-1]}-virtual"])
    return {
        "TORCH_CUDA_ARCH_LIST": torch_cuda_arch_list(caps),
        "CMAKE_CUDA_ARCHITECTURES": cmake,
        "CUDAARCHS": cmake,
        # flash-attn's setup.py reads this (semicolon or comma separated numbers)
        "FLASH_ATTN_CUDA_ARCHS": ";".join(nums),
    }


def nvcc_gencode(capabilities) -> str:
    """nvcc -gencode flags for these GPUs (SASS for each, PTX of the highest)."""
    nums = [c.replace(".", "") for c in _sorted(capabilities)]
    if not nums:
        return ""
    flags = [f"-gencode=arch=compute_{n},code=sm_{n}" for n in nums]
    flags.append(f"-gencode=arch=compute_{nums[-1]},code=compute_{nums[-1]}")
    return " ".join(flags)


def split_arch_list(arch_list) -> tuple[set[str], set[str]]:
    """(SASS targets, PTX targets) named by an arch list.

    Accepts TORCH_CUDA_ARCH_LIST ("8.0;9.0a;10.0f+PTX") or torch.cuda.get_arch_list()
    (["sm_80", "sm_90a", "compute_90"]); variants are kept ("9.0a", "10.0f").
    Architectures older than Volta are dropped.
    """
    if isinstance(arch_list, str):
        arch_list = arch_list.replace(",", ";").replace(" ", ";").split(";")
    sass, ptx = set(), set()
    for token in (t.strip() for t in arch_list if t and t.strip()):
        try:
            t = target(token)
        except ValueError:
            continue
        if key(t) < key(OLDEST):
            continue
        if token.lower().startswith("compute_"):
            ptx.add(t)
        else:
            sass.add(t)
            if token.upper().endswith("+PTX"):
                ptx.add(t)
    return sass, ptx


def target_runs_on(cap: str, t: str, *, is_ptx: bool = False) -> bool:
    """Does code built for target ``t`` (SASS, or PTX with ``is_ptx``) run on a GPU of ``cap``?

    NVIDIA's rules (CUDA Programming Guide, "Binary Compatibility" and "PTX
    Compatibility"; CUDA 12.9's family-specific features):

    - plain SASS sm_XY runs on compute capability X.Z with Z >= Y (same major);
    - 'a' (architecture-specific, sm_90a) SASS and PTX run on X.Y only: the
      driver never JIT-compiles compute_90a PTX for another GPU;
    - 'f' (family-specific, sm_100f) SASS and PTX run on the family: X.Z with
      Z >= Y (sm_100f on 10.0 and 10.3, not on 11.x or 12.x);
    - plain PTX compute_XY is JIT-compiled for any capability >= X.Y.
    """
    gpu = key(cap)
    base, variant = split_target(t)
    want = key(base)
    if variant == ARCH_SPECIFIC:
        return gpu == want
    if variant == FAMILY_SPECIFIC or not is_ptx:
        return gpu[0] == want[0] and gpu[1] >= want[1]
    return gpu >= want


def how_it_runs(cap: str, sass=frozenset(), ptx=frozenset()) -> str | None:
    """'native', 'ptx' or None: how code with ``sass`` and ``ptx`` targets runs on ``cap``.

    'native': SASS that runs there (:func:`target_runs_on`); 'ptx': PTX the driver
    compiles at load time (minutes on each first start); otherwise "no kernel image
    is available" (None).
    """
    if any(target_runs_on(cap, t) for t in sass):
        return "native"
    if any(target_runs_on(cap, t, is_ptx=True) for t in ptx):
        return "ptx"
    return None


def runs_on(cap: str, sass=frozenset(), ptx=frozenset()) -> bool:
    """Can code with SASS for ``sass`` and PTX for ``ptx`` (targets) run on a GPU of ``cap``?"""
    return how_it_runs(cap, sass, ptx) is not None


def job_gib(packages=()) -> float:
    """Memory (GiB) one compile job of these packages needs: the largest of them."""
    return max([JOB_GIB] + [PACKAGE_JOB_GIB.get(p, 0.0) for p in packages])


def max_jobs(memory: int | None, cpus: int, packages=()) -> int:
    """MAX_JOBS: no more jobs than CPUs, nor than ``memory`` bytes hold (None: unknown)."""
    if memory is None:
        return max(1, cpus)
    return max(1, min(cpus, int(memory // (job_gib(packages) * GIB))))

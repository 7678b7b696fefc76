"""Architecture-specific (sm_90a) and family-specific (sm_100f) GPU code: which GPUs it
runs on, read from arch lists, from cuobjdump's names and from the fat binary's own
fields (hand-made files, byte for byte as nvcc 13.0 writes them; real nvcc output is
checked on the GPU machine: tests/test_magics_cudabin.py)."""

from __future__ import annotations

import struct

import pytest

from gpulab_contract import arch
from gpulab_jupyter.magics import cudabin


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("sm_90a", "9.0a"),
        ("compute_90a", "9.0a"),
        ("sm_100f", "10.0f"),
        ("compute_120f", "12.0f"),
        ("9.0a+PTX", "9.0a"),
        ("10.0f", "10.0f"),
        ("100a", "10.0a"),
        ("sm_90", "9.0"),
        ((9, 0), "9.0"),
    ],
)
def test_targets_keep_their_variant(name, want):
    assert arch.target(name) == want
    assert arch.sm(want) == "sm_" + want.replace(".", "")
    assert arch.compute(want) == "compute_" + want.replace(".", "")


@pytest.mark.parametrize("bad", ["sm_90b", "sm_90af", "hopper", "a", "sm_f", "9.0x"])
def test_other_names_are_not_targets(bad):
    with pytest.raises(ValueError):
        arch.target(bad)


GPUS = ["8.0", "8.6", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1"]
# target, is PTX -> the GPUs (of GPUS) it runs on, by NVIDIA's rules
RULES = [
    ("9.0", False, {"9.0"}),  # plain SASS: same major, minor >= 0
    ("8.0", False, {"8.0", "8.6"}),
    ("9.0a", False, {"9.0"}),  # 'a' SASS: that capability only
    ("10.0a", False, {"10.0"}),  # not 10.3
    ("10.0f", False, {"10.0", "10.3"}),  # 'f' SASS: the family
    ("10.3f", False, {"10.3"}),
    ("12.0f", False, {"12.0", "12.1"}),
    ("8.0", True, {"8.0", "8.6", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1"}),  # plain PTX
    ("9.0", True, {"9.0", "10.0", "10.3", "11.0", "12.0", "12.1"}),
    ("9.0a", True, {"9.0"}),  # 'a' PTX is not JIT-compiled for a newer GPU
    ("10.0a", True, {"10.0"}),
    ("10.0f", True, {"10.0", "10.3"}),  # 'f' PTX: the family, not 12.x
]


@pytest.mark.parametrize(("t", "is_ptx", "where"), RULES)
def test_each_variant_runs_where_nvidia_says(t, is_ptx, where):
    assert {g for g in GPUS if arch.target_runs_on(g, t, is_ptx=is_ptx)} == where
    sass, ptx = (set(), {t}) if is_ptx else ({t}, set())
    assert {g for g in GPUS if arch.runs_on(g, sass, ptx)} == where


def test_arch_lists_with_variants():
    sass, ptx = arch.split_arch_list(["sm_80", "sm_90a", "sm_100f", "compute_90a"])
    assert (sass, ptx) == ({"8.0", "9.0a", "10.0f"}, {"9.0a"})
    assert arch.split_arch_list("8.0;9.0a;10.0f+PTX") == ({"8.0", "9.0a", "10.0f"}, {"10.0f"})
    # torch built for sm_90a only: an H100 runs it, a B200 does not (the old check said yes)
    assert arch.how_it_runs("9.0", {"9.0a"}, {"9.0a"}) == "native"
    assert arch.how_it_runs("10.0", {"9.0a"}, {"9.0a"}) is None
    assert arch.how_it_runs("10.0", {"9.0a"}, {"9.0"}) == "ptx"
    # build variables name plain capabilities
    assert arch.build_env(["9.0a", "10.0f"])["TORCH_CUDA_ARCH_LIST"] == "9.0;10.0+PTX"


# --- hand-made fat binaries ---------------------------------------------------------

PTX, ELF = 1, 2
FLAG_64BIT_LINUX = 0x11  # what nvcc sets on every entry
COMPRESSED = 0x8000


def cubin(abi: int, e_flags: int) -> bytes:
    """The first bytes of a cubin: its ELF header (EM_CUDA, ABI version, e_flags)."""
    head = bytearray(64)
    head[:4] = b"\x7fELF"
    head[4], head[5], head[6], head[7], head[8] = 2, 1, 1, 0x41, abi
    struct.pack_into("<HHI", head, 16, 2, 190, 1)
    struct.pack_into("<I", head, 48, e_flags)
    return bytes(head) + b"\0" * 64


def entry(kind: int, number: int, flags: int, payload: bytes, header: int = 64) -> bytes:
    """One fat binary entry: kind, header size, payload size, SM number at 28, flags at 40."""
    h = bytearray(header)
    struct.pack_into("<HHIQ", h, 0, kind, 0x0101, header, len(payload))
    struct.pack_into("<HH", h, 24, 8, 1)  # code version 1.8
    struct.pack_into("<I", h, 28, number)
    struct.pack_into("<Q", h, 40, flags)
    return bytes(h) + payload


def elf_with_fatbin(*entries: bytes) -> bytes:
    """A 64-bit ELF file whose .nv_fatbin section holds one container of ``entries``."""
    body = b"".join(entries)
    fatbin = b"\x50\xed\x55\xba" + struct.pack("<HHQ", 1, 16, len(body)) + body
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    names_off = data_off + len(fatbin)
    shoff = (names_off + len(names) + 7) // 8 * 8
    head = bytearray(64)
    head[:4] = b"\x7fELF"
    head[4], head[5], head[6] = 2, 1, 1
    struct.pack_into("<HHI", head, 16, 3, 62, 1)
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, 3, 1)

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    sections = section(0, 0, 0, 0) + section(1, 3, names_off, len(names))
    sections += section(11, 1, data_off, len(fatbin))
    out = bytes(head) + fatbin + names
    return out + b"\0" * (shoff - len(out)) + sections


# nvcc 13.0's entries (flags: bit 20 'a', bit 21 'f'; sm_100+ cubins also set bit 24;
# compressed PTX bit 15). Cubins of CUDA 13 are ELF ABI 8 and do not mark 'a' in e_flags.
NVCC13 = {
    "sm_90": entry(ELF, 90, 0x11, cubin(8, 0x6005A04)),
    "sm_90a": entry(ELF, 90, 0x100011, cubin(8, 0x6005A04)),
    "sm_100": entry(ELF, 100, 0x1000011, cubin(8, 0x6006402), header=112),
    "sm_100a": entry(ELF, 100, 0x1100011, cubin(8, 0x6006402), header=112),
    "sm_100f": entry(ELF, 100, 0x1200011, b"\x28\xb5\x2f\xfd" + b"\0" * 60, header=112),
    "compute_90": entry(PTX, 90, 0x11, b".version 9.0\n.target sm_90\n", header=80),
    "compute_90a": entry(PTX, 90, 0x108011, b"\x28\xb5\x2f\xfd" + b"\0" * 28, header=80),
    "compute_100f": entry(PTX, 100, 0x200011, b".version 9.0\n.target sm_100f\n", header=80),
    "compute_100a": entry(PTX, 100, 0x108011, b"\x28\xb5\x2f\xfd" + b"\0" * 28, header=80),
}


@pytest.mark.parametrize(
    ("names", "sass", "ptx", "runs_on", "not_on"),
    [
        (["sm_90"], {"9.0"}, set(), ["9.0"], ["10.0", "8.6"]),
        (["sm_90a"], {"9.0a"}, set(), ["9.0"], ["10.0"]),
        (["sm_100a"], {"10.0a"}, set(), ["10.0"], ["10.3", "12.0"]),
        (["sm_100f"], {"10.0f"}, set(), ["10.0", "10.3"], ["11.0", "12.0", "9.0"]),
        (["sm_100"], {"10.0"}, set(), ["10.0", "10.3"], ["12.0"]),
        (["compute_90a"], set(), {"9.0a"}, ["9.0"], ["10.0", "12.0"]),
        (["compute_100f"], set(), {"10.0f"}, ["10.0", "10.3"], ["12.0", "12.1"]),
        (["compute_100a"], set(), {"10.0a"}, ["10.0"], ["10.3"]),
        (["compute_90"], set(), {"9.0"}, ["9.0", "10.3", "12.1"], ["8.9"]),
        (["sm_90a", "compute_90"], {"9.0a"}, {"9.0"}, ["9.0", "12.0"], ["8.0"]),
    ],
)
def test_the_fat_binary_says_which_variant(tmp_path, names, sass, ptx, runs_on, not_on):
    so = tmp_path / "ext.so"
    so.write_bytes(elf_with_fatbin(*(NVCC13[n] for n in names)))
    code = cudabin.parse_elf(str(so))
    assert (code.sass, code.ptx) == (sass, ptx)
    assert [c for c in runs_on if code.runs_on(c)] == runs_on
    assert [c for c in not_on if code.runs_on(c)] == []


def test_an_uncompressed_cuda_12_cubin_marks_sm_90a_in_its_e_flags(tmp_path):
    # ELF ABI 7 (CUDA 12): SM in the low byte, EF_CUDA_ACCELERATORS_V1 = 0x800
    so = tmp_path / "ext.so"
    so.write_bytes(
        elf_with_fatbin(
            entry(ELF, 90, 0x11, cubin(7, 0x5A | 0x400 | 0x800)),
            entry(ELF, 80, 0x11, cubin(7, 0x50 | 0x400)),
        )  # fmt: skip
    )
    code = cudabin.parse_elf(str(so))
    assert code.sass == {"9.0a", "8.0"}
    assert code.describe() == "sm_80, sm_90a"
    assert not code.runs_on("10.0") and code.runs_on("8.6") and code.runs_on("9.0")


def test_describe_names_targets_as_nvcc_does():
    code = cudabin.CudaCode(sass={"9.0", "9.0a", "10.0f"}, ptx={"10.0f", "8.0"})
    assert code.describe() == "sm_90, sm_90a, sm_100f, PTX compute_80, PTX compute_100f"


# cuobjdump 13.0's listings of the same builds (an 'f' cubin is named plain sm_100:
# its code and its rule are those of sm_100; its PTX keeps the suffix).
LISTINGS = {
    "--list-elf": "ELF file    1: ext.1.sm_90a.cubin\nELF file    2: ext.2.sm_100.cubin\n",
    "--list-ptx": "PTX file    1: ext.1.sm_100f.ptx\nPTX file    2: ext.2.sm_90a.ptx\n",
}


def test_cuobjdump_names_with_variants(tmp_path):
    tool = tmp_path / "cuobjdump"
    tool.write_text(
        '#!/bin/sh\ncase "$1" in\n'
        + "".join(f"  {flag}) printf '%s' '{text}';;\n" for flag, text in LISTINGS.items())
        + "esac\n"
    )
    tool.chmod(0o755)
    code = cudabin.parse_cuobjdump(str(tool), str(tmp_path / "ext.so"))
    assert (code.sass, code.ptx) == ({"9.0a", "10.0"}, {"10.0f", "9.0a"})
    assert code.runs_on("9.0") and code.runs_on("10.3")
    assert not code.runs_on("12.0")  # compute_100f PTX is not JIT-compiled for 12.0
    assert code.describe() == "sm_90a, sm_100, PTX compute_90a, PTX compute_100f"

"""Which GPU architectures a compiled file carries: SASS (cubins) and PTX.

With ``cuobjdump`` on PATH its ``--list-elf`` / ``--list-ptx`` answer; without
it, the ELF file's ``.nv_fatbin`` / ``__nv_relfatbin`` sections are read
directly (fat binary containers: magic 0xBA55ED50, then entries of kind 1 =
PTX or 2 = ELF cubin, each naming its SM architecture).

Architecture-specific (sm_90a) and family-specific (sm_100f) code runs on fewer
GPUs than plain code (:func:`gpulab_contract.arch.target_runs_on`), so the variant
is read too: from cuobjdump's names (``x.1.sm_90a.cubin``, ``x.1.sm_100f.ptx``),
and from the fat binary entry's flags (bit 20: 'a', bit 21: 'f', as nvcc 13.0
writes them, compressed or not) or, for an uncompressed cubin, its ELF e_flags
(EF_CUDA_ACCELERATORS: 0x800 in CUDA's ELF ABI 7, 0x8 in ABI 8, as LLVM's
BinaryFormat/ELF.h defines them).
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass, field

from gpulab_contract import arch

FATBIN_MAGIC = b"\x50\xed\x55\xba"  # 0xBA55ED50, little endian
FATBIN_SECTIONS = (b".nv_fatbin", b"__nv_relfatbin")
_CUOBJDUMP_ARCH = re.compile(r"\.(sm|compute)_(\d+)([af]?)\.(cubin|ptx)")
# Fat binary entry: flags (u64 at offset 40) that mark the target's variant.
ENTRY_FLAGS_OFFSET = 40
ENTRY_ARCH_SPECIFIC = 1 << 20
ENTRY_FAMILY_SPECIFIC = 1 << 21
# A cubin's ELF header: EI_ABIVERSION (byte 8) and e_flags (u32 at 48).
ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
EF_CUDA_ACCELERATORS_V1 = 0x800  # ELF ABI version 7 (CUDA 12)
EF_CUDA_ACCELERATORS_V2 = 0x8  # ELF ABI version 8 (CUDA 13)


@dataclass
class CudaCode:
    """Architectures in one file, as capabilities ("9.0")."""

    sass: set[str] = field(default_factory=set)
    ptx: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.sass or self.ptx)

    def describe(self) -> str:
        """'sm_80, sm_90a, PTX compute_100f': the targets, as nvcc names them."""

        def order(t: str):
            return arch.key(t), t

        parts = [arch.sm(c) for c in sorted(self.sass, key=order)]
        parts += [f"PTX {arch.compute(c)}" for c in sorted(self.ptx, key=order)]
        return ", ".join(parts) or "no GPU code"

    def runs_on(self, cap: str) -> bool:
        """Does this code run on a GPU of ``cap`` (:func:`gpulab_contract.arch.runs_on`)?"""
        return arch.runs_on(cap, self.sass, self.ptx)


def _sections(data) -> list[tuple[int, int]]:
    """(offset, size) of the fat binary sections of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not shoff or shentsize < 64 or shstrndx >= shnum:
        return []
    if shoff + shnum * shentsize > len(data):
        return []

    def header(i):
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)

    str_off = header(shstrndx)[4]
    found = []
    for i in range(shnum):
        name_off, sh_type, _, _, offset, size = header(i)
        end = data.find(b"\0", str_off + name_off)
        name = bytes(data[str_off + name_off : end])
        if name in FATBIN_SECTIONS and sh_type != 8:  # 8 = SHT_NOBITS
            found.append((offset, size))
    return found


def _entries(data, start: int, end: int, code: CudaCode) -> None:
    """Walk the fat binary containers in data[start:end]."""
    pos = data.find(FATBIN_MAGIC, start, end)
    while pos != -1 and pos + 16 <= end:
        (header_size,) = struct.unpack_from("<H", data, pos + 6)
        (fat_size,) = struct.unpack_from("<Q", data, pos + 8)
        entry, stop = pos + header_size, min(end, pos + header_size + fat_size)
        while entry + 32 <= stop:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (number,) = struct.unpack_from("<I", data, entry + 28)
            if entry_header < 32:
                break
            if number >= 10:
                variant = _entry_variant(data, entry, entry_header, kind)
                (code.ptx if kind == 1 else code.sass).add(arch.from_number(number) + variant)
            entry += entry_header + payload
        pos = data.find(FATBIN_MAGIC, max(stop, pos + 16), end)


def _entry_variant(data, entry: int, entry_header: int, kind: int) -> str:
    """'a', 'f' or '' for the fat binary entry at ``entry``."""
    if entry_header >= ENTRY_FLAGS_OFFSET + 8:
        (flags,) = struct.unpack_from("<Q", data, entry + ENTRY_FLAGS_OFFSET)
        if flags & ENTRY_ARCH_SPECIFIC:
            return arch.ARCH_SPECIFIC
        if flags & ENTRY_FAMILY_SPECIFIC:
            return arch.FAMILY_SPECIFIC
    cubin = entry + entry_header
    if kind == 2 and cubin + 52 <= len(data) and data[cubin : cubin + 4] == ELF_MAGIC:
        (machine,) = struct.unpack_from("<H", data, cubin + 18)
        (e_flags,) = struct.unpack_from("<I", data, cubin + 48)
        accelerators = EF_CUDA_ACCELERATORS_V1 if data[cubin + 8] < 8 else EF_CUDA_ACCELERATORS_V2
        if machine == EM_CUDA and e_flags & accelerators:
            return arch.ARCH_SPECIFIC
    return arch.PLAIN


def parse_elf(path: str) -> CudaCode:
    """Architectures from the file's fat binary sections (no tools needed)."""
    code = CudaCode()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 64:
            return code
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for offset, size in _sections(data):
                _entries(data, offset, min(len(data), offset + size), code)
    return code


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidate = os.path.join(home, "bin", "cuobjdump")
    return candidate if os.access(candidate, os.X_OK) else None


def parse_cuobjdump(tool: str, path: str) -> CudaCode | None:
    code = CudaCode()
    for flag in ("--list-elf", "--list-ptx"):
        try:
            done = subprocess.run([tool, flag, path], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 and "does not contain" not in done.stderr:
            return None
        for _kind, number, variant, _ in _CUOBJDUMP_ARCH.findall(done.stdout):
            if int(number) >= 10:
                t = arch.from_number(int(number)) + variant
                (code.ptx if flag == "--list-ptx" else code.sass).add(t)
    return code


def cuda_code(path: str) -> CudaCode:
    """SASS and PTX architectures of one shared object (empty: no CUDA code)."""
    tool = cuobjdump()
    if tool:
        code = parse_cuobjdump(tool, path)
        if code is not None:
            return code
    try:
        return parse_elf(path)
    except (OSError, ValueError, struct.error):
        return CudaCode()

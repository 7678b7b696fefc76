"""gpulab's NVML binding: the few NVML calls gpulab makes, through ctypes.

Both sides reach NVML through it and only through it: the hub's GPU inventory,
utilisation meter and doctor (``gpulab_hub.gpus.nvml``), and in a project's
container the GPU status sampler, ``%gpu_info``/``%gpu_install`` and jobs
(``gpulab_jupyter.nvml``).

Why not ``pynvml`` (nvidia-ml-py)? Importing it costs a server about 2.5 MiB
of RSS (it defines every NVML structure and function), and NVML's own library
already takes 18-19 MiB once initialised; the user-side extension's budget is
20 MiB in all (see benchmarks/gpu_status.py). gpulab needs about twenty-five
calls, bound here with pynvml's names, signatures and return types, so
``gpulab_jupyter.devices`` works with either (the GPU tests check both agree).

Standard library only. Nothing is loaded at import: :meth:`Nvml.load` opens
``libnvidia-ml.so.1`` and initialises NVML, on the caller's thread.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_char_p, c_int, c_uint, c_ulonglong, c_void_p
from types import SimpleNamespace

SONAME = "libnvidia-ml.so.1"  # the driver's NVML library, as every NVML user opens it
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long
TEXT_BUFFER = 96  # >= NVML_DEVICE_NAME_V2_BUFFER_SIZE, _UUID_V2_, SYSTEM_DRIVER_VERSION_


class NVMLError(Exception):
    """An NVML call failed; ``value`` is NVML's return code."""

    def __init__(self, value: int, text: str = ""):
        super().__init__(text or f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    pass


_ERRORS = {
    NVML_ERROR_NOT_SUPPORTED: NVMLError_NotSupported,
    NVML_ERROR_DRIVER_NOT_LOADED: NVMLError_DriverNotLoaded,
    NVML_ERROR_LIBRARY_NOT_FOUND: NVMLError_LibraryNotFound,
}


def cuda_version(value: int) -> str:
    """The newest CUDA a driver supports, as ``nvmlSystemGetCudaDriverVersion`` numbers it
    (12040), written as CUDA writes it ("12.4"; a revision only where there is one)."""
    major, minor, revision = value // 1000, value % 1000 // 10, value % 10
    return f"{major}.{minor}" + (f".{revision}" if revision else "")


class _Memory(ctypes.Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_v2_t, also what the _v3 calls fill
    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class Nvml:
    """An initialised NVML, with pynvml's names for the calls gpulab makes."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, lib):
        self._lib = lib

    @classmethod
    def load(cls, name: str = SONAME) -> Nvml:
        """Open the driver's NVML library and initialise it (NVMLError if either fails)."""
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise NVMLError_LibraryNotFound(NVML_ERROR_LIBRARY_NOT_FOUND, str(e)) from e
        nvml = cls(lib)
        nvml._check(nvml._fn("nvmlInit_v2")())
        return nvml

    # -- plumbing ------------------------------------------------------------------------------
    def _fn(self, name: str):
        try:
            return getattr(self._lib, name)
        except AttributeError as e:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND, f"{name} not in this driver") from e

    def _check(self, ret: int) -> None:
        if ret != NVML_SUCCESS:
            describe = self._fn("nvmlErrorString")
            describe.restype = c_char_p
            text = (describe(ret) or b"").decode(errors="replace")
            raise _ERRORS.get(ret, NVMLError)(ret, text)

    def _call(self, name: str, *args) -> None:
        self._check(self._fn(name)(*args))

    def _uint(self, name: str, *args) -> int:
        out = c_uint()
        self._call(name, *args, byref(out))
        return out.value

    def _text(self, name: str, *args) -> str:
        buf = ctypes.create_string_buffer(TEXT_BUFFER)
        self._call(name, *args, buf, c_uint(TEXT_BUFFER))
        return buf.value.decode(errors="replace")

    def _handle(self, name: str, *args) -> c_void_p:
        handle = c_void_p()
        self._call(name, *args, byref(handle))
        return handle

    # -- pynvml's names --------------------------------------------------------------------------
    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._text("nvmlSystemGetDriverVersion")

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        out = c_int()
        self._call("nvmlSystemGetCudaDriverVersion_v2", byref(out))
        return out.value  # 12040 for CUDA 12.4 (cuda_version() writes it so)

    def nvmlDeviceGetCount(self) -> int:
        return self._uint("nvmlDeviceGetCount_v2")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> c_void_p:
        return self._handle("nvmlDeviceGetHandleByIndex_v2", c_uint(index))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index: int) -> c_void_p:
        return self._handle("nvmlDeviceGetMigDeviceHandleByIndex", handle, c_uint(index))

    def nvmlDeviceGetUUID(self, handle) -> str:
        return self._text("nvmlDeviceGetUUID", handle)

    def nvmlDeviceGetName(self, handle) -> str:
        return self._text("nvmlDeviceGetName", handle)

    def nvmlDeviceGetCudaComputeCapability(self, handle) -> tuple[int, int]:
        major, minor = c_int(), c_int()
        self._call("nvmlDeviceGetCudaComputeCapability", handle, byref(major), byref(minor))
        return major.value, minor.value

    def nvmlDeviceGetMinorNumber(self, handle) -> int:
        return self._uint("nvmlDeviceGetMinorNumber", handle)

    def nvmlDeviceGetMigMode(self, handle) -> tuple[int, int]:
        current, pending = c_uint(), c_uint()
        self._call("nvmlDeviceGetMigMode", handle, byref(current), byref(pending))
        return current.value, pending.value

    def nvmlDeviceGetMaxMigDeviceCount(self, handle) -> int:
        return self._uint("nvmlDeviceGetMaxMigDeviceCount", handle)

    def nvmlDeviceGetMemoryInfo(self, handle) -> _Memory:
        mem = _Memory()
        self._call("nvmlDeviceGetMemoryInfo", handle, byref(mem))
        return mem

    def nvmlDeviceGetUtilizationRates(self, handle) -> _Utilization:
        util = _Utilization()
        self._call("nvmlDeviceGetUtilizationRates", handle, byref(util))
        return util

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:
        return self._uint("nvmlDeviceGetEnforcedPowerLimit", handle)  # mW

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        return self._uint("nvmlDeviceGetPowerUsage", handle)  # mW

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:
        return self._uint("nvmlDeviceGetTemperature", handle, c_int(sensor))  # °C

    def nvmlDeviceGetPcieThroughput(self, handle, counter: int) -> int:
        return self._uint("nvmlDeviceGetPcieThroughput", handle, c_int(counter))  # KB/s

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        out = c_ulonglong()
        self._call("nvmlDeviceGetTotalEnergyConsumption", handle, byref(out))
        return out.value  # mJ

    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list[SimpleNamespace]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle) -> list[SimpleNamespace]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)

    def _processes(self, name: str, handle) -> list[SimpleNamespace]:
        fn, count = self._fn(name), c_uint(0)
        ret = fn(handle, byref(count), None)
        if ret == NVML_SUCCESS:
            return []
        if ret != NVML_ERROR_INSUFFICIENT_SIZE:
            self._check(ret)
        count.value = count.value * 2 + 5  # room for processes started meanwhile
        rows = (_ProcessInfo * count.value)()
        self._check(fn(handle, byref(count), rows))
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=None if p.usedGpuMemory == NOT_AVAILABLE else p.usedGpuMemory,
            )
            for p in rows[: count.value]
        ]

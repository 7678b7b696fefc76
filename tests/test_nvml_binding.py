"""The sampler's lean NVML binding where there is no NVIDIA driver (CI's case).

On a GPU host, tests/test_lab_extension_gpu.py checks it against nvidia-ml-py.
"""

from __future__ import annotations

import ctypes.util

import pytest

from gpulab_jupyter.nvml import Nvml, NVMLError, NVMLError_LibraryNotFound


def test_a_missing_driver_library_is_library_not_found():
    with pytest.raises(NVMLError_LibraryNotFound) as e:
        Nvml.load("libnvidia-ml-gpulab-absent.so.1")
    assert e.value.value == 12 and "libnvidia-ml-gpulab-absent" in str(e.value)


def test_a_library_without_nvml_says_which_call_is_missing():
    libc = ctypes.util.find_library("c")
    with pytest.raises(NVMLError) as e:
        Nvml.load(libc)
    assert "nvmlErrorString" in str(e.value) or "nvmlInit_v2" in str(e.value)


def test_importing_loads_nothing():
    import gpulab_jupyter.nvml as nvml

    assert not any(isinstance(v, ctypes.CDLL) for v in vars(nvml).values())

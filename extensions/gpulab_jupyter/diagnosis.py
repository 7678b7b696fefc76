"""Why this container has no GPU, and what its user can do about it.

One diagnosis for everything that tells a user there is no GPU: the GPU panel
and status bar (through the sampler's status, ``reason``, ``message`` and
``hint``) and ``%gpu_info`` (:func:`why_no_gpu`). It is made from what this
container can see (``NVIDIA_VISIBLE_DEVICES``, whether NVML loads) and one fact
from gpulab's hub: ``GPULAB_HOST_GPUS``, which gpulab's base images set to the
NVIDIA GPUs the hub found on its host when it built them ("" when it found
none). Outside gpulab that variable is unset, and the words say what to do in a
plain JupyterLab or Docker container instead.

Pure functions of the environment and of what NVML said; nothing is loaded at
import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .devices import NO_GPU_VALUES

HOST_GPUS = "GPULAB_HOST_GPUS"

# Why NVML gave no answer: its library is missing, or the kernel driver is not loaded.
NO_LIBRARY, NOT_LOADED = "no_library", "not_loaded"

START_WITH_A_GPU = (
    "Stop the project and start it again with a GPU: on its start page, choose 1 or more "
    "under \u201cGPUs for this project\u201d."
)
NO_GPU_HOST_HINT = (
    "Your code runs on the CPU. For a GPU, whoever runs gpulab needs a host with an NVIDIA "
    "GPU and driver (\u201cgpulab doctor\u201d on the host says what is missing)."
)
PLAIN_HINT = (
    "Your code runs on the CPU. On your own machine, install the NVIDIA driver; for a "
    "container, start it with GPU support (Docker: --gpus all)."
)
ASK_ADMIN_HINT = (
    "Restart the project; if this stays, tell whoever runs gpulab "
    "(\u201cgpulab doctor\u201d checks that containers can use the GPUs)."
)


@dataclass(frozen=True)
class NoGpu:
    """Why there is no GPU here: ``reason`` (a word for programs: ``no_driver``,
    ``none_allocated``, ``nvml_error``, ``sampler_error``), ``message`` (what is the
    case) and ``hint`` (what to do), in words for the user."""

    reason: str
    message: str
    hint: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def host_gpus(environ) -> str | None:
    """The NVIDIA GPUs of the gpulab host ("" for none); None outside gpulab."""
    value = environ.get(HOST_GPUS)
    return None if value is None else value.strip()


def given_none(environ) -> bool:
    """Whether the container was started with no GPU (``NVIDIA_VISIBLE_DEVICES=void``)."""
    visible = environ.get("NVIDIA_VISIBLE_DEVICES")
    return visible is not None and visible.strip().lower() in NO_GPU_VALUES


def no_gpu_given(environ) -> NoGpu:
    """The container was started without a GPU (NVML is not asked: it has none to show)."""
    host = host_gpus(environ)
    if host == "":
        return _no_gpu_host()
    if host:
        return NoGpu(
            "none_allocated",
            f"This project was started without a GPU. This host has GPUs ({host}).",
            START_WITH_A_GPU,
        )
    visible = environ.get("NVIDIA_VISIBLE_DEVICES")
    return NoGpu(
        "none_allocated",
        f"No GPU was given to this container (NVIDIA_VISIBLE_DEVICES={visible!r}).",
        "Start it again with a GPU (Docker: --gpus all).",
    )


def without_nvml(environ, why: str) -> NoGpu:
    """NVML did not load: ``why`` is NO_LIBRARY or NOT_LOADED."""
    if given_none(environ):
        return no_gpu_given(environ)
    host = host_gpus(environ)
    if host == "":
        return _no_gpu_host()
    if host:
        what = (
            "the NVIDIA kernel driver is not loaded on this host"
            if why == NOT_LOADED
            else "the NVIDIA driver's library (libnvidia-ml.so.1) is not in its container"
        )
        return NoGpu("nvml_error", f"This project was given a GPU, but {what}.", ASK_ADMIN_HINT)
    if why == NOT_LOADED:
        message = "The NVIDIA driver's library is here, but the kernel driver is not loaded."
    else:
        message = (
            "No NVIDIA driver here: the NVML library (libnvidia-ml.so.1) was not found. "
            "Either this machine has no NVIDIA driver, or this container was started "
            "without GPU support."
        )
    return NoGpu("no_driver", message, PLAIN_HINT)


def no_device(environ, message: str = "") -> NoGpu:
    """NVML works but lists no GPU of this container (``message``: which variables)."""
    if given_none(environ):
        return no_gpu_given(environ)
    hint = START_WITH_A_GPU if host_gpus(environ) is not None else "Start it again with a GPU."
    message = message or "The NVIDIA driver is here but lists no GPU that this container can open."
    return NoGpu("none_allocated", message, hint)


def nvml_failed(error: str) -> NoGpu:
    return NoGpu(
        "nvml_error",
        f"NVML failed: {error}",
        "The NVIDIA management library reported an error; gpulab tries again, less often "
        "while it fails. The server log has details.",
    )


def sampler_failed(error: str) -> NoGpu:
    return NoGpu(
        "sampler_error",
        f"The GPU sampler failed: {error}",
        "Reading the GPUs failed; gpulab tries again, less often while it fails. "
        "The server log has details.",
    )


def _no_gpu_host() -> NoGpu:
    return NoGpu(
        "no_driver",
        "This host has no NVIDIA driver: gpulab found no GPU on it, so no project here has one.",
        NO_GPU_HOST_HINT,
    )


def why_no_gpu(environ=None) -> NoGpu | None:
    """The diagnosis for this process: None if NVML lists a GPU of this container.

    For ``%gpu_info`` and other one-off questions (the sampler makes the same
    diagnosis from what its own NVML reads said).
    """
    import os

    from . import devices
    from .nvml import NVMLError, NVMLError_DriverNotLoaded, NVMLError_LibraryNotFound, opened

    environ = os.environ if environ is None else environ
    if given_none(environ):
        return no_gpu_given(environ)
    try:
        with opened() as nvml:
            found = devices.enumerate_devices(nvml)
    except NVMLError_LibraryNotFound:
        return without_nvml(environ, NO_LIBRARY)
    except NVMLError_DriverNotLoaded:
        return without_nvml(environ, NOT_LOADED)
    except NVMLError as e:
        return nvml_failed(str(e))
    sel = devices.select(found, environ.get("NVIDIA_VISIBLE_DEVICES"), None)
    return None if sel.devices else no_device(environ, sel.message)

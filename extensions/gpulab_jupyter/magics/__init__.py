"""gpulab's IPython magics: ``%gpu_install``, ``%gpu_info``, ``%gpu_diff``, ``%gpu_job``.

Load them in any IPython or Jupyter kernel with ``%load_ext gpulab_jupyter.magics``
(project images load them by themselves). Importing this package does nothing
else: no NVML, no environment reads; everything happens when a magic runs.
"""

from __future__ import annotations


def _usage_error(e: Exception):
    from IPython.core.error import UsageError

    return UsageError(str(e))


def _no_arguments(name: str, line: str) -> None:
    if line.strip():
        raise _usage_error(ValueError(f"{name} takes no arguments (got {line.strip()[:40]!r})."))


def gpu_install(line: str) -> None:
    """Install packages, verify them, and record them in the project's Dockerfile.

    See ``%gpu_install --help`` for the options.
    """
    from .dockerfile import DockerfileError
    from .install import InstallFailed
    from .install import gpu_install as run
    from .spec import SpecError

    try:
        run(line)
    except (SpecError, DockerfileError, InstallFailed) as e:
        raise _usage_error(e) from None


def gpu_info(line: str = "") -> None:
    """The GPUs this kernel sees (capability, bf16, memory), the driver, and torch's build."""
    from .info import gpu_info as run

    _no_arguments("%gpu_info", line)
    run(line)


def gpu_diff(line: str = "") -> None:
    """Packages installed here but not in the Dockerfile, and the reverse."""
    from .diff import gpu_diff as run
    from .dockerfile import DockerfileError
    from .install import project_dir

    _no_arguments("%gpu_diff", line)
    try:
        run(project_dir())
    except (DockerfileError, OSError) as e:
        raise _usage_error(e) from None


def gpu_job(line: str) -> None:
    """Run a script, notebook or any command as a job that outlives the browser:
    ``%gpu_job run train.py --epochs 3``, ``--gpus all`` for torchrun, ``%gpu_job run --
    accelerate launch train.py``; ``list``, ``logs [-f] ID``, ``stop ID``, ``rerun ID``."""
    from gpulab_jupyter.jobs.model import JobError

    from .job import gpu_job as run

    try:
        run(line)
    except JobError as e:
        raise _usage_error(e) from None


def load_ipython_extension(ipython) -> None:
    from .options import parser

    gpu_install.__doc__ = parser().format_help()
    for func in (gpu_install, gpu_info, gpu_diff, gpu_job):
        ipython.register_magic_function(func, magic_kind="line", magic_name=func.__name__)


def unload_ipython_extension(ipython) -> None:
    for name in ("gpu_install", "gpu_info", "gpu_diff", "gpu_job"):
        ipython.magics_manager.magics["line"].pop(name, None)

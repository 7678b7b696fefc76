"""gpulab's base images: the GPU variant (built for this hub's GPUs) and the
CPU-only variant, rendered from images/base-*.Dockerfile.j2 and built by
content hash."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpulab_contract import arch
from gpulab_hub import images

TEMPLATES = {"gpu": "base-gpu.Dockerfile.j2", "cpu": "base-cpu.Dockerfile.j2"}
JUPYTERLAB_VERSION = "4.6.6"
# What the base image is built FROM where the admin chose nothing: on a GPU host
# NVIDIA's CUDA image (nvcc and cuDNN for compiled extensions; torch brings its own
# CUDA libraries), without GPUs the Debian gpulab makes locally with debootstrap.
CUDA_FROM = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
LOCAL_FROM = "gpulab/debian:bookworm"


def default_from(gpu: bool) -> str:
    return CUDA_FROM if gpu else LOCAL_FROM


def _jupyterhub_version() -> str:
    import jupyterhub

    return jupyterhub.__version__


@dataclass(frozen=True)
class BaseSpec:
    """What a base image is made of. ``capabilities`` empty means the CPU variant."""

    base_image: str
    capabilities: tuple[str, ...] = ()
    gpu_names: tuple[str, ...] = ()
    arch_list: str = ""  # overrides the list computed from capabilities
    torch: str = ""  # pip requirement, or a wheel file to copy into the build
    system_site_packages: bool = False
    jupyterhub_version: str = field(default_factory=_jupyterhub_version)
    jupyterlab_version: str = JUPYTERLAB_VERSION

    @property
    def variant(self) -> str:
        return "gpu" if (self.capabilities or self.arch_list) else "cpu"


def arch_env(spec: BaseSpec) -> dict[str, str]:
    """Build variables for compiled CUDA code, from the override or the GPUs."""
    caps = arch.split_arch_list(spec.arch_list)[0] if spec.arch_list else spec.capabilities
    env = arch.build_env(caps)
    if spec.arch_list:
        env["TORCH_CUDA_ARCH_LIST"] = spec.arch_list
    if env:  # for Makefile builds in the image: nvcc $NVCC_GENCODE ...
        env["NVCC_GENCODE"] = arch.nvcc_gencode(caps)
    return env


def torch_requirement(spec: BaseSpec) -> tuple[str, dict[str, Path]]:
    """(what pip installs, files to add to the context) for the torch setting."""
    if not spec.torch:
        return "", {}
    path = Path(spec.torch)
    if path.suffix == ".whl" and path.exists():
        return f"/opt/gpulab/wheels/{path.name}", {f"wheels/{path.name}": path}
    return spec.torch, {}


def render(images_dir, spec: BaseSpec, wheel_names: list[str]) -> str:
    torch, _ = torch_requirement(spec)
    return images.render(
        images_dir,
        TEMPLATES[spec.variant],
        template_name=TEMPLATES[spec.variant],
        variant="GPU" if spec.variant == "gpu" else "CPU only",
        base_image=spec.base_image,
        wheels=sorted(f"wheels/{n}" for n in wheel_names),
        jupyterhub_version=spec.jupyterhub_version,
        jupyterlab_version=spec.jupyterlab_version,
        torch=torch,
        system_site_packages=spec.system_site_packages,
        arch_env=arch_env(spec),
        gpu_names=", ".join(spec.gpu_names) or "none found, list set by the admin",
        host_gpus=", ".join(spec.gpu_names),  # "" on a host without GPUs
    )


def ca_certificates(source_dir: str | Path) -> dict[str, bytes]:
    """Extra CA certificates (``*.crt``) to trust inside images, by file name."""
    src = Path(source_dir)
    if not src.is_dir():
        return {}
    return {f"ca-certificates/{p.name}": p.read_bytes() for p in sorted(src.glob("*.crt"))}


def context(images_dir, spec: BaseSpec, wheels: list[Path], ca_dir) -> dict[str, bytes]:
    """Files of the base image's build context (Dockerfile, wheels, CA certificates,
    the nvidia-smi stand-in)."""
    _, torch_files = torch_requirement(spec)
    files = {f"wheels/{w.name}": w.read_bytes() for w in wheels}
    files.update({name: p.read_bytes() for name, p in torch_files.items()})
    files.update(ca_certificates(ca_dir))
    files.setdefault("ca-certificates/.keep", b"")
    files["nvidia-smi.sh"] = (Path(images_dir) / "nvidia-smi.sh").read_bytes()  # stand-in
    files["Dockerfile"] = render(images_dir, spec, [w.name for w in wheels]).encode()
    return files


def ensure(
    docker_call, images_dir, spec, wheels, ca_dir, log_path, on_line, alias, *, network: str
) -> str:
    """Build the base image (if its content changed) on ``network`` and tag it ``alias``."""
    files = context(images_dir, spec, wheels, ca_dir)
    from_id = images.image_id(docker_call, spec.base_image) or spec.base_image
    repo, _, name = alias.rpartition(":")
    tag = images.content_tag(repo, from_id.encode(), *(files[k] for k in sorted(files)))
    if not images.image_id(docker_call, tag):
        images.build(
            docker_call,
            images.tar_context(files),
            tag,
            Path(log_path),
            on_line,
            timeout=3600,
            network=network,
            # gpulab's own template and wheels, built by the admin's `gpulab up`
            require_confined=False,
        )
    docker_call("tag", tag, repo, name)
    return tag

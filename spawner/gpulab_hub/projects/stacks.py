"""Starting points of a new project: a few packages its Dockerfile installs from the start.

The one list of them (the home page's choice, spawn option validation, the Dockerfile's
first rendering and the docs' table read it). A stack's lines are ordinary Dockerfile
lines: they sit right after FROM, before the %gpu_install managed block, and are the same
text in every project that chose that stack, so Docker's layer cache (parent image +
instruction text) builds them once per base image and every such project reuses the layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab_hub.settingvalues import INDEX_URL

DEFAULT = "minimal"


@dataclass(frozen=True)
class Stack:
    name: str  # the value of the spawn option 'stack'
    label: str  # the choice's words, and the Dockerfile comment's
    gives: str  # what the choice list says it gives
    requirements: tuple[str, ...] = ()  # pip requirements, pinned; torch: see TORCH
    imports: tuple[str, ...] = ()  # checked after the install, so a broken stack fails its build


# A requirement that the base image's PyTorch satisfies where the base has one (gpulab's
# GPU base carries a CUDA build), so pip keeps it and fetches nothing; pip fetches torch
# only for a base without it.
TORCH = "torch>=2"
TQDM = "tqdm==4.70.1"
# Where a base without torch gets a CPU build on a host without a GPU (PyPI's Linux
# torch is the CUDA build, several GB): PyTorch's own CPU index (GPULAB_CPU_TORCH_INDEX).
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_CHOICES = ("auto", "cpu", "cuda")  # GPULAB_STARTING_POINT_TORCH

STACKS: tuple[Stack, ...] = (
    Stack(
        "minimal",
        "Minimal",
        "The base image only: Python, JupyterLab, numpy, Pillow and requests"
        " (and PyTorch where the base image has it).",
    ),
    Stack(
        "data-science",
        "Data science",
        "pandas, matplotlib, scikit-learn and tqdm.",
        ("pandas==3.1.1", "matplotlib==3.11.2", "scikit-learn==1.9.1", TQDM),
        ("pandas", "matplotlib", "sklearn", "tqdm"),
    ),
    Stack(
        "pytorch",
        "PyTorch",
        "PyTorch and tqdm. PyTorch is the base image's own (built for this hub's GPUs);"
        " it is installed only where the base image has none.",
        (TORCH, TQDM),
        ("torch", "tqdm"),
    ),
    Stack(
        "huggingface",
        "Hugging Face",
        "transformers, datasets, accelerate and tqdm, on the base image's PyTorch.",
        (TORCH, "transformers==5.24.0", "datasets==5.2.0", "accelerate==1.15.0", TQDM),
        ("torch", "transformers", "datasets", "accelerate", "tqdm"),
    ),
)
BY_NAME = {s.name: s for s in STACKS}


class UnknownStack(ValueError):
    """A starting point gpulab does not offer."""


def get(name: str) -> Stack:
    """The stack named ``name`` (a full-string match of the list), or UnknownStack."""
    stack = BY_NAME.get(name) if isinstance(name, str) else None
    if stack is None:
        offered = ", ".join(f"{s.name!r} ({s.label})" for s in STACKS)
        raise UnknownStack(
            f"gpulab has no starting point {str(name)[:40]!r}; choose one of {offered}."
        )
    return stack


def torch_index(choice: str, host_has_gpu: bool, index: str = CPU_TORCH_INDEX) -> str:
    """The package index a torch stack's first line installs torch from ("" for none: pip's
    own, PyPI's CUDA build), for the admin's ``choice`` (auto, cpu, cuda) on this host."""
    if choice not in TORCH_CHOICES:
        raise ValueError(f"the starting points' torch must be auto, cpu or cuda, not {choice!r}")
    if not INDEX_URL.fullmatch(index):
        raise ValueError(f"the CPU torch index must be an http(s) URL, not {index[:80]!r}")
    cpu = choice == "cpu" or (choice == "auto" and not host_has_gpu)
    return index if cpu else ""


def lines(name: str, cpu_torch_index: str = "") -> str:
    """The Dockerfile lines of the stack ``name`` ("" for minimal), each ending in a
    newline, followed by one empty line. With ``cpu_torch_index`` (torch_index) a stack
    with torch first installs it from that index, in a line of its own: the same text in
    the PyTorch and the Hugging Face stacks, so both reuse one layer."""
    stack = get(name)
    if not stack.requirements:
        return ""
    out = [f"# Starting point: {stack.label}. Change or remove these lines freely."]
    if TORCH in stack.requirements and cpu_torch_index:
        out.append(
            "# This hub has no GPU: a CPU PyTorch, unless the base image has a PyTorch already."
        )
        out.append(
            f'RUN python -m pip install --no-cache-dir --index-url {cpu_torch_index} "{TORCH}"'
        )
    if TORCH in stack.requirements:
        out.append(
            f'# "{TORCH}" keeps the base image\'s PyTorch; pip fetches one only for a base'
            " without it."
        )
    out.append(
        "RUN python -m pip install --no-cache-dir "
        + " ".join(f'"{r}"' if ">" in r else r for r in stack.requirements)
        + " \\"
    )
    out.append(f' && python -c "import {", ".join(stack.imports)}"')
    return "\n".join(out) + "\n\n"

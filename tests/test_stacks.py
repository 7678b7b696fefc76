"""Starting points of a new project (projects/stacks in the hub): the whole Dockerfile a
new project gets for each, the spawn option that chooses one, and hadolint's view."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab_hub import images
from gpulab_hub.projects import options, stacks
from gpulab_jupyter.magics import dockerfile as df

REPO = Path(__file__).resolve().parents[1]
BASE = "gpulab/base:latest"


def render(stack: str | None, name: str = "My lab") -> str:
    params = {"base_image": BASE, "display_name": name}
    if stack is not None:
        params["stack_lines"] = options.stack_lines({"stack": stack})
    return images.render(REPO / "images", "project.Dockerfile.j2", **params)


HEADER = """\
# gpulab project "My lab": this Dockerfile describes the project's software.
# Each time the project starts, gpulab builds it, reusing every step that did not
# change, so an unchanged project starts in seconds. Edit it freely, then restart
# the project to apply your edits.
# The base image is the admin's choice: FROM may name only this hub's base images
# (or an earlier stage of this file). See "What a Dockerfile may name" in gpulab's
# docs (docs/projects.md).
FROM gpulab/base:latest

"""
TAIL = """\
# %gpu_install writes the packages it installs between the two lines below.
# >>> gpulab managed block: written by %gpu_install, do not edit by hand >>>
# <<< gpulab managed block <<<

# Your own lines go below; gpulab never rewrites them.
"""
TORCH_NOTE = (
    '# "torch>=2" keeps the base image\'s PyTorch; pip fetches one only for a base without it.\n'
)
WHOLE = {
    "minimal": HEADER + TAIL,
    "data-science": HEADER
    + "# Starting point: Data science. Change or remove these lines freely.\n"
    + "RUN python -m pip install --no-cache-dir pandas==3.1.1 matplotlib==3.11.2 "
    + "scikit-learn==1.9.1 tqdm==4.70.1 \\\n"
    + ' && python -c "import pandas, matplotlib, sklearn, tqdm"\n\n'
    + TAIL,
    "pytorch": HEADER
    + "# Starting point: PyTorch. Change or remove these lines freely.\n"
    + TORCH_NOTE
    + 'RUN python -m pip install --no-cache-dir "torch>=2" tqdm==4.70.1 \\\n'
    + ' && python -c "import torch, tqdm"\n\n'
    + TAIL,
    "huggingface": HEADER
    + "# Starting point: Hugging Face. Change or remove these lines freely.\n"
    + TORCH_NOTE
    + 'RUN python -m pip install --no-cache-dir "torch>=2" transformers==5.24.0 '
    + "datasets==5.2.0 accelerate==1.15.0 tqdm==4.70.1 \\\n"
    + ' && python -c "import torch, transformers, datasets, accelerate, tqdm"\n\n'
    + TAIL,
}


@pytest.mark.parametrize("stack", sorted(WHOLE))
def test_each_stack_renders_its_whole_dockerfile(stack):
    assert render(stack) == WHOLE[stack]


def test_no_stack_is_the_minimal_dockerfile():
    assert render(None) == render("minimal") == WHOLE["minimal"]
    assert options.stack_lines({}) == options.stack_lines(None) == ""


def test_the_list_offers_the_four_starting_points_in_order():
    assert [(s.name, s.label) for s in stacks.STACKS] == [
        ("minimal", "Minimal"),
        ("data-science", "Data science"),
        ("pytorch", "PyTorch"),
        ("huggingface", "Hugging Face"),
    ]


@pytest.mark.parametrize("stack", ["data-science", "pytorch", "huggingface"])
def test_stack_lines_are_the_same_in_every_project_and_come_before_the_managed_block(stack):
    """Docker's cache keys on the parent image and the instruction's text: the stack's
    RUN line follows FROM directly and carries nothing of the project, so every project
    on one base shares its layer; %gpu_install's lines come after it."""
    a, b = render(stack, "My lab"), render(stack, "Другой проект")
    instructions = [ln for ln in a.splitlines() if ln and not ln.startswith("#")]
    assert instructions[0] == f"FROM {BASE}"
    assert instructions[1].startswith("RUN python -m pip install --no-cache-dir ")
    assert a.split("\nFROM ", 1)[1] == b.split("\nFROM ", 1)[1]
    assert a.index("\nRUN ") < a.index(df.START_MARKER)
    # %gpu_install writes into the block below the stack and leaves the stack's line alone
    six = "RUN python -m pip install --no-cache-dir six==1.17.0 && python -c 'import six'"
    after = df.apply(a, [("six", six)])
    assert after.split(df.START_MARKER)[0] == a.split(df.START_MARKER)[0]
    assert df.managed_packages(after) == {"six": "six==1.17.0"}


@pytest.mark.parametrize("stack", ["pytorch", "huggingface"])
def test_torch_stacks_never_pin_a_torch_that_would_replace_the_bases(stack):
    reqs = stacks.get(stack).requirements
    torch = [r for r in reqs if r.startswith("torch")]
    assert torch == ["torch>=2"]  # satisfied by any PyTorch 2 the base carries
    text = render(stack)
    assert "torch==" not in text and "--upgrade" not in text and " -U " not in text


def test_every_other_requirement_is_pinned():
    for stack in stacks.STACKS:
        for req in stack.requirements:
            assert req == stacks.TORCH or "==" in req, req


@pytest.mark.parametrize(
    "bad",
    ["data science", "Data science", "data-science\n", " pytorch", "pytorch\nRUN x", "", "../x"],
)
def test_an_unknown_starting_point_is_refused_in_the_users_words(bad):
    with pytest.raises(options.OptionsError, match="gpulab has no starting point") as e:
        options.validate({"stack": bad})
    assert "'data-science' (Data science)" in str(e.value)
    with pytest.raises(options.OptionsError, match="no starting point"):
        options.stack_lines({"stack": bad})


def test_a_starting_point_must_be_a_string():
    with pytest.raises(options.OptionsError, match="'stack' must be a str"):
        options.validate({"stack": ["pytorch"]})


def test_the_form_keeps_the_starting_point_chosen_at_creation():
    class Orm:
        user_options = {"stack": "data-science"}

    class Spawner:
        orm_spawner = Orm()

    assert options.from_form({}, spawner=Spawner()) == {"stack": "data-science"}
    assert options.from_form({"stack": ["pytorch"]}, spawner=Spawner()) == {"stack": "pytorch"}
    assert options.from_form({}) == {}
    Orm.user_options = {"stack": "nope"}
    with pytest.raises(options.OptionsError, match="no starting point 'nope'"):
        options.from_form({}, spawner=Spawner())


@pytest.mark.parametrize("stack", sorted(WHOLE))
def test_each_stack_passes_hadolint(stack, tmp_path):
    hadolint = Path(sys.executable).with_name("hadolint")
    if not hadolint.exists():
        hadolint = Path(shutil.which("hadolint") or hadolint)
    path = tmp_path / "Dockerfile"
    path.write_text(render(stack))
    done = subprocess.run(
        [str(hadolint), "--no-color", "--ignore", "DL3007", str(path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_docs_table_says_what_each_stack_installs():
    text = (REPO / "docs" / "projects.md").read_text()
    section = text[text.index("## Starting points") : text.index("## A project's data")]
    for stack in stacks.STACKS:
        assert f"| {stack.label} |" in section, stack.label
        for req in stack.requirements:
            assert req in section, req
        run = stacks.lines(stack.name).split("RUN ", 1)[-1].replace(" \\\n", "")
        if stack.requirements:
            assert f"`RUN {run.strip()}`" in section, run


# --- the torch of the PyTorch and Hugging Face starting points ----------------------------


def test_a_host_without_a_gpu_gets_the_cpu_torch_unless_the_admin_says_cuda():
    index = stacks.CPU_TORCH_INDEX
    assert stacks.torch_index("auto", host_has_gpu=False) == index
    assert stacks.torch_index("auto", host_has_gpu=True) == ""
    assert stacks.torch_index("cpu", host_has_gpu=True) == index
    assert stacks.torch_index("cuda", host_has_gpu=False) == ""
    mirror = "https://mirror.example.org/whl/cpu"
    assert stacks.torch_index("cpu", False, mirror) == mirror
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        stacks.torch_index("rocm", False)
    with pytest.raises(ValueError, match="http"):
        stacks.torch_index("cpu", False, 'https://x.org/cpu" && curl evil')


def test_the_cpu_torch_line_is_one_shared_layer_of_the_torch_stacks_only():
    index = stacks.CPU_TORCH_INDEX
    torch_line = f'RUN python -m pip install --no-cache-dir --index-url {index} "torch>=2"\n'
    for name in ("pytorch", "huggingface"):
        text = stacks.lines(name, index)
        assert torch_line in text
        # before the stack's own install, which then keeps that torch ("torch>=2")
        own = 'RUN python -m pip install --no-cache-dir "torch>=2"'
        assert text.index(torch_line) < text.index(own)
        assert torch_line not in stacks.lines(name)  # a GPU host: the base's CUDA torch
    assert "index-url" not in stacks.lines("data-science", index)
    assert stacks.lines("minimal", index) == ""


@pytest.mark.parametrize("stack", ["pytorch", "huggingface"])
def test_each_cpu_torch_stack_passes_hadolint(stack, tmp_path):
    hadolint = Path(sys.executable).with_name("hadolint")
    if not hadolint.exists():
        hadolint = Path(shutil.which("hadolint") or hadolint)
    path = tmp_path / "Dockerfile"
    params = {"base_image": BASE, "display_name": "My lab"}
    params["stack_lines"] = options.stack_lines({"stack": stack}, stacks.CPU_TORCH_INDEX)
    path.write_text(images.render(REPO / "images", "project.Dockerfile.j2", **params))
    done = subprocess.run(
        [str(hadolint), "--no-color", "--ignore", "DL3007", str(path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_admin_names_the_starting_points_built_in_the_background():
    from traitlets import TraitError
    from traitlets.config import Config

    from gpulab_hub import hubconfig, hubsettings

    def prebuilt(value: str | None) -> list[str]:
        c = Config()
        hubconfig.apply(c, {} if value is None else {"GPULAB_PREBUILD": value}, "/i")
        return list(hubsettings.spawner_of(c).prebuild_stacks)

    every = [s.name for s in stacks.STACKS]
    assert prebuilt(None) == prebuilt("all") == every  # `make up`: all of them
    assert prebuilt("none") == []
    assert prebuilt("pytorch,minimal") == ["pytorch", "minimal"]
    with pytest.raises(TraitError, match="no starting point 'tensorflow'"):
        prebuilt("minimal,tensorflow")

"""Templates, content tags and build contexts (no Docker needed here)."""

import io
import tarfile
from pathlib import Path

import pytest
from jinja2 import UndefinedError

from gpulab_hub import images

IMAGES = Path(__file__).resolve().parents[1] / "images"


def test_project_template_has_base_and_managed_block():
    text = images.render(
        IMAGES, "project.Dockerfile.j2", base_image="gpulab/base:cpu", display_name="My lab"
    )
    assert text.startswith('# gpulab project "My lab"')
    assert images.base_of(text) == "gpulab/base:cpu"
    start = text.index(">>> gpulab managed block")
    end = text.index("<<< gpulab managed block")
    assert start < end


def test_project_template_header_speaks_to_a_new_user():
    text = images.render(
        IMAGES, "project.Dockerfile.j2", base_image="gpulab/base:latest", display_name="x"
    )
    header = text[: text.index("\nFROM ")]
    # what the file is, that each start builds it and reuses what did not change,
    # who writes the managed block, and what FROM may name (with where to read more)
    for words in (
        "this Dockerfile describes the project's software",
        "Each time the project starts, gpulab builds it",
        "reusing every step that did not change",
        "The base image is the admin's choice",
        "FROM may name only this hub's base images",
        '"What a Dockerfile may name"',
    ):
        assert words in " ".join(header.replace("# ", "").split()), words
    assert "%gpu_install writes the packages" in text
    # no build-tool pragmas or internals a user cannot act on
    for internal in ("hadolint", "hashes its ID", "image's tag"):
        assert internal not in header, internal


def test_template_parameters_are_required():
    with pytest.raises(UndefinedError):
        images.render(IMAGES, "project.Dockerfile.j2", display_name="x")


def test_content_tag_changes_with_content_only():
    a = images.content_tag("gpulab/project", b"FROM a\n", b"sha256:1")
    assert a == images.content_tag("gpulab/project", b"FROM a\n", b"sha256:1")
    assert a != images.content_tag("gpulab/project", b"FROM a\nRUN x\n", b"sha256:1")
    assert a != images.content_tag("gpulab/project", b"FROM a\n", b"sha256:2")
    # parts are hashed separately: moving bytes between parts changes the tag
    assert images.content_tag("r", b"ab", b"c") != images.content_tag("r", b"a", b"bc")
    repo, tag = a.split(":")
    assert repo == "gpulab/project" and len(tag) == 16


def test_base_of_uses_the_last_stage():
    text = "FROM builder:1 AS build\nRUN make\nFROM runtime:2\nCOPY --from=build /x /x\n"
    assert images.base_of(text) == "runtime:2"


def test_tar_context_is_reproducible():
    files = {"Dockerfile": b"FROM x\n", "a/b.txt": b"hello"}
    one, two = images.tar_context(files).getvalue(), images.tar_context(files).getvalue()
    assert one == two
    with tarfile.open(fileobj=io.BytesIO(one)) as tar:
        assert tar.getnames() == ["Dockerfile", "a/b.txt"]
        assert tar.extractfile("a/b.txt").read() == b"hello"


def test_build_error_message_carries_the_log_tail(tmp_path):
    err = images.BuildError("The build failed.", ["step 3", "error: no"], tmp_path / "b.log")
    assert str(err) == (
        "The build failed.\nLast lines of the build log:\nstep 3\nerror: no\n"
        f"Full log: {tmp_path / 'b.log'}"
    )

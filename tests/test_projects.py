"""The project store: names, folders, and never losing a Dockerfile."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulab_hub.projects import Project, ProjectError, project_name
from gpulab_hub.projects.safefs import ensure_project


@pytest.mark.parametrize("name", ["a", "vision", "vision-2", "x1-y2-z3", "a" * 30])
def test_valid_project_names(name):
    assert project_name(name) == name


def test_default_server_is_the_default_project():
    assert project_name("") == "default"


@pytest.mark.parametrize(
    "name",
    ["Vision", "2vision", "vision-", "a--b", "a_b", "../etc", "a/b", "a" * 31, " a", "ä"],
)
def test_invalid_project_names_are_refused_with_the_rules(name):
    with pytest.raises(ProjectError, match="lowercase letters, digits"):
        project_name(name)


@given(st.text(max_size=40))
def test_accepted_names_are_safe_folder_names(name):
    try:
        accepted = project_name(name)
    except ProjectError:
        return
    assert "/" not in accepted and accepted not in {".", ".."}
    assert accepted.isascii() and accepted == accepted.lower()


def test_ensure_project_creates_then_never_overwrites(tmp_path):
    p = Project(tmp_path, "alice", "vision", tmp_path / "state")
    assert ensure_project(p, "FROM base\n", uid=os.getuid(), gid=os.getgid()) is True
    assert p.dockerfile.read_text() == "FROM base\n"
    # gpulab's own state is not in the project folder
    assert sorted(os.listdir(p.path)) == ["Dockerfile"]

    p.dockerfile.write_text("FROM base\nRUN echo mine\n")
    assert ensure_project(p, "FROM other\n", uid=os.getuid(), gid=os.getgid()) is False
    assert p.dockerfile.read_text() == "FROM base\nRUN echo mine\n"
    assert sorted(os.listdir(p.path)) == ["Dockerfile"]


def test_folder_that_cannot_be_created_is_explained(tmp_path):
    (tmp_path / "alice").write_text("a file where a folder should be")
    with pytest.raises(ProjectError, match="Cannot create the project directory"):
        ensure_project(Project(tmp_path, "alice", "vision"), "FROM base\n", 1000, 100)
    assert (tmp_path / "alice").read_text() == "a file where a folder should be"


@pytest.mark.parametrize("owner", ["", ".", "..", "a/b"])
def test_owner_names_that_cannot_name_a_folder(tmp_path, owner):
    with pytest.raises(ProjectError):
        _ = Project(tmp_path, owner, "vision").path

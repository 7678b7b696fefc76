"""The hub makes a project's data folders without following a link (datafolders.py)."""

import os

import pytest

from gpulab_hub.projects import ProjectError, datafolders
from gpulab_hub.projects.objects import ContainerInputs


def settings(data_root, **overrides) -> ContainerInputs:
    base = dict(
        name="gpulab-alice--vision",
        image="gpulab/project:0123456789abcdef",
        command=[],
        env={},
        project_dir="/srv/gpulab/projects/alice/vision",
        data_root=str(data_root),
        hf_cache_volume="gpulab-hf-alice",
        network="gpulab-net",
        port=8888,
        owner="alice",
        data_scope="project",
    )
    base.update(overrides)
    return ContainerInputs(**base)


def mode(path) -> int:
    return os.lstat(path).st_mode & 0o777


def test_parents_are_the_hubs_and_each_data_folder_the_notebook_users(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    datafolders.ensure(settings(root), os.getuid() + 1, os.getgid() + 1)
    mine = root / "projects" / "alice" / "vision"
    for parent in (root / "projects", root / "projects" / "alice", mine):
        assert mode(parent) == 0o755 and os.lstat(parent).st_uid == os.getuid()
    for sub in ("models", "outputs", "huggingface"):
        st = os.lstat(mine / sub)
        assert mode(mine / sub) == 0o750
        if os.geteuid() == 0:
            assert (st.st_uid, st.st_gid) == (os.getuid() + 1, os.getgid() + 1)
    # Again: what is there is left as it is (what the project wrote stays).
    (mine / "outputs" / "result.txt").write_text("kept")
    datafolders.ensure(settings(root), 4242, 4242)
    assert (mine / "outputs" / "result.txt").read_text() == "kept"
    assert os.lstat(mine / "outputs").st_uid != 4242


@pytest.mark.parametrize("planted", ["projects", "projects/alice", "projects/alice/vision/models"])
def test_a_link_on_the_way_is_refused_and_nothing_is_made_through_it(tmp_path, planted):
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    link = root / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    with pytest.raises(ProjectError, match="is a link, not a folder"):
        datafolders.ensure(settings(root), os.getuid(), os.getgid())
    assert list(elsewhere.iterdir()) == []


def test_a_file_where_a_folder_belongs_is_refused(tmp_path):
    root = tmp_path / "data"
    (root / "projects" / "alice").mkdir(parents=True)
    (root / "projects" / "alice" / "vision").write_text("not a folder")
    with pytest.raises(ProjectError, match="is a file, not a folder"):
        datafolders.ensure(settings(root), os.getuid(), os.getgid())


def test_the_per_user_layout_and_group_folders_too(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    s = settings(root, data_scope="user", data_groups=("vision-lab",))
    datafolders.ensure(s, os.getuid(), os.getgid())
    for leaf in ("models/alice", "outputs/alice", "groups/vision-lab"):
        assert mode(root / leaf) == 0o750
    assert not (root / "projects").exists()


def test_a_folder_outside_the_data_root_is_refused(tmp_path):
    with pytest.raises(ValueError):
        datafolders.ensure_folder(str(tmp_path / "data"), str(tmp_path / "x"), 0, 0)

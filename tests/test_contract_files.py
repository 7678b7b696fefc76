"""gpulab_contract.files.write_atomic: the one atomic writer both sides use."""

import os
import stat

import pytest

from gpulab_contract.files import write_atomic


def test_write_replaces_whole_file_with_mode_whatever_the_umask(tmp_path):
    target = tmp_path / "record.json"
    target.write_bytes(b"old contents, longer than the new ones")
    old = os.umask(0o077)
    try:
        write_atomic(target, b"new", mode=0o640)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["record.json"]  # no temporary file left behind


def test_a_link_at_the_destination_is_replaced_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "Dockerfile"
    link.symlink_to(victim)
    write_atomic(link, b"FROM x\n")
    assert victim.read_bytes() == b"precious"
    assert not link.is_symlink() and link.read_bytes() == b"FROM x\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_dir_fd_writes_inside_the_open_folder_only(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_atomic("Dockerfile", b"FROM y\n", dir_fd=fd, mode=0o600)
        with pytest.raises(ValueError):
            write_atomic("../escape", b"x", dir_fd=fd)
    finally:
        os.close(fd)
    assert (folder / "Dockerfile").read_bytes() == b"FROM y\n"
    assert stat.S_IMODE((folder / "Dockerfile").stat().st_mode) == 0o600
    assert not (tmp_path / "escape").exists()


def test_a_failed_precondition_leaves_the_file_and_no_temporary(tmp_path):
    """Save a copy's compare-and-swap: the Dockerfile changed after it was read."""
    target = tmp_path / "Dockerfile"
    target.write_bytes(b"FROM a\n")
    seen = []

    def unchanged() -> bool:
        seen.append(sorted(os.listdir(tmp_path)))  # the new file is there, not yet renamed
        target.write_bytes(b"FROM edited-meanwhile\n")
        return target.read_bytes() == b"FROM a\n"

    assert write_atomic(target, b"FROM b\n", precondition=unchanged) is False
    assert target.read_bytes() == b"FROM edited-meanwhile\n"
    assert os.listdir(tmp_path) == ["Dockerfile"]
    assert len(seen[0]) == 2
    assert write_atomic(target, b"FROM c\n", precondition=lambda: True) is True
    assert target.read_bytes() == b"FROM c\n"

"""Every backup restores, whatever users keep in their folders (no hub, no Docker).

A hostile user's project folder holds what broke gpulab backup before: 68,000 empty
files with names long enough that the old manifest passed 256 MiB (the old restore
refused it), names Linux allows but the old restore refused or might mangle (a
backslash, a newline, bytes that are not UTF-8), a sparse file of 16 TiB (the old
backup read every byte of it, and restored it as real disk), links (to /etc and
within the folder) and FIFOs. The hub's state and other users' projects sit beside it.
`gpulab backup --projects` then `gpulab restore` onto a fresh GPULAB_HOME: every
user's data is there as it was, the sparse file is sparse again. A project over the
admin's limit (GPULAB_BACKUP_PROJECT_FILES) is left out past it and named.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from test_backup import backup, make_home, restore_to, write

MANY = 68_000
LONG = 255  # the longest name Linux allows
DEPTH = 14  # folders of LONG names above the many files: paths of about 3,850 bytes
ODD = {  # name (bytes, as Linux has it) -> contents
    b"back\\slash": b"a backslash is a character like any other\n",
    b"new\nline": b"a newline in a name\n",
    b"not-utf8-\xff\xfe\x80": b"bytes that are not UTF-8\n",
    b"tab\there and 'quotes\"": b"tabs and quotes\n",
    b" leading space": b"a space first\n",
    "ünïcødé-名前".encode(): b"UTF-8 beyond ASCII\n",
    b"GNUSparseFile.0": b"the name tar's sparse format uses inside\n",
}
SPARSE_DATA = {0: b"head of the image", 1 << 40: os.urandom(1 << 20)}  # offset -> bytes
TIMES: dict[str, float] = {}
EMPTY = hashlib.sha256(b"").hexdigest()


def make_sparse(path: Path) -> int:
    """A file of 16 TiB of holes (or the largest this file system allows) with a few
    regions of data, made in a moment. -> its size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for size in (1 << 44, (1 << 44) - 4096, 1 << 42):
            try:
                os.ftruncate(fd, size)
                break
            except OSError:
                continue
        else:
            pytest.skip("this file system holds no sparse file of 4 TiB")
        for offset, data in {**SPARSE_DATA, size - 4: b"tail"}.items():
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
    return size


def make_many(project: Path) -> bytes:
    """MANY empty files with LONG names, DEPTH folders of LONG names down (each made
    from its folder's descriptor, so the test's own paths stay short). -> their folder
    (relative to the project, bytes)."""
    parts = [(f"{n:03d}" + "d" * (LONG - 3)).encode() for n in range(DEPTH)]
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            os.mkdir(part, dir_fd=fd)
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        for n in range(MANY):
            name = f"{n:06d}" + "f" * (LONG - 6)
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
        os.mkfifo("pipe-deep", dir_fd=fd)
    finally:
        os.close(fd)
    return b"/".join(parts)


def tree(root: Path) -> dict[bytes, tuple]:
    """What a folder holds, by path below it (bytes): (kind, sha256 or link target,
    mode). Walked from descriptors (paths past PATH_MAX are fine); the sparse file is
    read only where it has data."""
    found: dict[bytes, tuple] = {}
    top = os.fsencode(root)
    for folder, dirs, files, dir_fd in os.fwalk(top):
        rel = os.path.relpath(folder, top)
        for name in dirs + files:
            path = os.path.normpath(os.path.join(rel, name))
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                found[path] = ("link", os.readlink(name, dir_fd=dir_fd), None)
            elif stat.S_ISDIR(st.st_mode):
                found[path] = ("folder", None, mode)
            elif stat.S_ISREG(st.st_mode) and name == b"huge.img":
                found[path] = ("sparse", st.st_size, mode)
            elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
                found[path] = ("file", EMPTY, mode)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as f:
                    found[path] = ("file", hashlib.sha256(f.read()).hexdigest(), mode)
            else:
                found[path] = ("special", None, None)
    return found


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The hub's state, alice's and bob's projects, mallory's hostile one; backed up
    with --projects and restored onto a fresh home (each timed)."""
    root = tmp_path_factory.mktemp("hostile")
    home = make_home(root)
    write(home / "projects" / "bob" / "thesis" / "Dockerfile", "FROM base\n", 0o644)
    write(home / "projects" / "bob" / "thesis" / "data" / "results.csv", "a,b\n1,2\n", 0o640)
    evil = home / "projects" / "mallory" / "evil"
    write(evil / "Dockerfile", "FROM base\n", 0o644)
    started = time.monotonic()
    deep = make_many(evil)
    TIMES["make 68,000 files"] = time.monotonic() - started
    for name, data in ODD.items():
        write(Path(os.fsdecode(os.fsencode(evil) + b"/" + name)), data, 0o644)
    odd_folder = Path(os.fsdecode(os.fsencode(evil) + b"/folder\\with\nodd-\xff"))
    write(odd_folder / "inside.txt", "in an oddly named folder\n", 0o600)
    size = make_sparse(evil / "huge.img")
    os.symlink("/etc", evil / "etc")
    os.symlink("/etc/passwd", evil / "passwd")
    os.symlink(os.fsdecode(b"back\\slash"), evil / "to-backslash")  # within: kept
    os.mkfifo(evil / "pipe")
    before = tree(home / "projects")
    out = root / "hub.tar.gz"
    started = time.monotonic()
    made = backup(home, out, projects=True)
    TIMES["backup"] = time.monotonic() - started
    new = root / "new"
    started = time.monotonic()
    said = restore_to(out, new)
    TIMES["restore"] = time.monotonic() - started
    print(
        f"\nhostile project: {MANY:,} files, a {size / (1 << 40):.0f} TiB sparse file; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in TIMES.items())
        + f"; archive {out.stat().st_size / (1 << 20):.1f} MiB, member list "
        f"{made.listing_bytes / (1 << 20):.1f} MiB before compression"
    )
    return dict(home=home, new=new, made=made, said=said, before=before, deep=deep,
                size=size, out=out)  # fmt: skip


def test_every_users_files_come_back_as_they_were(hostile):
    before, after = hostile["before"], tree(hostile["new"] / "projects")
    left_out = {b"mallory/evil/etc", b"mallory/evil/passwd", b"mallory/evil/pipe",
                b"mallory/evil/" + hostile["deep"] + b"/pipe-deep"}  # fmt: skip
    assert set(before) - set(after) - {b".locks", b".locks/image.lock"} == left_out
    assert not set(after) - set(before)
    for path, what in after.items():
        assert what == before[path], path
    many = [p for p in after if p.startswith(b"mallory/evil/" + hostile["deep"] + b"/0")]
    assert len(many) == MANY
    for name, data in ODD.items():
        assert (os.fsencode(hostile["new"]) + b"/projects/mallory/evil/" + name) in {
            os.fsencode(hostile["new"] / "projects") + b"/" + p for p in after
        }
        path = os.fsencode(hostile["new"] / "projects" / "mallory" / "evil") + b"/" + name
        assert Path(os.fsdecode(path)).read_bytes() == data
    for user in ("alice/proj", "bob/thesis"):  # the other users' projects, whole
        theirs = {p for p in before if p.startswith(user.encode())}
        assert theirs and all(after[p] == before[p] for p in theirs)


def test_the_sparse_file_is_restored_sparse_with_its_data(hostile):
    path = hostile["new"] / "projects" / "mallory" / "evil" / "huge.img"
    st = path.stat()
    assert st.st_size == hostile["size"]
    assert st.st_blocks * 512 < 16 << 20  # a few MiB on disk, not 16 TiB
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset, data in {**SPARSE_DATA, hostile["size"] - 4: b"tail"}.items():
            assert os.pread(fd, len(data), offset) == data
        assert os.pread(fd, 16, 1 << 30) == b"\0" * 16  # a hole reads as zeros
    finally:
        os.close(fd)


def test_the_backup_says_what_it_left_out_and_the_restore_which_links(hostile):
    made, said = hostile["made"], hostile["said"]
    assert "projects/mallory/evil/pipe is not a file or folder (a FIFO, socket or device)" in (
        made.left_out
    )
    assert any(line.startswith("  left out: projects/mallory/evil/etc (a link") for line in said)
    assert any(line.startswith("  left out: projects/mallory/evil/passwd (a link") for line in said)
    assert made.listing_bytes > 256 << 20  # the list the old manifest held whole
    assert hostile["out"].stat().st_size < 64 << 20


def test_a_project_over_the_admins_limit_is_named_and_the_rest_kept(tmp_path, monkeypatch, capsys):
    """`gpulab backup --projects` with GPULAB_BACKUP_PROJECT_FILES=100: mallory's
    project of 150 files keeps 100 (and its Dockerfile), the backup names the project,
    the first file left out, and how many; alice's project is whole."""
    from gpulab_hub import cli

    home = make_home(tmp_path)
    evil = home / "projects" / "mallory" / "evil"
    write(evil / "Dockerfile", "FROM base\n", 0o644)
    for n in range(150):
        write(evil / f"f{n:03d}", f"{n}\n", 0o644)
    monkeypatch.setenv("GPULAB_HOME", str(home))
    monkeypatch.setenv("GPULAB_BACKUP_PROJECT_FILES", "100")
    assert cli.main(["backup", "--projects", "-o", str(tmp_path / "a.tar.gz")]) == 0
    out = capsys.readouterr().out
    assert (
        "projects/mallory/evil: over the limit of 100 files per project "
        "(GPULAB_BACKUP_PROJECT_FILES): 50 entries left out, the first "
        "projects/mallory/evil/f100"
    ) in out
    restore_to(tmp_path / "a.tar.gz", tmp_path / "new")
    restored = tmp_path / "new" / "projects"
    assert sorted(p.name for p in (restored / "mallory" / "evil").iterdir()) == [
        "Dockerfile", *(f"f{n:03d}" for n in range(100))
    ]  # fmt: skip
    assert (restored / "alice" / "proj" / "notes.txt").read_text() == "my notes\n"


def test_a_16_tib_sparse_file_takes_seconds_and_no_disk(tmp_path):
    """The old backup read all 16 TiB of zeros (a day) and restored them as real disk.
    The member is GNU tar's own sparse format: GNU tar restores it sparse too."""
    home = make_home(tmp_path)
    img = home / "projects" / "mallory" / "img" / "huge.img"
    img.parent.mkdir(parents=True)
    size = make_sparse(img)
    started = time.monotonic()
    backup(home, tmp_path / "a.tar.gz", projects=True)
    restore_to(tmp_path / "a.tar.gz", tmp_path / "new")
    took = time.monotonic() - started
    st = (tmp_path / "new" / "projects" / "mallory" / "img" / "huge.img").stat()
    assert st.st_size == size and st.st_blocks * 512 < 16 << 20
    assert took < 30, f"backup and restore of a sparse file took {took:.0f} s"
    if shutil.which("tar"):
        (tmp_path / "gnu").mkdir()
        name = "projects/mallory/img/huge.img"
        subprocess.run(["tar", "-xzf", tmp_path / "a.tar.gz", "-C", tmp_path / "gnu", name],
                       check=True, timeout=60)  # fmt: skip
        gnu = tmp_path / "gnu" / name
        assert gnu.stat().st_size == size and gnu.stat().st_blocks * 512 < 16 << 20
        with gnu.open("rb") as f:
            f.seek(1 << 40)
            assert f.read(1 << 20) == SPARSE_DATA[1 << 40]


def test_an_older_gpulabs_archive_with_a_backslash_name_restores_now(tmp_path):
    """Format 1 (the member list in the manifest): the old restore refused the name."""
    from security.test_backup_links import crafted, member

    archive = crafted(tmp_path, [(member("projects/m/p/back\\slash"), b"kept\n")])
    restore_to(archive, tmp_path / "new")
    assert (tmp_path / "new" / "projects" / "m" / "p" / "back\\slash").read_bytes() == b"kept\n"


def test_a_path_longer_than_path_max_comes_back(tmp_path):
    """20 folders of 255-byte names: a 5 KiB path, which no path-based call reaches."""
    home = make_home(tmp_path)
    project = home / "projects" / "mallory" / "deep"
    project.mkdir(parents=True)
    parts = [(f"{n:02d}" + "x" * (LONG - 2)).encode() for n in range(20)]
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        os.mkdir(part, dir_fd=fd)
        fd, old = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(old)
    os.write(new := os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), b"deep\n")
    os.close(new)
    os.close(fd)
    backup(home, tmp_path / "a.tar.gz", projects=True)
    restore_to(tmp_path / "a.tar.gz", tmp_path / "new")
    got = tree(tmp_path / "new" / "projects" / "mallory" / "deep")
    bottom = b"/".join([*parts, b"bottom.txt"])
    assert len(bottom) > 4096
    assert got[bottom] == ("file", hashlib.sha256(b"deep\n").hexdigest(), 0o644)

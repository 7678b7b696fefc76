"""A project user attacks gpulab backup and restore through their project folder (real
files, as root), and an archive is crafted to write outside GPULAB_HOME.

The project folder holds links to a host file (absolute, relative, and in place of the
Dockerfile), a link to /etc/shadow, a link to the hub's own folder, files named with
``..``, and a FIFO. The archive must hold none of the host files' bytes (links are
stored as links, never followed), the backup must not hang on the FIFO, and a restore
must write nothing outside the new GPULAB_HOME nor leave a link there that points out.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import stat
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_backup import backup, listed, make_home, members, restore_to, write

from gpulab_hub.backup import MANIFEST, BackupError
from gpulab_hub.backup import version as gpulab_version

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reads /etc/shadow and chowns: root")

MARKER = "host-secret-" + secrets.token_hex(8)


@pytest.fixture
def hostile(tmp_path) -> SimpleNamespace:
    home = make_home(tmp_path)
    host = tmp_path / "host"
    secret = write(host / "shadow", MARKER + "\n", 0o600)
    project = home / "projects" / "mallory" / "evil"
    project.mkdir(parents=True)
    os.symlink(secret, project / "Dockerfile")  # the Dockerfile itself, even without --projects
    os.symlink(secret, project / "leak.txt")
    os.symlink("/etc/shadow", project / "shadow")
    os.symlink("../../../../host/shadow", project / "relative-leak")
    os.symlink(home / "hub", project / "hub")  # the hub's keys, through a folder link
    write(project / "notes.txt", "mallory's notes\n", 0o644)
    os.symlink("notes.txt", project / "inside")  # a link within the project: kept
    write(project / "..data", "two dots\n", 0o644)
    write(project / "...", "three dots\n", 0o644)
    write(project / "a..b", "dots inside\n", 0o644)
    (project / "deep" / "er").mkdir(parents=True)
    os.symlink(secret, project / "deep" / "er" / "x")
    os.mkfifo(project / "pipe")
    os.chown(project, 101000, 100100)
    deleted = home / "hub" / "deleted" / "mallory-20261126T000000Z" / "projects" / "old"
    deleted.mkdir(parents=True)
    os.symlink(secret, deleted / "leak")
    return SimpleNamespace(home=home, secret=secret, project=project, tmp=tmp_path)


def host_files() -> list[bytes]:
    """Bytes the archive must never hold: the planted host file's, and /etc/shadow's."""
    shadow = Path("/etc/shadow").read_bytes()
    return [MARKER.encode()] + ([shadow] if len(shadow) > 20 else [])


@pytest.mark.parametrize("projects", [True, False], ids=["--projects", "Dockerfiles only"])
def test_the_archive_holds_links_as_links_never_what_they_point_to(hostile, projects):
    out = hostile.tmp / "a.tar.gz"
    made = backup(hostile.home, out, projects=projects)
    got = members(out)
    for name, data in got.items():
        for secret in host_files():
            assert data is None or secret not in data, name
    evil = "projects/mallory/evil"
    with tarfile.open(out) as tar:
        link = tar.getmember(f"{evil}/Dockerfile")
        assert link.issym() and link.linkname == str(hostile.secret) and link.size == 0
    assert not [n for n in got if n.startswith(f"{evil}/hub/")]  # the folder link not walked
    host_key = (hostile.home / "hub" / "ssh" / "host_ed25519_key").read_bytes()
    assert [n for n, d in got.items() if d == host_key] == ["hub/ssh/host_ed25519_key"]
    members_listed = listed(out)
    if projects:
        for name in ("leak.txt", "shadow", "relative-leak", "hub", "inside", "deep/er/x"):
            assert members_listed[f"{evil}/{name}"]["type"] == "link", name
        assert got[f"{evil}/..data"] == b"two dots\n" and got[f"{evil}/..."] == b"three dots\n"
        assert f"{evil}/pipe is not a file or folder (a FIFO, socket or device)" in made.left_out
        leak = "hub/deleted/mallory-20261126T000000Z/projects/old/leak"
        assert members_listed[leak]["type"] == "link"
    else:
        assert {n for n in got if n.startswith(evil)} == {evil, f"{evil}/Dockerfile"}


def test_a_restore_of_it_writes_nothing_outside_the_new_home(hostile):
    out = hostile.tmp / "a.tar.gz"
    backup(hostile.home, out, projects=True)
    before = {p: p.lstat().st_mtime_ns for p in hostile.tmp.rglob("*") if "new" not in p.parts}
    secret_stat = hostile.secret.stat()
    new = hostile.tmp / "new"
    said = restore_to(out, new)
    after = {p: p.lstat().st_mtime_ns for p in hostile.tmp.rglob("*") if "new" not in p.parts}
    assert after == before  # nothing outside the new home made or changed
    assert hostile.secret.read_text() == MARKER + "\n"
    assert hostile.secret.stat().st_mode == secret_stat.st_mode
    restored = new / "projects" / "mallory" / "evil"
    assert (restored / "..data").read_text() == "two dots\n"
    assert (restored / "...").read_text() == "three dots\n"
    assert (restored / "a..b").read_text() == "dots inside\n"
    assert (restored / "inside").readlink() == Path("notes.txt")  # a link within: kept
    assert restored.stat().st_uid == 101000  # the project keeps its owner
    for name in ("Dockerfile", "leak.txt", "shadow", "relative-leak", "hub", "deep/er/x"):
        assert not os.path.lexists(restored / name), name
        assert any(
            line.startswith(f"  left out: projects/mallory/evil/{name} (a link") for line in said
        )
    root = os.path.realpath(new)
    for top, dirs, files in os.walk(new):
        for name in dirs + files:
            path = os.path.join(top, name)
            if os.path.islink(path):
                assert os.path.realpath(path).startswith(root + os.sep), path


def crafted(tmp: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """An archive as an attacker would make it: every member listed in a manifest with
    its right sum, so only the names and kinds can stop it."""
    listed = {}
    for info, data in entries:
        if info.isreg():
            listed[info.name] = {"type": "file", "sha256": hashlib.sha256(data).hexdigest(),
                                 "size": len(data)}  # fmt: skip
        elif info.issym():
            listed[info.name] = {"type": "link", "target": info.linkname}
        elif info.isdir():
            listed[info.name] = {"type": "folder"}
        else:
            listed[info.name] = {"type": "other"}
    manifest = {"format": 1, "gpulab": gpulab_version(), "members": listed}
    out = tmp / "crafted.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for info, data in [*entries, (tarfile.TarInfo(MANIFEST), json.dumps(manifest).encode())]:
            info.size = len(data) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out


def member(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


@pytest.mark.parametrize(
    "name",
    ["../outside.txt", "hub/../../outside.txt", "projects/m/p/../../../../outside.txt",
     "/tmp/gpulabbak-absolute.txt", "elsewhere/outside.txt"],
)  # fmt: skip
def test_a_crafted_path_that_leaves_the_home_is_refused(tmp_path, name):
    archive = crafted(tmp_path, [(member(name), b"planted")])
    with pytest.raises(BackupError) as refused:
        restore_to(archive, tmp_path / "new" / "home")
    assert "a path outside the folders gpulab restores" in str(refused.value)
    assert "nothing was restored" in str(refused.value)
    assert not list(tmp_path.rglob("outside.txt")) and not Path(name).exists()
    assert not (tmp_path / "new" / "home" / "hub").exists()


def test_a_crafted_link_out_and_a_file_through_it_stay_inside(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    archive = crafted(
        tmp_path,
        [(member("projects/m/p/l", tarfile.SYMTYPE, str(target)), b""),
         (member("projects/m/p/up", tarfile.SYMTYPE, "../../../.."), b""),
         (member("projects/m/p/l/planted"), b"planted"),
         (member("hub/crypt-key"), b"k")],
    )  # fmt: skip
    new = tmp_path / "new"
    said = restore_to(archive, new)
    assert list(target.iterdir()) == []  # nothing written through the link
    assert not os.path.lexists(new / "projects" / "m" / "p" / "up")
    assert (new / "projects" / "m" / "p" / "l" / "planted").read_bytes() == b"planted"
    assert not (new / "projects" / "m" / "p" / "l").is_symlink()
    assert sum("left out: projects/m/p/" in line for line in said) == 2


@pytest.mark.parametrize(
    "bad",
    [member("projects/m/p/hard", tarfile.LNKTYPE, "/etc/shadow"),
     member("projects/m/p/dev", tarfile.CHRTYPE),
     member("hub/keys", tarfile.SYMTYPE, "/etc")],
    ids=["hard link to /etc/shadow", "device", "a link in the hub's folder"],
)  # fmt: skip
def test_a_crafted_hard_link_device_or_hub_link_is_refused(tmp_path, bad):
    archive = crafted(tmp_path, [(bad, b"")])
    with pytest.raises(BackupError, match="nothing was restored"):
        restore_to(archive, tmp_path / "new")
    assert not (tmp_path / "new" / "projects").exists()
    assert stat.S_ISREG(os.lstat("/etc/shadow").st_mode)

"""gpulab backup and restore on a hub folder made here (no hub, no Docker): what the
archive holds and leaves out, a database copied consistently while it is written, a
record read under its store's lock, and each refusal of restore in its sentence.

The whole round trip on a real hub (users, project, share, secret, SSH key) is
test_backup_hub.py; attacks from project folders are security/test_backup_links.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from filelock import FileLock
from traitlets.config import Config

from gpulab_hub.backup import MANIFEST, MEMBERS, BackupError, make, restore
from gpulab_hub.backup import version as gpulab_version

ENCRYPTED = "gAAAAABk-encrypted-value-as-the-hub-wrote-it=="


def layout(home: Path) -> SimpleNamespace:
    """Where the hub keeps things (hubsettings' layout, as a hub under ``home`` has it)."""
    hub = home / "hub"
    return SimpleNamespace(
        records_dir=hub, state_root=hub / "projects", projects_root=home / "projects",
        data_root=home / "data", allocations_file=hub / "gpu-allocations.json",
        queue_file=hub / "gpu-queue.json", usage_file=hub / "gpu-usage.jsonl",
    )  # fmt: skip


def write(path: Path, text: str | bytes, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(mode)
    return path


def make_home(root: Path) -> Path:
    """A hub's GPULAB_HOME as a running hub leaves it: database, keys, records with
    their locks, logs, PID files, one project."""
    home = root / "home"
    hub = home / "hub"
    hub.mkdir(parents=True, mode=0o700)
    db = sqlite3.connect(hub / "jupyterhub.sqlite")
    db.executescript(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
        "CREATE TABLE spawners (id INTEGER PRIMARY KEY, user_id INTEGER, name TEXT);"
        "INSERT INTO users (name) VALUES ('alice'), ('bob');"
        "INSERT INTO spawners (user_id, name) VALUES (1, ''), (1, 'proj');"
    )
    db.commit()
    db.close()
    write(hub / "crypt-key", "k" * 43 + "=\n")
    write(hub / "jupyterhub_cookie_secret", "c0ffee" * 10 + "\n")
    write(hub / "sharing.json", '{"version": 1, "items": {}}')
    write(hub / "sharing.json.lock", "")
    secret = {"version": 1, "user": {"secrets": {"HF_TOKEN": {"value": ENCRYPTED, "set": "x"}},
                                     "projects": {}}}  # fmt: skip
    write(hub / "secrets" / "alice.json", json.dumps(secret))
    write(hub / "secrets" / "alice.json.lock", "")
    write(hub / "ssh" / "host_ed25519_key", "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n")
    write(hub / "ssh" / "keys" / "alice.json", '{"version": 1, "keys": []}')
    write(hub / "ssh" / "keys" / ".keys.lock", "")
    write(hub / "ssh" / "sessions.log", "a session\n")
    write(hub / "projects" / "alice" / "proj" / "image.json", "{}")
    write(hub / "hub.log", "the hub's log\n")
    write(hub / "gpulab-hub.pid", "{}")
    write(hub / "jupyterhub.pid", "1")
    write(hub / "logs" / "base-build.log", "built\n")
    write(hub / "wheels" / "gpulab.whl", "wheel")
    write(hub / ".sharing.json.123.tmp", "half")
    write(home / "projects" / "alice" / "proj" / "Dockerfile", "FROM base\n", 0o644)
    write(home / "projects" / "alice" / "proj" / "notes.txt", "my notes\n", 0o644)
    write(home / "projects" / ".locks" / "image.lock", "")
    write(home / "jupyterhub_config.d" / "site.py", "c.ProjectSpawner.mem_limit = '8G'\n")
    return home


def backup(home: Path, out: Path, *, projects: bool = False, environ=None) -> make.Made:
    return make.make(
        out, home=home, hub_dir=home / "hub", config=Config(), where=layout(home),
        projects=projects, environ=environ or {}, say=lambda line: None,
    )  # fmt: skip


def restore_to(archive: Path, home: Path, *, force: bool = False, running: str = "") -> list:
    said: list[str] = []
    restore.restore(
        archive, home=home, hub_dir=home / "hub", projects_root=home / "projects",
        force=force, running=running, environ={}, say=said.append,
    )  # fmt: skip
    return said


def members(archive: Path) -> dict[str, bytes | None]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() if m.isreg() else None for m in tar.getmembers()}


def listed(archive: Path) -> dict[str, dict]:
    """The archive's member list (its last member, one JSON line each), by name."""
    with tarfile.open(archive) as tar:
        lines = tar.extractfile(MEMBERS).read().splitlines()
    return {e["name"]: e for e in map(json.loads, lines) if "name" in e}


def test_the_archive_holds_the_hubs_state_and_leaves_out_logs(tmp_path):
    home = make_home(tmp_path)
    out = tmp_path / "out" / "hub.tar.gz"
    out.parent.mkdir()
    made = backup(home, out)
    assert out.stat().st_mode & 0o777 == 0o600  # it holds the keys
    assert sorted(os.listdir(out.parent)) == ["hub.tar.gz"]  # nothing left behind
    got = members(out)
    for name in ("crypt-key", "jupyterhub_cookie_secret", "sharing.json", "secrets/alice.json",
                 "ssh/host_ed25519_key", "ssh/keys/alice.json", "projects/alice/proj/image.json",
                 "jupyterhub.sqlite"):  # fmt: skip
        assert f"hub/{name}" in got, name
    assert ENCRYPTED.encode() in got["hub/secrets/alice.json"]  # still encrypted, as it was
    assert got["projects/alice/proj/Dockerfile"] == b"FROM base\n"
    assert "projects/alice/proj/notes.txt" not in got  # only with --projects
    assert got["config.d/site.py"].startswith(b"c.ProjectSpawner")
    left = {"hub/hub.log", "hub/gpulab-hub.pid", "hub/jupyterhub.pid", "hub/logs",
            "hub/wheels", "hub/sharing.json.lock", "hub/ssh/keys/.keys.lock",
            "hub/ssh/sessions.log", "hub/.sharing.json.123.tmp", "projects/.locks"}  # fmt: skip
    assert not left & set(got)
    manifest = json.loads(got[MANIFEST])
    assert manifest["gpulab"] == gpulab_version() and manifest["format"] == 2
    with tarfile.open(out) as tar:
        assert tar.getnames()[0] == MANIFEST and tar.getnames()[-1] == MEMBERS
    members_listed = listed(out)
    for name, data in got.items():
        if data is not None and name not in (MANIFEST, MEMBERS):
            assert members_listed[name]["sha256"] == hashlib.sha256(data).hexdigest()
    assert any("--projects" in line for line in made.left_out)


def test_restore_brings_it_back_onto_a_new_home(tmp_path):
    home = make_home(tmp_path)
    backup(home, tmp_path / "a.tar.gz", projects=True)
    new = tmp_path / "new"
    said = restore_to(tmp_path / "a.tar.gz", new)
    for rel in ("hub/crypt-key", "hub/jupyterhub_cookie_secret", "hub/secrets/alice.json",
                "hub/ssh/host_ed25519_key", "hub/ssh/keys/alice.json",
                "projects/alice/proj/Dockerfile", "projects/alice/proj/notes.txt",
                "jupyterhub_config.d/site.py"):  # fmt: skip
        assert (new / rel).read_bytes() == (home / rel).read_bytes(), rel
        assert (new / rel).stat().st_mode & 0o777 == (home / rel).stat().st_mode & 0o777, rel
    assert (new / "hub").stat().st_mode & 0o777 == 0o700
    assert (new / "projects").stat().st_mode & 0o777 == 0o755
    db = sqlite3.connect(new / "hub" / "jupyterhub.sqlite")
    assert [n for (n,) in db.execute("SELECT name FROM users ORDER BY id")] == ["alice", "bob"]
    assert "The restored hub has 2 accounts and 1 projects." in said
    assert not [p for p in new.iterdir() if p.name.startswith(".gpulab-restore")]


def test_the_database_is_copied_whole_while_the_hub_writes_to_it(tmp_path):
    """A file copy of a database being written can catch half a transaction; the
    online backup API never does: every batch of two rows is there whole or not at all."""
    home = make_home(tmp_path)
    path = home / "hub" / "jupyterhub.sqlite"
    db = sqlite3.connect(path, check_same_thread=False)
    db.execute("CREATE TABLE events (batch INTEGER, part INTEGER, pad BLOB)")
    db.commit()
    stop = threading.Event()

    def writer():
        batch = 0
        while not stop.is_set():
            with db:
                for part in (1, 2):
                    db.execute("INSERT INTO events VALUES (?, ?, ?)", (batch, part, b"x" * 8192))
            batch += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        time.sleep(0.3)
        for n in range(3):
            backup(home, tmp_path / f"{n}.tar.gz")
    finally:
        stop.set()
        t.join()
    for n in range(3):
        data = members(tmp_path / f"{n}.tar.gz")["hub/jupyterhub.sqlite"]
        copy = write(tmp_path / f"copy{n}.sqlite", data)
        got = sqlite3.connect(copy)
        assert got.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        counts = got.execute("SELECT count(*) FROM events GROUP BY batch").fetchall()
        assert counts and set(counts) == {(2,)}


def test_a_record_is_read_under_its_stores_lock(tmp_path):
    """While the sharing record's store holds its lock, the backup waits for it, and
    archives what the store wrote under it."""
    home = make_home(tmp_path)
    record = home / "hub" / "sharing.json"
    held = FileLock(str(record) + ".lock")
    held.acquire()
    done = []
    t = threading.Thread(target=lambda: done.append(backup(home, tmp_path / "a.tar.gz")))
    try:
        t.start()
        time.sleep(1.5)
        assert not done and t.is_alive()  # waiting for the lock
        write(record, '{"version": 1, "items": {"changed": {}}}')
    finally:
        held.release()
    t.join(30)
    assert done
    assert b'"changed"' in members(tmp_path / "a.tar.gz")["hub/sharing.json"]


def test_backup_never_overwrites_a_file(tmp_path):
    home = make_home(tmp_path)
    out = write(tmp_path / "there.tar.gz", "keep me")
    with pytest.raises(BackupError, match="exists already; name another file with -o"):
        backup(home, out)
    assert out.read_text() == "keep me"


def test_backup_is_never_written_where_it_would_hold_itself(tmp_path):
    home = make_home(tmp_path)
    for inside in (home / "hub" / "a.tar.gz", home / "projects" / "alice" / "a.tar.gz"):
        with pytest.raises(BackupError, match="Write the archive outside .*: for example in"):
            backup(home, inside)
        assert not inside.exists()
    (home / "backups").mkdir()
    backup(home, home / "backups" / "a.tar.gz")  # GPULAB_HOME itself is not read whole


def test_restore_refuses_a_home_with_a_hub_unless_forced(tmp_path):
    home = make_home(tmp_path)
    backup(home, tmp_path / "a.tar.gz")
    other = make_home(tmp_path / "other")
    write(other / "hub" / "crypt-key", "the other hub's key")
    with pytest.raises(BackupError) as refused:
        restore_to(tmp_path / "a.tar.gz", other)
    assert str(refused.value).startswith(f"{other} already has a hub's state: a hub database")
    assert "add --force" in str(refused.value)
    assert (other / "hub" / "crypt-key").read_text() == "the other hub's key"  # untouched

    said = restore_to(tmp_path / "a.tar.gz", other, force=True)
    assert (other / "hub" / "crypt-key").read_bytes() == (home / "hub" / "crypt-key").read_bytes()
    aside = [p for p in other.iterdir() if p.name.startswith("hub.before-restore-")]
    assert len(aside) == 1 and (aside[0] / "crypt-key").read_text() == "the other hub's key"
    assert f"Moved what was at {other / 'hub'} to {aside[0]}." in said


def test_restore_refuses_while_a_hub_runs_there(tmp_path, monkeypatch, capsys):
    """`gpulab restore` itself, with a hub process that `gpulab up` recorded."""
    from gpulab_hub import cli, pidfile

    home = make_home(tmp_path)
    backup(home, tmp_path / "a.tar.gz")
    new = tmp_path / "new"
    (new / "hub").mkdir(parents=True)
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "jupyterhub"])
    try:
        deadline = time.monotonic() + 10
        while b"jupyterhub" not in Path(f"/proc/{fake.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pidfile.write(new / "hub" / cli.HUB_PIDFILE, fake.pid)
        monkeypatch.setenv("GPULAB_HOME", str(new))
        assert cli.main(["restore", str(tmp_path / "a.tar.gz")]) == 1
    finally:
        fake.kill()
        fake.wait()
    err = capsys.readouterr().err
    assert err.startswith(f"gpulab restore: A hub runs on {new} (process {fake.pid} (")
    assert "stop it with `gpulab down` before you restore." in err
    assert not (new / "hub" / "crypt-key").exists()


def rewrite(archive: Path, out: Path, change) -> Path:
    """A copy of ``archive`` whose members (name -> (TarInfo, bytes)) ``change`` edits."""
    with tarfile.open(archive) as tar:
        items = {m.name: (m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar}
    change(items)
    with tarfile.open(out, "w:gz") as tar:
        for info, data in items.values():
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out


def test_restore_refuses_an_archive_of_a_newer_gpulab(tmp_path):
    home = make_home(tmp_path)
    backup(home, tmp_path / "a.tar.gz")

    def newer(items):
        info, data = items[MANIFEST]
        manifest = json.loads(data)
        manifest["gpulab"] = "99.1.0"
        items[MANIFEST] = (info, json.dumps(manifest).encode())

    archive = rewrite(tmp_path / "a.tar.gz", tmp_path / "newer.tar.gz", newer)
    with pytest.raises(BackupError) as refused:
        restore_to(archive, tmp_path / "new")
    assert str(refused.value) == (
        f"{archive} was written by gpulab 99.1.0, which is newer than this gpulab "
        f"({gpulab_version()}): restore it with gpulab 99.1.0 or later (update gpulab here first)."
    )
    assert not (tmp_path / "new" / "hub").exists()


def test_restore_refuses_a_changed_or_damaged_archive(tmp_path):
    home = make_home(tmp_path)
    backup(home, tmp_path / "a.tar.gz")

    def changed(items):
        info, _ = items["hub/crypt-key"]
        items["hub/crypt-key"] = (info, b"an attacker's key\n")

    archive = rewrite(tmp_path / "a.tar.gz", tmp_path / "changed.tar.gz", changed)
    with pytest.raises(BackupError, match="crypt-key does not match its sha256 in the manifest"):
        restore_to(archive, tmp_path / "new")
    assert not (tmp_path / "new" / "hub").exists()

    whole = (tmp_path / "a.tar.gz").read_bytes()
    cut = write(tmp_path / "cut.tar.gz", whole[: len(whole) // 2])
    with pytest.raises(BackupError, match="is not a gpulab backup"):
        restore_to(cut, tmp_path / "new")
    plain = write(tmp_path / "notes.txt", "not an archive")
    with pytest.raises(BackupError, match="is not a gpulab backup: it is not a .tar.gz archive"):
        restore_to(plain, tmp_path / "new")
    assert not (tmp_path / "new" / "hub").exists()

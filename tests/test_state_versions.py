"""State files across gpulab versions (stateversion.py, docs/upgrading.md), no Docker.

- State written by each release's code (tests/fixtures/state-<version>/, made by
  scripts/dev/make_state_fixture.py) is read by this gpulab's stores, record for record.
- A file of an older format is upgraded in memory and written in the current one at
  the next write (a synthetic kind with a real step; image.json of gpulab before
  formats were written, which has no "version").
- A file of a newer format, of every kind, is refused in a sentence that names it,
  never moved aside or written over; a hub start that meets one ends with that
  sentence, not a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab_hub import jsonfile, stateversion

REPO = Path(__file__).resolve().parents[1]
FIXTURES = sorted((REPO / "tests" / "fixtures").glob("state-*"))


def _script():
    path = REPO / "scripts" / "dev" / "make_state_fixture.py"
    spec = importlib.util.spec_from_file_location("make_state_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fixture_script = _script()


def home_from(fixture: Path, tmp_path: Path) -> Path:
    """A fresh GPULAB_HOME holding the fixture's hub folder; its hub folder."""
    home = tmp_path / "home"
    shutil.copytree(fixture / "hub", home / "hub")
    return home / "hub"


def files_of(hub: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(hub)): p.read_bytes()
        for p in sorted(hub.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def file_of_kind(hub: Path, kind: stateversion.Kind) -> Path:
    found = [p for pattern in kind.files for p in sorted(hub.glob(pattern))]
    assert found, f"the fixture has no {kind.name} file"
    return found[0]


# --- this release's state, and every earlier release's, read back ----------------------


def test_there_is_a_fixture_of_this_release_covering_every_kind():
    from gpulab_hub.backup import version

    assert (REPO / "tests" / "fixtures" / f"state-{version()}").is_dir(), (
        "no state fixture of this release: run scripts/dev/make_state_fixture.py"
    )
    assert set(fixture_script.READERS) == set(stateversion.KINDS)
    for fixture in FIXTURES:
        hub = fixture / "hub"
        for kind in stateversion.KINDS.values():
            file_of_kind(hub, kind)


def test_every_record_store_names_its_kind():
    stores = set()
    todo = [jsonfile.LockedRecord]
    import gpulab_hub.cluster.jobs  # noqa: F401
    import gpulab_hub.gpus.queue  # noqa: F401
    import gpulab_hub.gpus.reclaimrecord  # noqa: F401
    import gpulab_hub.sharing.groupshares  # noqa: F401
    import gpulab_hub.sharing.linkaccess  # noqa: F401
    import gpulab_hub.sharing.public  # noqa: F401

    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not jsonfile.LockedRecord and cls.__module__.startswith("gpulab_hub."):
            stores.add(cls)
    assert len(stores) >= 7  # secrets, sharing settings, logins, usage: in the database
    for cls in stores:
        assert stateversion.KINDS.get(cls.kind.name) is cls.kind, (
            f"{cls.__qualname__} names no kind of stateversion.KINDS"
        )


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_state_of_a_release_is_read_record_for_record(fixture, tmp_path, caplog):
    hub = home_from(fixture, tmp_path)
    before = files_of(hub)
    expected = json.loads((fixture / "expected.json").read_text())

    got = json.loads(json.dumps(fixture_script.read(hub)))

    assert got == expected
    assert stateversion.check_hub(hub) == stateversion.HUB_FORMAT
    assert files_of(hub) == before, "reading the state changed a file"
    assert not list(hub.rglob("*.corrupt-*")), "a store took a file for damaged"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --- an older format --------------------------------------------------------------------


def _add_notes(data: dict) -> dict:  # format 1 -> 2: every entry gets "notes"
    data["items"] = {k: {**v, "notes": ""} for k, v in data["items"].items()}
    return data


GADGETS = stateversion.Kind("gadgets", ("gadgets.json",), current=2, steps={1: _add_notes})


class GadgetStore(jsonfile.LockedRecord):
    kind = GADGETS
    what = "The gadgets record"

    def _parse(self, section):
        section = super()._parse(section)
        if not all(isinstance(v.get("notes"), str) for v in section.values()):
            raise ValueError("an entry without notes")
        return section

    def put(self, key: str, entry: dict) -> None:
        with self.locked():
            records = self._read()
            records[key] = entry
            self._write(records)

    def all(self) -> dict:
        with self.locked():
            return self._read()


def test_an_older_file_is_upgraded_when_read_and_written_anew_at_the_next_write(tmp_path):
    path = tmp_path / "gadgets.json"
    path.write_text(json.dumps({"version": 1, "items": {"a": {"size": 3}}}))
    store = GadgetStore(path)

    assert store.all() == {"a": {"size": 3, "notes": ""}}
    assert json.loads(path.read_text())["version"] == 1, "a read alone rewrites nothing"

    store.put("b", {"size": 4, "notes": "new"})
    on_disk = json.loads(path.read_text())
    assert on_disk["version"] == 2
    assert on_disk["items"] == {"a": {"size": 3, "notes": ""}, "b": {"size": 4, "notes": "new"}}
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_file_without_a_version_is_of_format_1(tmp_path):
    path = tmp_path / "gadgets.json"
    path.write_text(json.dumps({"items": {"a": {"size": 3}}}))
    assert GadgetStore(path).all() == {"a": {"size": 3, "notes": ""}}


def test_a_kind_without_a_step_from_an_older_format_is_refused_when_written_down():
    with pytest.raises(ValueError, match="no step from"):
        stateversion.Kind("broken", ("b.json",), current=3, steps={1: _add_notes})


@pytest.mark.parametrize("version", ["2", 0, -1, True, 1.5, None])
def test_a_version_that_is_no_format_number_is_damage_moved_aside(tmp_path, version, caplog):
    path = tmp_path / "gadgets.json"
    path.write_text(json.dumps({"version": version, "items": {}}))
    assert GadgetStore(path).all() == {}
    assert len(list(tmp_path.glob("gadgets.json.corrupt-*"))) == 1
    assert "is damaged" in caplog.text


def test_image_json_of_gpulab_before_formats_is_read_and_gets_one(tmp_path):
    fixture = FIXTURES[-1]
    hub = home_from(fixture, tmp_path)
    image = hub / "projects" / "alice" / "thesis" / "image.json"
    old = json.loads(image.read_text())
    del old["version"]
    image.write_text(json.dumps(old))

    assert (
        fixture_script.read_project_image(hub)
        == json.loads((fixture / "expected.json").read_text())["project-image"]
    )

    from gpulab_hub import projects
    from gpulab_hub.images import project as image_state

    layout = fixture_script._layout(hub)
    project = projects.Project(hub.parent / "projects", "alice", "thesis", layout.state_root)
    image_state.record(project, None, failed=True)
    assert json.loads(image.read_text())["version"] == stateversion.KINDS["project-image"].current


def test_an_older_hub_folder_runs_its_steps_and_says_so(tmp_path, monkeypatch, caplog):
    hub = home_from(FIXTURES[-1], tmp_path)
    (hub / stateversion.VERSION_FILE).write_text("1\n")
    ran = []
    monkeypatch.setattr(stateversion, "HUB_FORMAT", 2)
    monkeypatch.setattr(stateversion, "HUB_STEPS", {1: ran.append})
    caplog.set_level(logging.INFO, "gpulab_hub")

    assert stateversion.check_hub(hub) == 2

    assert ran == [hub]
    assert (hub / stateversion.VERSION_FILE).read_text() == "2\n"
    assert f"upgraded the hub's state in {hub} from format 1 to 2" in caplog.text


def test_a_hub_folder_without_the_file_is_of_format_1_and_gets_it(tmp_path):
    hub = tmp_path / "hub"
    hub.mkdir()
    assert stateversion.check_hub(hub) == stateversion.HUB_FORMAT
    assert (hub / stateversion.VERSION_FILE).read_text() == f"{stateversion.HUB_FORMAT}\n"
    assert oct((hub / stateversion.VERSION_FILE).stat().st_mode & 0o777) == "0o600"


# --- a newer format ---------------------------------------------------------------------


def make_newer(path: Path, current: int) -> bytes:
    """The file as a gpulab of the next format writes it (a ledger: its last line)."""
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        lines[-1] = json.dumps({"version": current + 1, **json.loads(lines[-1])})
        path.write_text("\n".join(lines) + "\n")
        return path.read_bytes()
    data = json.loads(path.read_text())
    data["version"] = current + 1
    path.write_text(json.dumps(data))
    return path.read_bytes()


def sentence(path: Path, current: int) -> str:
    return (
        f"{path} was written by a newer gpulab (format {current + 1}; this gpulab reads up "
        f"to {current}): upgrade gpulab, or restore a backup made by this version"
    )


@pytest.mark.parametrize("name", sorted(stateversion.KINDS))
def test_a_newer_file_is_refused_in_a_sentence_and_left_as_it_is(name, tmp_path, caplog):
    kind = stateversion.KINDS[name]
    hub = home_from(FIXTURES[-1], tmp_path)
    path = file_of_kind(hub, kind)
    newer = make_newer(path, kind.current)
    words = sentence(path, kind.current)

    # Its store: an error in those words, or (where a read must go on: a user's SSH
    # keys, a project's last image) nothing of the file, with those words in the log.
    try:
        fixture_script.READERS[name](hub)
    except Exception as e:  # noqa: BLE001 (each store's own error type)
        assert words in str(e)
    else:
        assert words in caplog.text
    assert path.read_bytes() == newer, "the newer file was changed"
    assert not list(hub.rglob("*.corrupt-*")), "the newer file was taken for damaged"

    # The hub's check before a start.
    with pytest.raises(stateversion.NewerState) as refused:
        stateversion.check_hub(hub)
    assert str(refused.value) == words
    with pytest.raises(SystemExit) as ended:
        stateversion.refuse_newer_at_start(hub)
    assert str(ended.value.code) == f"gpulab cannot start: {words}."
    assert path.read_bytes() == newer


def test_a_newer_file_is_never_written_over_by_a_change(tmp_path):
    from gpulab_hub.images import project as image_state
    from gpulab_hub.sharing import public
    from gpulab_hub.ssh import keys as sshkeys

    hub = home_from(FIXTURES[-1], tmp_path)
    layout = fixture_script._layout(hub)
    links = hub / "public-links.json"
    newer = make_newer(links, stateversion.KINDS["public-links"].current)
    with pytest.raises(Exception, match="written by a newer gpulab"):
        public.store(hub).create("alice", "thesis", "nb.ipynb", 3600)
    assert links.read_bytes() == newer

    keys = hub / "ssh" / "keys" / "alice.json"
    newer = make_newer(keys, stateversion.KINDS["ssh-keys"].current)
    with pytest.raises(sshkeys.KeyRefused, match="written by a newer gpulab"):
        sshkeys.KeyStore(keys.parent).add("alice", fixture_script.key_text(9))
    assert keys.read_bytes() == newer

    from gpulab_hub import projects

    image = hub / "projects" / "alice" / "thesis" / "image.json"
    newer = make_newer(image, stateversion.KINDS["project-image"].current)
    project = projects.Project(hub.parent / "projects", "alice", "thesis", layout.state_root)
    with pytest.raises(stateversion.NewerState):
        image_state.record(project, None, failed=True)
    assert image.read_bytes() == newer


def test_a_newer_hub_folder_is_refused(tmp_path):
    hub = home_from(FIXTURES[-1], tmp_path)
    path = hub / stateversion.VERSION_FILE
    path.write_text(f"{stateversion.HUB_FORMAT + 1}\n")
    with pytest.raises(SystemExit) as ended:
        stateversion.refuse_newer_at_start(hub)
    assert (
        str(ended.value.code) == f"gpulab cannot start: {sentence(path, stateversion.HUB_FORMAT)}."
    )
    assert path.read_text() == f"{stateversion.HUB_FORMAT + 1}\n"


def test_a_hub_start_meeting_a_newer_file_ends_with_the_sentence(tmp_path):
    hub = home_from(FIXTURES[-1], tmp_path)
    path = hub / "public-links.json"
    make_newer(path, stateversion.KINDS["public-links"].current)
    env = {
        **os.environ,
        "GPULAB_HOME": str(hub.parent),
        "GPULAB_HUB_IP": "127.0.0.1",  # the hub's address given: no engine is asked
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
    }
    done = subprocess.run(
        [sys.executable, "-m", "jupyterhub", "-f", str(REPO / "jupyterhub_config.py")],
        cwd=hub, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    words = sentence(path, stateversion.KINDS["public-links"].current)
    assert f"gpulab cannot start: {words}." in out
    assert "Traceback" not in out, out
    assert not (hub / "jupyterhub.sqlite").exists(), "the hub went on to its database"


def test_jupyterhubs_upgrade_db_runs_with_gpulabs_configuration(tmp_path):
    """docs/upgrading.md's command for JupyterHub's own tables, on this release's state."""
    hub = home_from(FIXTURES[-1], tmp_path)
    before = files_of(hub)
    env = {
        **os.environ,
        "GPULAB_HOME": str(hub.parent),
        "GPULAB_HUB_IP": "127.0.0.1",
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
    }
    jupyterhub = Path(sys.executable).with_name("jupyterhub")
    done = subprocess.run(
        [str(jupyterhub), "upgrade-db", "-f", str(REPO / "jupyterhub_config.py")],
        cwd=hub, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (hub / "jupyterhub.sqlite").is_file()
    after = files_of(hub)
    assert {k: v for k, v in after.items() if k in before} == before, "a state file changed"


# --- backups carry the formats ------------------------------------------------------


def _backup_of(hub: Path, out: Path) -> Path:
    from traitlets.config import Config

    from gpulab_hub.backup import make

    db = sqlite3.connect(hub / "jupyterhub.sqlite")  # the hub's database, as a start made it
    db.execute("CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, name TEXT)")
    db.commit()
    db.close()
    make.make(
        out, home=hub.parent, hub_dir=hub, config=Config(),
        where=fixture_script._layout(hub), projects=False, environ={}, say=lambda line: None,
    )  # fmt: skip
    return out


def _restore(archive: Path, home: Path) -> None:
    from gpulab_hub.backup import restore

    restore.restore(
        archive, home=home, hub_dir=home / "hub", projects_root=home / "projects",
        force=False, running="", environ={}, say=lambda line: None,
    )  # fmt: skip


def test_a_backup_restores_this_releases_state_record_for_record(tmp_path):
    fixture = FIXTURES[-1]
    hub = home_from(fixture, tmp_path)
    archive = _backup_of(hub, tmp_path / "a.tar.gz")
    _restore(archive, tmp_path / "new")
    got = json.loads(json.dumps(fixture_script.read(tmp_path / "new" / "hub")))
    assert got == json.loads((fixture / "expected.json").read_text())
    assert stateversion.read_hub_format(tmp_path / "new" / "hub") == stateversion.HUB_FORMAT


@pytest.mark.parametrize("name", ["hub", "sharing-policy", "ssh-keys"])
def test_restore_refuses_an_archive_of_newer_state_formats_of_the_same_version(name, tmp_path):
    from test_backup import rewrite

    from gpulab_hub.backup import MANIFEST, BackupError

    hub = home_from(FIXTURES[-1], tmp_path)
    archive = _backup_of(hub, tmp_path / "a.tar.gz")

    def newer_format(items):
        info, data = items[MANIFEST]
        manifest = json.loads(data)
        manifest["state_formats"][name] += 1
        items[MANIFEST] = (info, json.dumps(manifest).encode())

    newer = rewrite(archive, tmp_path / "newer.tar.gz", newer_format)
    mine = stateversion.formats()[name]

    with pytest.raises(BackupError) as refused:
        _restore(newer, tmp_path / "new")
    assert str(refused.value) == (
        f"{newer} ({name} format) was written by a newer gpulab (format {mine + 1}; this "
        f"gpulab reads up to {mine}): upgrade gpulab, or restore a backup made by this version."
    )
    assert not (tmp_path / "new" / "hub").exists()

"""Damaged hub state: each record the hub reads (the GPU allocation record, the
sharing settings, the group-share roles) written truncated, as garbage, as the
wrong type, then read by what reads it at spawn or hub start. Each gives one
clear message naming the file and how to restore it, never a traceback; a
project without GPUs starts whatever the allocation record holds. Every state
write is atomic and durable (the file and its folder are fsynced).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
from faults_kit import PREFIX, RecordedDocker, inventory
from traitlets.config import Config

from gpulab_hub import culling, hubconfig, jsonfile, ssh
from gpulab_hub.doctor import report
from gpulab_hub.gpus import allocator, keeper
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.projects import objects
from gpulab_hub.sharing import groupshares, policy, public

DAMAGE = {
    "empty": b"",
    "truncated": b'{"version": 1, "holdings": {"GPU-0000-fault": [{"owner": "ali',
    "garbage": b"\x00\xff\xfe not json at all",
    "a list": b"[1, 2, 3]",
    "a number": b"42",
}
WRONG = {
    "holdings": [
        {"holdings": []},
        {"holdings": {"GPU-0000-fault": "alice"}},
        {"holdings": {"GPU-0000-fault": [{"owner": 1, "project": "a", "since": 0}]}},
        {"holdings": {"GPU-0000-fault": [{"owner": "alice", "project": "a", "since": "now"}]}},
        {"version": 1},
    ],
    "links": [
        {"links": {"pl_1": {}}},
        {"links": [{"id": "pl_1"}]},
        {"links": ["pl_1"]},
        {"version": 1},
    ],
    "projects": [
        {"projects": ["alice/a"]},
        {"projects": {"alice/a": "yes"}},
        {"projects": {"alice/a": {"collaborators_may_start": "yes"}}},
        {"projects": {"alice/a": {"owner_is": True}}},
    ],
    "roles": [
        {"roles": "gpulab-group-share-ab"},
        {"roles": {"gpulab-group-share-ab": {"description": "d", "scopes": "x"}}},
        {"roles": {"admin": {"description": "d", "scopes": [], "group": "g", "project": "a/b"}}},
    ],
}


def damages(section: str) -> list[tuple[str, bytes]]:
    wrong = [(f"wrong type {n}", json.dumps(d).encode()) for n, d in enumerate(WRONG[section])]
    return [*DAMAGE.items(), *wrong]


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def check_one_clear_message(caplog, path: Path) -> Path:
    """One error naming the file, where it went and how to restore it; the moved file."""
    (aside,) = path.parent.glob(path.name + ".corrupt-*")
    (message,) = errors(caplog)
    assert f"{path} is damaged (" in message, message
    assert f"moved it to {aside.name}" in message and "To restore the old one" in message
    assert "Traceback" not in caplog.text
    return aside


# --- the GPU allocation record ------------------------------------------------------


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    """A 2-GPU host (inventory as plain data), a recorded Docker, the spawner's settings."""
    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: inventory(2))
    gpu_spawner.forget_pending()
    s = gpu_spawner.GpuTraits(allocations_file=str(tmp_path / "hub" / "gpu-allocations.json"))
    yield s, RecordedDocker()
    gpu_spawner.forget_pending()


def reserve(s, dk, owner, project, count):
    return gpu_spawner.reserve(s, dk, PREFIX, allocator.Request(owner, project, count))


@pytest.mark.parametrize("name, text", damages("holdings"), ids=[n for n, _ in damages("holdings")])
def test_damaged_allocation_record_is_rebuilt_from_the_containers(gpu_host, caplog, name, text):
    s, dk = gpu_host
    alice, _ = reserve(s, dk, "alice", "a", 1)
    dk.start(dk.create("alice", "a", alice))  # alice's project runs on its GPU
    gpu_spawner.forget_pending()  # a hub restart: only the container says so now
    path = Path(s.allocations_file)
    path.write_bytes(text)
    cpu, none = reserve(s, dk, "carol", "cpu", 0)  # a project without GPUs starts
    assert cpu == objects.GpuAssignment() and none == []
    bob, _ = reserve(s, dk, "bob", "b", 1)
    assert bob.uuids != alice.uuids, "the damaged record cost alice her GPU"
    check_one_clear_message(caplog, path)
    held = gpu_spawner.store_of(s).holdings()
    assert {u: [h.key for h in hs] for u, hs in held.items()} == {
        alice.uuids[0]: [("alice", "a")],
        bob.uuids[0]: [("bob", "b")],
    }


def test_unreadable_allocation_record_blocks_gpu_spawns_clearly_and_cpu_spawns_not(
    gpu_host, caplog
):
    s, dk = gpu_host
    path = Path(s.allocations_file)
    path.mkdir(parents=True)  # not a file at all: reading it fails (as EIO or EACCES would)
    assert reserve(s, dk, "carol", "cpu", 0) == (objects.GpuAssignment(), [])
    assert gpu_spawner.release(s, "carol", "cpu") == []  # a stop goes on as well
    with pytest.raises(allocator.AllocationError) as e:
        reserve(s, dk, "bob", "b", 1)
    assert str(e.value).startswith(f"The GPU allocation record {path} cannot be read (")
    assert "give the hub's account read and write access to it" in str(e.value)
    assert all(str(path) in m for m in errors(caplog)) and "Traceback" not in caplog.text


def test_damaged_allocation_record_read_without_docker_says_how_it_is_repaired(tmp_path):
    """`gpulab gpus` reads the record without rebuilding it: it refuses, saying how."""
    path = tmp_path / "gpu-allocations.json"
    path.write_bytes(DAMAGE["truncated"])
    with pytest.raises(allocator.AllocationError) as e:
        allocator.AllocationStore(path).holdings()
    assert f"{path} is damaged (not JSON" in str(e.value) and "next GPU spawn" in str(e.value)
    assert path.read_bytes() == DAMAGE["truncated"]  # left for the spawner to repair


# --- the sharing settings -----------------------------------------------------------


def test_sharing_settings_the_hub_cannot_read_give_the_least_allowed(tmp_path, caplog):
    """A database gone or unreadable: nobody may start or reshare, and the log says why;
    a change says it was not saved instead of pretending."""
    store = policy.SharingPolicyStore(f"sqlite:///{tmp_path / 'gone.sqlite'}")
    assert store.get("alice", "a") == policy.ProjectSharing()
    assert store.snapshot() == {}
    assert "The sharing settings in sqlite:" in errors(caplog)[0]
    with pytest.raises(policy.SharingPolicyStore.Error, match="cannot be used now"):
        store.set("alice", "a", collaborators_may_start=True)
    assert not (tmp_path / "gone.sqlite").exists()


# --- public notebook links -------------------------------------------------------------


@pytest.mark.parametrize("name, text", damages("links"), ids=[n for n, _ in damages("links")])
def test_damaged_public_links_stop_working_with_one_message(tmp_path, caplog, name, text):
    path = tmp_path / "public-links.json"
    path.write_bytes(text)
    store = public.PublicLinkStore(path)
    assert store.find("x" * 43) is None  # no link, no traceback
    aside = check_one_clear_message(caplog, path)
    assert aside.read_bytes() == text
    assert "every public notebook link stopped working" in errors(caplog)[0]
    code, _ = store.create("alice", "a", "nb.ipynb", 3600)
    assert public.PublicLinkStore(path).find(code) is not None  # a new link works


# --- the group-share roles, read when the hub starts --------------------------------


@pytest.mark.parametrize("name, text", damages("roles"), ids=[n for n, _ in damages("roles")])
def test_hub_starts_with_damaged_group_share_roles(tmp_path, caplog, name, text):
    hub = tmp_path / "hub"
    hub.mkdir()
    path = hub / groupshares.FILE_NAME
    path.write_bytes(text)
    c = Config()
    hubconfig.apply(c, {"GPULAB_HOME": str(tmp_path)}, images_dir="images")
    # no group-share role loaded from it: only gpulab's own roles
    assert [r["name"] for r in c.JupyterHub.load_roles] == [
        "user",
        culling.SERVICE,
        keeper.SERVICE,
        ssh.SERVICE,
    ]
    check_one_clear_message(caplog, path)
    assert "opens the project's Share page" in errors(caplog)[0]
    assert json.loads(path.read_text()) == {"version": 1, "roles": {}}


def test_hub_starts_with_unreadable_group_share_roles(tmp_path, caplog):
    hub = tmp_path / "hub"
    (hub / groupshares.FILE_NAME).mkdir(parents=True)
    c = Config()
    hubconfig.apply(c, {"GPULAB_HOME": str(tmp_path)}, images_dir="images")
    # no group-share role loaded from it: only gpulab's own roles
    assert [r["name"] for r in c.JupyterHub.load_roles] == [
        "user",
        culling.SERVICE,
        keeper.SERVICE,
        ssh.SERVICE,
    ]
    (message,) = errors(caplog)
    assert "The group-share roles file" in message and "cannot be read" in message


# --- every write atomic and durable -------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch):
    """The kinds of what os.fsync was called on: 'file' or 'folder'."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd):
        seen.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_record_writes_are_durable(tmp_path, fsyncs):
    jsonfile.write_atomic(tmp_path / "r.json", {"a": 1})
    assert fsyncs == ["file", "folder"]
    fsyncs.clear()
    public.store(tmp_path).create("alice", "a", "nb.ipynb", 3600)
    assert fsyncs == ["file", "folder"]
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"


def test_doctor_report_is_written_atomically_and_durably(tmp_path, fsyncs):
    path = tmp_path / "hub" / "doctor-report.json"
    report.save({"exit_code": 0, "findings": []}, path)
    assert fsyncs == ["file", "folder"]
    assert report.load_last(path) == {"exit_code": 0, "findings": []}
    assert [p.name for p in path.parent.iterdir()] == ["doctor-report.json"]


def test_a_failed_write_leaves_the_old_record(tmp_path):
    path = tmp_path / "r.json"
    jsonfile.write_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        jsonfile.write_atomic(path, {"a": object()})  # fails half-way through the dump
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_deleting_a_project_completes_with_a_damaged_gpu_record(tmp_path, caplog):
    from gpulab_hub.workflows import deletion

    gpus = tmp_path / "hub" / "gpu-allocations.json"
    gpus.parent.mkdir()
    gpus.write_bytes(DAMAGE["truncated"])
    (tmp_path / "projects" / "alice" / "old").mkdir(parents=True)
    place = deletion.Place(
        projects_root=tmp_path / "projects",
        state_root=tmp_path / "hub" / "projects",
        data_root=tmp_path / "data",
        hub_dir=tmp_path / "hub",
        archive=True,
        allocations_file=gpus,
        prefix=PREFIX,
        hf_volume=f"{PREFIX}-hf-alice",
    )
    done = deletion.project_files(place, "alice", "old")
    assert not (tmp_path / "projects" / "alice" / "old").exists() and done
    (message,) = errors(caplog)
    assert "GPU holdings of alice/old not released now" in message and str(gpus) in message

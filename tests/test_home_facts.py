"""What the home page says about projects beyond JupyterHub's own state (home/facts.py):
GPUs from the allocator's record, the last build from the image record, and where a
deleted project's files were archived. Real files in a temporary hub folder."""

from __future__ import annotations

from pathlib import Path

from gpulab_hub import gpus, hubsettings
from gpulab_hub.gpus import allocator
from gpulab_hub.home import facts
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project

OWNER = "dana"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def where(tmp_path: Path) -> hubsettings.Layout:
    return hubsettings.Layout(
        records_dir=tmp_path / "hub",
        projects_root=tmp_path / "projects",
        data_root=tmp_path / "data",
        state_root=tmp_path / "hub" / "projects",
        allocations_file=tmp_path / "hub" / "gpu-allocations.json",
        image_repo="gpulab/project",
        base_image="gpulab/base:latest",
        allowed_base_images=("gpulab/base:latest",),
        prefix="gpulab",
        network="gpulab-net",
    )


def test_gpus_and_builds_of_each_project(tmp_path, monkeypatch):
    w = where(tmp_path)
    device = gpus.Device(index="0", uuid=UUID, name="NVIDIA H100 80GB HBM3",
                         memory_total=80 << 30, capability="9.0")  # fmt: skip
    store = allocator.AllocationStore(w.allocations_file)
    store.allocate([device], allocator.Request(OWNER, "train", count=1), allocator.Policy())
    tag = "gpulab/project:0123456789abcdef"
    projectimage.record(Project(w.projects_root, OWNER, "train", w.state_root), tag, False)
    broken = Project(w.projects_root, OWNER, "broken", w.state_root)
    projectimage.record(broken, tag, False)
    projectimage.record(broken, None, True)
    projectimage.record(Project(w.projects_root, OWNER, "never", w.state_root), None, True)

    # This host (CPU only) does not see the device the record names: it says so.
    monkeypatch.setattr(facts, "_inventory", None)
    found = facts.projects(w, OWNER, ["train", "broken", "never", "fresh"])
    assert found["train"].gpus == (f"a GPU not seen on this host now ({UUID})",)
    assert found["train"].build.state == "ok" and found["train"].build.good_iso.endswith("Z")
    assert found["broken"].gpus == () and found["broken"].build.state == "failed"
    assert found["broken"].build.good_at is not None  # it starts from the last good image
    assert found["never"].build == facts.Build("failed")
    assert found["fresh"].build == facts.Build("none") and found["fresh"].gpus_unknown == ""

    # Where the host has it, the device is named as `gpulab gpus` names it.
    monkeypatch.setattr(gpus, "inventory", lambda: gpus.Inventory(devices=[device]))
    monkeypatch.setattr(facts, "_inventory", None)
    assert facts.projects(w, OWNER, ["train"])["train"].gpus == ("GPU 0 (NVIDIA H100 80GB HBM3)",)

    # A damaged record: the page says so instead of failing.
    w.allocations_file.write_text("{not json")
    damaged = facts.projects(w, OWNER, ["train"])["train"]
    assert damaged.gpus == () and "damaged" in damaged.gpus_unknown


def test_archive_of_a_deleted_project_is_the_owners_newest(tmp_path):
    w = where(tmp_path)
    assert facts.archived_as(w, OWNER, "scratch") == ""  # nothing deleted yet
    deleted = w.deleted_dir
    for name in (
        f"{OWNER}-20261122T100000Z",
        f"{OWNER}-20261123T010000Z",
        f"{OWNER}-20261123T010000Z-2",
        f"{OWNER}-x-20261124T000000Z",  # the user "dana-x", not dana
        f"{OWNER}-20261125T000000Z",  # dana's, of another project
    ):
        (deleted / name / "projects").mkdir(parents=True)
    for name in (
        f"{OWNER}-20261122T100000Z",
        f"{OWNER}-20261123T010000Z",
        f"{OWNER}-20261123T010000Z-2",
        f"{OWNER}-x-20261124T000000Z",
    ):
        (deleted / name / "projects" / "scratch").mkdir()
    (deleted / f"{OWNER}-20261125T000000Z" / "projects" / "other").mkdir()
    assert facts.archived_as(w, OWNER, "scratch") == f"deleted/{OWNER}-20261123T010000Z-2"
    assert facts.archived_as(w, OWNER, "other") == f"deleted/{OWNER}-20261125T000000Z"
    assert facts.archived_as(w, "dana-x", "scratch") == "deleted/dana-x-20261124T000000Z"
    assert facts.archived_as(w, OWNER, "gone") == ""


def test_running_jobs_are_counted_from_the_project_folder_as_hostile_files(tmp_path):
    w = where(tmp_path)
    project = Project(w.projects_root, OWNER, "train", w.state_root)
    jobs = project.path / "jobs"
    jobs.mkdir(parents=True)

    def job(job_id: str, *files: str) -> Path:
        (jobs / job_id).mkdir()
        for name in files:
            (jobs / job_id / name).write_text("{}")
        return jobs / job_id

    job("20261123-010101-aaaa", "job.json", "state.json")  # running
    job("20261123-010102-bbbb", "job.json", "state.json", "result.json")  # ended
    job("20261123-010103-cccc", "job.json")  # never started
    linked = job("20261123-010104-dddd", "job.json")
    (linked / "state.json").symlink_to(jobs / "20261123-010101-aaaa" / "state.json")
    job("not-a-job", "state.json")
    found = facts.projects(w, OWNER, ["train", "idle"], running=("train",))
    assert found["train"].jobs_running == 1
    assert found["idle"].jobs_running == 0
    # A jobs folder that is a link to elsewhere is not followed.
    other = tmp_path / "elsewhere"
    other.mkdir()
    jobs.rename(tmp_path / "moved")
    jobs.symlink_to(tmp_path / "moved")
    assert facts.projects(w, OWNER, ["train"], running=("train",))["train"].jobs_running == 0

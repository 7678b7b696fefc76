"""Records kept per project that must follow it: deleting a project or an account
forgets its multi-node jobs, so a new project of the same name starts with none."""

from __future__ import annotations

from gpulab_hub.cluster import jobs as cluster_jobs
from gpulab_hub.projects import deletion


def place(tmp_path) -> deletion.Place:
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    return deletion.Place(
        projects_root=tmp_path / "projects",
        state_root=hub_dir / "projects",
        data_root=tmp_path / "data",
        hub_dir=hub_dir,
        archive=False,
        allocations_file=hub_dir / "gpu-allocations.json",
        prefix="gpulabrec",
        hf_volume="gpulabrec-hf-alice",
    )


def jobs_of(p: deletion.Place) -> list[tuple[str, str, str]]:
    entries = cluster_jobs.record_of(p.hub_dir)._read().values()
    return sorted((e["owner"], e["project"], e["job"]) for e in entries)


def test_deleting_a_project_forgets_its_multi_node_jobs_and_no_one_elses(tmp_path):
    p = place(tmp_path)
    rows = [("alice", "one", "a1"), ("alice", "two", "a2"), ("bob", "one", "b1")]
    cluster_jobs.record_of(p.hub_dir)._write(
        {
            str(100 + n): {"owner": o, "project": pr, "job": j, "addresses": []}
            for n, (o, pr, j) in enumerate(rows)
        }
    )
    deletion.project_files(p, "alice", "one")
    assert jobs_of(p) == [("alice", "two", "a2"), ("bob", "one", "b1")]
    deletion._forget_records(p, "alice", None)  # an account deleted (user_files)
    assert jobs_of(p) == [("bob", "one", "b1")]


def test_no_jobs_record_none_is_made(tmp_path):
    p = place(tmp_path)
    deletion.project_files(p, "alice", "one")
    assert not (p.hub_dir / cluster_jobs.RECORD).exists()

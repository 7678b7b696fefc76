"""``gpulab doctor`` on a cluster: every node must see the hub's projects and data
folders as the same storage (no Slurm here: the probe's part of the script runs under
bash on this machine; test_doctor_cluster.py runs it on the test cluster's nodes).

A project container on a node mounts its folder with ``--mount`` (a folder missing on
the node is an error there, never a new empty folder); the doctor finds the node that
lacks the storage before a user does: the hub writes a file with random words in each
folder, the probe reads them back on each node.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from gpulab_hub.cluster import ClusterError
from gpulab_hub.doctor import cluster, cluster_probe
from gpulab_hub.doctor.findings import FAIL, OK


def probe_storage(storage) -> list[list[str]]:
    """What the probe's storage part says on this machine."""
    job = cluster_probe.ProbeJob(prefix="gpulabt", storage=storage)
    text = "say() { printf 'gpulab-doctor %s\\n' \"$*\"; }\n" + cluster_probe._storage_block(job)
    done = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return [line.split(" ")[1:] for line in done.stdout.splitlines()]


def result(node: str, said: list[list[str]]) -> cluster_probe.Result:
    return cluster_probe.Result(node, job_id=7, said=said, ended=True)


def test_markers_are_read_back_and_removed(tmp_path):
    projects, data = tmp_path / "projects", tmp_path / "data"
    projects.mkdir()
    data.mkdir()
    with cluster.storage_markers((projects, data, tmp_path / "absent")) as storage:
        assert [s[0] for s in storage] == [str(projects), str(data)]  # absent: not asked
        for folder, marker, words in storage:
            assert (tmp_path / folder / marker).read_text() == words
            assert oct((tmp_path / folder / marker).stat().st_mode & 0o777) == "0o644"
        said = probe_storage(storage)
        assert said == [["storage", f, w] for f, _, w in storage]
        job = cluster_probe.ProbeJob(prefix="gpulabt", storage=storage)
        (found,) = cluster_probe._storage(job, [result("n1", said), result("n2", said)])
    assert found.status == OK
    assert found.seen == f"the hub's folders {projects}, {data} are the same storage on n1, n2"
    assert sorted(os.listdir(projects)) == [] and sorted(os.listdir(data)) == []


def test_a_node_without_the_storage_is_named_with_what_to_do(tmp_path):
    hub = tmp_path / "hub"
    (hub / "projects").mkdir(parents=True)
    (hub / "data").mkdir()
    with cluster.storage_markers((hub / "projects", hub / "data")) as storage:
        good = probe_storage(storage)
        # Node 2's view: the projects folder is a local, empty folder of its own, and
        # the data folder is not there at all.
        (hub / "projects" / storage[0][1]).unlink()
        (hub / "data" / storage[1][1]).unlink()
        (hub / "data").rmdir()
        bad = probe_storage(storage)
        job = cluster_probe.ProbeJob(prefix="gpulabt", storage=storage)
        found = cluster_probe._storage(job, [result("n1", good), result("n2", bad)])
    assert [(f.id, f.status) for f in found] == [
        ("cluster.storage", OK), ("cluster.storage.n2", FAIL)
    ]
    assert found[0].seen.endswith("are the same storage on n1")
    assert found[1].seen == (
        f"node n2 does not see the hub's folders: {hub}/projects there is another folder "
        f"(a file the hub wrote in it just now is not in it); {hub}/data does not exist "
        "there. Projects started there would fail, or work in folders that are not the "
        "users' files"
    )
    assert "at the same path as on the hub" in found[1].fix


def test_a_planted_link_is_neither_followed_nor_believed(tmp_path):
    projects = tmp_path / "projects"
    projects.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("0123456789abcdef0123456789abcdef")
    with cluster.storage_markers((projects,)) as storage:  # another user's link in its place
        ((folder, marker, words),) = storage
        (projects / marker).unlink()
        (projects / marker).symlink_to(elsewhere)
        said = probe_storage(storage)
        assert said == [["storage", folder, "other-folder"]]
    assert elsewhere.read_text() == "0123456789abcdef0123456789abcdef"
    # A link where the hub writes: refused, not written through.
    link_dir = tmp_path / "linked"
    link_dir.symlink_to(projects)
    with cluster.storage_markers((link_dir,)) as storage:
        assert storage == ()
    assert os.listdir(projects) == []  # the planted link went with the doctor's marker


@pytest.mark.parametrize(
    "storage",
    [
        (("/srv/gpulab/projects", "../../etc/passwd", "ab"),),
        (("/srv/gpulab/projects", ".gpulab-doctor-$(id)", "ab"),),
        (("/srv/gpulab/pro jects", ".gpulab-doctor-0123456789abcdef", "ab"),),
        (("relative/projects", ".gpulab-doctor-0123456789abcdef", "ab"),),
    ],
    ids=["marker-path", "marker-shell", "folder-space", "folder-relative"],
)
def test_the_probe_refuses_paths_it_did_not_make(storage):
    with pytest.raises(ClusterError):
        cluster_probe._storage_block(cluster_probe.ProbeJob(prefix="gpulabt", storage=storage))

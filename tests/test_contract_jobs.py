"""Job ids: one pattern (gpulab_contract.jobs.JOB_ID) for the project that makes them
and the hub that names them in routes, Slurm job names and the Home page."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpulab_contract.jobs import JOB_ID, new_id
from gpulab_hub.cluster import ClusterError, hubjobs, jobsapi, multinode
from gpulab_jupyter.jobs import model

ROOT = Path(__file__).resolve().parent.parent


def test_a_new_id_is_one_every_reader_accepts():
    job_id = new_id()
    assert JOB_ID.fullmatch(job_id)
    assert model.check_id(job_id) == job_id
    req = multinode.TrainRequest(job_id, "train.py")
    assert multinode.check_request(req, multinode.Limits()) == req


@pytest.mark.parametrize(
    "bad",
    ["2026112３-141502-a1b2", "20261123-141502-a1b2\n", "20261123-141502-A1B2", "../x", ""],
)
def test_anything_else_is_refused_on_both_sides(bad):
    """Full-width and other non-ASCII digits (which \\d would take) included."""
    assert not JOB_ID.fullmatch(bad)
    with pytest.raises(model.JobError):
        model.check_id(bad)
    with pytest.raises(ClusterError, match="is not a job id"):
        multinode.check_request(multinode.TrainRequest(bad, "train.py"), multinode.Limits())


def test_the_pattern_is_written_down_once():
    """No module spells the id's form itself (the hub's copy once drifted to \\d)."""
    assert jobsapi.JOB_ID == JOB_ID.pattern
    assert hubjobs._GPULAB_JOB == JOB_ID.pattern
    spelled = []
    for top in ("spawner/gpulab_hub", "extensions/gpulab_jupyter"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if "{8}-" in node.value and "{6}-" in node.value:
                        spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert spelled == []

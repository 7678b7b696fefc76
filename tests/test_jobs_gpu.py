"""On a GPU host with two GPUs: a real two-process DDP run started through
``%gpu_job run --gpus all`` (torchrun, one process per GPU), each rank on its own
GPU, the loss going down; and the job's GPU use seen by NVML while it runs.

Run on the GPU machine with ``pytest -m gpu tests/test_jobs_gpu.py -s``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from gpulab_jupyter.jobs.local import LocalEngine

pytestmark = [pytest.mark.gpu]

SCRIPT = Path(__file__).with_name("fixtures") / "jobs" / "train_ddp.py"


def cuda_gpus() -> int:
    torch = pytest.importorskip("torch")
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_ddp_on_every_gpu_through_the_magic(tmp_path, monkeypatch):
    if cuda_gpus() < 2:
        pytest.skip("needs two GPUs")
    from IPython.core.interactiveshell import InteractiveShell

    shutil.copy(SCRIPT, tmp_path / "train_ddp.py")
    monkeypatch.setenv("GPULAB_PROJECT_DIR", str(tmp_path))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpulab_jupyter.magics")
    shell.run_line_magic(
        "gpu_job", "run --gpus all --precision auto --name ddp train_ddp.py --steps 400"
    )
    engine = LocalEngine(tmp_path)
    (record,) = engine.list()
    assert record.argv[1:5] == ["-m", "torch.distributed.run", "--standalone",
                                f"--nproc-per-node={cuda_gpus()}"]  # fmt: skip
    # While it runs, NVML sees its processes on the GPUs.
    from nvitop import Device

    seen = set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = engine.status(record.id).state
        for d in Device.all():
            if d.processes():
                seen.add(d.index)
        if state not in ("starting", "running"):
            break
        time.sleep(0.5)
    log = engine.logs(record.id)
    print("\n" + log)
    assert engine.status(record.id).state == "succeeded", log
    ranks = [json.loads((tmp_path / "ddp-out" / f"rank{r}.json").read_text())
             for r in range(cuda_gpus())]  # fmt: skip
    assert len({r["uuid"] for r in ranks}) == len(ranks)  # each rank on its own GPU
    assert {r["device"] for r in ranks} == set(range(len(ranks)))
    for r in ranks:
        assert r["last_loss"] < 0.5 * r["first_loss"], r
    assert "precision=bf16" in log  # H100/H200: compute capability 9.0
    print(f"GPUs with job processes seen by NVML: {sorted(seen)}")
    assert len(seen) == len(ranks)


def test_a_jobs_gpu_processes_name_the_job_and_keep_the_project(tmp_path):
    """What the GPU panel and the idle culler read, on real GPUs: the sampler's GPU
    processes, each named with the running job it belongs to (the processes route's
    job_of), and a busy GPU counted as activity."""
    if cuda_gpus() < 1:
        pytest.skip("needs a GPU")
    from gpulab_jupyter.activity import ActivityReporter
    from gpulab_jupyter.handlers import job_of
    from gpulab_jupyter.jobs.local import running_supervisors
    from gpulab_jupyter.jobs.model import JobRequest
    from gpulab_jupyter.sampler import GPUSampler

    shutil.copy(SCRIPT, tmp_path / "train_ddp.py")
    engine = LocalEngine(tmp_path)
    record = engine.start(JobRequest("train_ddp.py", ("--steps", "20000"), gpus="all"))
    sampler = GPUSampler(process_interval=1.0)
    sampler.start()
    try:
        named, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline and len(named) < cuda_gpus():
            time.sleep(1)
            jobs = running_supervisors(engine)
            named = [
                (row["pid"], job_of(row["pid"], row["ancestors"], jobs))
                for row in sampler.processes()["processes"]
            ]
        print(f"\nGPU processes and their job: {named}")
        # a process per GPU at least (a rank may open a context on a second GPU too, as
        # seen on 2 x H200 with torch 2.11), and every one named with the job
        assert len(named) >= cuda_gpus() and {job for _, job in named} == {record.id}
        busy = ActivityReporter({}, engine, sampler)
        deadline = time.monotonic() + 30
        while not busy.gpu_busy() and time.monotonic() < deadline:
            time.sleep(1)
        gpus = sampler.history(time.time() - 60)["gpus"]
        print("GPU utilization over the last minute:",
              {u[-8:]: g["utilization"][-5:] for u, g in gpus.items()})  # fmt: skip
        assert busy.gpu_busy()
    finally:
        engine.stop(record.id)
        sampler.stop()

"""Jobs, side by side with their anchors, in one run.

    .venv/bin/python benchmarks/jobs.py cpu            # any machine
    python benchmarks/jobs.py ddp --rounds 3           # a GPU host with 2+ GPUs and torch

cpu: the overhead of starting a script as a job (gpulab-job's engine: a supervisor
     in a session of its own, records, log) against running it directly
     (``python script.py``), each timed from the call to the script's end, over
     --n runs, alternating; and the cost of one activity check (what each project
     server does every few seconds for the idle culler) with 0, 50 and 200 jobs.
ddp: mean DDP step time of tests/fixtures/jobs/train_ddp.py on every GPU through
     gpulab's launch (``%gpu_job run --gpus all``'s engine) against plain
     ``torchrun --standalone --nproc-per-node=<GPUs>``, alternating, --rounds each;
     the last line is ``ddp_step_ratio=<gpulab / plain>`` (target <= 1.02).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "extensions"))

from gpulab_jupyter.jobs.local import LocalEngine  # noqa: E402
from gpulab_jupyter.jobs.model import FINISHED, JobRequest  # noqa: E402

SCRIPT = "import sys\nprint('hello from', sys.argv[0])\n"
DDP = REPO / "tests" / "fixtures" / "jobs" / "train_ddp.py"


def wait_done(engine: LocalEngine, job_id: str, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    while (state := engine.status(job_id).state) not in FINISHED:
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} did not end within {timeout} s")
        time.sleep(0.02)
    return state


def cpu(n: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpulab-jobs-bench-"))
    try:
        (folder / "hello.py").write_text(SCRIPT)
        engine = LocalEngine(folder)
        direct, job = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "hello.py"], cwd=folder, check=True,
                           capture_output=True)  # fmt: skip
            direct.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            record = engine.start(JobRequest("hello.py"))
            assert wait_done(engine, record.id) == "succeeded", engine.logs(record.id)
            job.append(time.perf_counter() - t0)
        d, j = statistics.median(direct), statistics.median(job)
        print(f"script run directly: median {d:.3f} s over {n}")
        print(f"script run as a job: median {j:.3f} s over {n}")
        print(f"job_start_overhead_s={j - d:.3f}")
        for count in (0, 50, 200):
            many = Path(tempfile.mkdtemp(prefix="gpulab-jobs-many-"))
            (many / "hello.py").write_text(SCRIPT)
            e = LocalEngine(many)
            for _ in range(count):
                wait_done(e, e.start(JobRequest("hello.py")).id)
            import asyncio

            from gpulab_jupyter.activity import ActivityReporter

            reporter = ActivityReporter({}, e, None)
            t0 = time.perf_counter()
            rounds = 20
            for _ in range(rounds):
                asyncio.run(reporter.check())
            cost = (time.perf_counter() - t0) / rounds
            print(f"activity check with {count} jobs: {1000 * cost:.2f} ms")
            shutil.rmtree(many)
    finally:
        shutil.rmtree(folder)


def ddp(rounds: int, steps: int) -> None:
    import torch

    gpus = torch.cuda.device_count()
    folder = Path(tempfile.mkdtemp(prefix="gpulab-ddp-bench-"))
    shutil.copy(DDP, folder / "train_ddp.py")
    engine = LocalEngine(folder)
    plain, ours = [], []

    def step_ms(out: str) -> float:
        ranks = [json.loads((folder / out / f"rank{r}.json").read_text()) for r in range(gpus)]
        return 1000 * statistics.mean(r["step_s"] for r in ranks)

    for i in range(rounds):
        out = f"plain-{i}"
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={gpus}", "train_ddp.py", "--steps", str(steps), "--out", out],
            cwd=folder, check=True, capture_output=True,
        )  # fmt: skip
        plain.append(step_ms(out))
        out = f"gpulab-{i}"
        record = engine.start(
            JobRequest("train_ddp.py", ("--steps", str(steps), "--out", out), gpus="all")
        )
        assert wait_done(engine, record.id) == "succeeded", engine.logs(record.id)
        ours.append(step_ms(out))
        print(f"round {i}: plain torchrun {plain[-1]:.3f} ms/step, gpulab job {ours[-1]:.3f}")
    p, g = statistics.median(plain), statistics.median(ours)
    print(f"{gpus} GPUs, {steps} steps: plain median {p:.3f} ms, gpulab median {g:.3f} ms")
    print(f"ddp_step_ratio={g / p:.3f}")
    shutil.rmtree(folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("cpu").add_argument("--n", type=int, default=10)
    d = sub.add_parser("ddp")
    d.add_argument("--rounds", type=int, default=3)
    d.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    if args.what == "cpu":
        cpu(args.n)
    else:
        ddp(args.rounds, args.steps)


if __name__ == "__main__":
    main()

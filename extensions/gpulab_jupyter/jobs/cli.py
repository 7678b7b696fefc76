"""``gpulab-job``: run, list, follow, stop and re-run jobs from a terminal in the
project (``%gpu_job`` in a notebook takes the same words).

``run`` takes a script or notebook (``run train.py --epochs 3``) or, after ``--``, any
command (``run --gpus all -- accelerate launch train.py``): the ``--`` comes before the
first word that is not one of ``run``'s own options.
"""

from __future__ import annotations

import argparse
import sys
import time

from gpulab_contract.environment import project_dir
from gpulab_jupyter.jobs.model import FINISHED, JobError, JobRecord, JobRequest, command_text

USAGE_EXAMPLES = """examples:
  gpulab-job run train.py --epochs 3
  gpulab-job run --gpus all --precision auto train.py   (torchrun, one process per GPU)
  gpulab-job run -- bash train.sh                       (any command, as nohup would)
  gpulab-job run --gpus all -- accelerate launch train.py
  gpulab-job run -- deepspeed train.py --deepspeed ds.json
  gpulab-job run -- python -m pkg.train
  gpulab-job run --nodes 2 --gpus-per-node 4 train.py   (on a Slurm cluster: 2 machines)
  gpulab-job run analysis.ipynb                         (executed copy next to it)
  gpulab-job list
  gpulab-job logs -f 20261123-141502-a1b2
  gpulab-job stop 20261123-141502-a1b2
"""


class _RaisingParser(argparse.ArgumentParser):
    """For ``%gpu_job``: a mistake is an error message, not an exit of the kernel."""

    def error(self, message):
        raise JobError(f"{self.prog}: {message} (see {self.prog} --help)")


def parser(prog: str = "gpulab-job", raise_errors: bool = False) -> argparse.ArgumentParser:
    cls = _RaisingParser if raise_errors else argparse.ArgumentParser
    p = cls(
        prog=prog,
        description="Run a script, a notebook or any command as a job that outlives the browser.",
        epilog=USAGE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=cls)
    run = sub.add_parser("run", help="start a job")
    run.add_argument("--gpus", default="", help="'all': torchrun, one process per GPU")
    run.add_argument("--precision", default="", help="auto, bf16, fp16 or fp32")
    run.add_argument(
        "--nodes", type=int, default=0, help="on a Slurm cluster: torchrun on this many machines"
    )
    run.add_argument(
        "--gpus-per-node", type=int, default=0, help="with --nodes: GPUs of each machine"
    )
    run.add_argument("--name", default="", help="a name to show in lists")
    run.add_argument("--follow", "-f", action="store_true", help="then follow its output")
    run.add_argument(
        "target",
        nargs="?",
        default="",
        help="a .py script or .ipynb notebook in the project; or, after --, any command",
    )
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    sub.add_parser("list", help="the project's jobs, newest first")
    for name, text in (("status", "one job"), ("stop", "stop a job"), ("rerun", "run again")):
        sub.add_parser(name, help=text).add_argument("id")
    logs = sub.add_parser("logs", help="a job's output")
    logs.add_argument("id")
    logs.add_argument("--follow", "-f", action="store_true", help="until the job ends")
    return p


def parse(argv: list[str], prog: str = "gpulab-job", raise_errors: bool = False):
    """``argv`` parsed; ``run``'s command (the words after a ``--`` that comes before any
    script) in ``.run_command``, [] for a script or notebook."""
    p = parser(prog, raise_errors)
    argv = list(argv)
    if argv[:1] == ["run"] and "--" in argv:
        cut = argv.index("--")
        args = p.parse_args(argv[:cut])
        if not args.target:  # only run's own options before --: a command follows
            args.run_command = argv[cut + 1 :]
            if not args.run_command:
                p.error("nothing to run after --: give a command, e.g. -- bash train.sh")
            return args
    args = p.parse_args(argv)
    if args.command == "run":
        if not args.target:
            p.error("name a script or notebook, or give a command after -- (-- bash train.sh)")
        args.run_command = []
    return args


HEADER = ("JOB", "STATE", "TIME", "COMMAND")


def columns(r: JobRecord) -> tuple[str, str, str, str]:
    req = r.request
    what = command_text(req)
    if req.get("name"):
        what = f"{req['name']}: {what}"
    gpus = f" --gpus {req['gpus']}" if req.get("gpus") else ""
    if req.get("nodes"):
        gpus += f" --nodes {req['nodes']} --gpus-per-node {req.get('gpus_per_node', 0)}"
    tail = f" ({r.message})" if r.message else ""
    return r.id, r.state, _duration(r.elapsed), f"{what}{gpus}{tail}"


def _line(cols) -> str:
    job, state, elapsed, what = cols
    return f"{job:<20}  {state:<9} {elapsed:>8}  {what}"


def describe(r: JobRecord) -> str:
    """One job, one line: id, state, time, and what it runs as the user typed it."""
    return _line(columns(r))


def table(records: list[JobRecord]) -> list[str]:
    """``list``'s lines: a header, then one line a job."""
    return [_line(HEADER), *(describe(r) for r in records)]


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def follow(engine, job_id: str, out=None, poll_s: float = 0.5) -> JobRecord:
    """Print the job's output as it comes, until it ends."""
    out = out or sys.stdout
    read = getattr(engine, "stream", None) or engine.logs  # text that only grows
    sent = 0
    while True:
        record = engine.status(job_id)
        text = read(job_id, tail_bytes=1 << 30)
        out.write(text[sent:])
        out.flush()
        sent = len(text)
        if record.state in FINISHED:
            return record
        time.sleep(poll_s)


def request(args) -> JobRequest:
    """The request ``run``'s words make (``parse``)."""
    return JobRequest(
        target=args.target,
        args=tuple(args.args),
        command=tuple(args.run_command),
        gpus=args.gpus,
        precision=args.precision,
        name=args.name,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
    )


def main(argv: list[str] | None = None, engine=None) -> int:
    from gpulab_jupyter.jobs.cluster import engine_for

    args = parse(sys.argv[1:] if argv is None else argv)
    engine = engine or engine_for(project_dir())
    try:
        if args.command == "run":
            record = engine.start(request(args))
            print(f"Started job {record.id}: output in jobs/{record.id}/output.log")
            if record.output:
                print(f"The executed notebook will be {record.output}")
            if args.follow:
                record = follow(engine, record.id)
                print(describe(record))
            return 0 if record.state in ("running", "starting", "succeeded") else 1
        if args.command == "list":
            records = engine.list()
            if not records:
                print("No jobs in this project yet.")
                return 0
            print("\n".join(table(records)))
            return 0
        if args.command == "logs":
            if args.follow:
                follow(engine, args.id)
            else:
                sys.stdout.write(engine.logs(args.id))
            return 0
        record = {"status": engine.status, "stop": engine.stop, "rerun": engine.rerun}[
            args.command
        ](args.id)
        print(describe(record))
        return 0
    except JobError as e:
        print(f"gpulab-job: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

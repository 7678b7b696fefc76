"""``python -m gpulab_jupyter.jobs.node --job <id> --rank <k> --nodes <n> -- <command>``:
one node's part of a multi-node job, in the job's container on that node (the hub's
batch script starts it: gpulab_hub.cluster.multinode).

It runs the command (torchrun) in a process group of its own, writes everything the
command prints to the node's log in the project's ``jobs/<id>/`` folder (the first
node's is the job's ``output.log``, the others' ``output-node<k>.log``), and when the
command ends, the node's result ``node-<k>.json`` (exit code, end time). It runs as
the notebook user in the project's container, so it writes what the project's own
processes could write, and never through a link in the jobs folder. SIGTERM (the
container stopped) goes to the command's whole group, SIGKILL after STOP_GRACE_S.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpulab_contract import environment
from gpulab_jupyter.jobs.model import JOB_ID, JobError, write_json
from gpulab_jupyter.jobs.supervise import STOP_GRACE_S, _log_line

MAX_NODES = 1024


def log_name(rank: int) -> str:
    """The node's log in ``jobs/<id>/`` (gpulab_hub.cluster.multinode.log_name says the
    same; the Jobs panel opens ``output.log``)."""
    return "output.log" if rank == 0 else f"output-node{rank}.log"


def result_name(rank: int) -> str:
    return f"node-{rank}.json"


def job_folder(project: Path, job_id: str) -> Path:
    """``jobs/<id>/`` of the project, made if missing (a job submitted through the hub's
    API has none yet); never a link."""
    if not JOB_ID.fullmatch(job_id):
        raise JobError(f"{job_id!r} is not a job id")
    jobs = project / "jobs"
    for folder in (jobs, jobs / job_id):
        try:
            folder.mkdir()
        except FileExistsError:
            pass
        if folder.is_symlink() or not folder.is_dir():
            raise JobError(f"{folder} is not a folder gpulab writes into (a link?)")
    return jobs / job_id


def _open_log(path: Path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "ab", buffering=0)


def run(project: Path, job_id: str, rank: int, nodes: int, argv: list[str]) -> int:
    folder = job_folder(project, job_id)
    stop = {"asked": 0.0}
    where = f"node {rank} of {nodes} ({socket.gethostname()})"
    with _open_log(folder / log_name(rank)) as log:
        _log_line(log, f"{where}: starting: {' '.join(argv)}")
        try:
            child = subprocess.Popen(
                argv,
                cwd=project,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            _log_line(log, f"{where}: failed: {argv[0]} could not start ({e.strerror})")
            write_json(folder / result_name(rank), {"rank": rank, "exit_code": 127,
                                                    "ended": time.time()})  # fmt: skip
            return 127

        def on_term(signum, frame):
            stop["asked"] = stop["asked"] or time.monotonic()
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        while True:
            try:
                code = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if stop["asked"] and time.monotonic() - stop["asked"] > STOP_GRACE_S:
                    try:
                        os.killpg(child.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        try:  # what the command left behind in its group
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if stop["asked"]:
            words = "stopped"
        elif code == 0:
            words = "succeeded: finished"
        else:
            words = f"failed: exit code {code}" if code > 0 else f"failed: signal {-code}"
        _log_line(log, f"{where}: {words}")
    write_json(
        folder / result_name(rank),
        {"rank": rank, "exit_code": code, "ended": time.time(), "stopped": bool(stop["asked"])},
    )
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpulab-job-node", description=__doc__.split("\n")[0])
    p.add_argument("--job", required=True)
    p.add_argument("--rank", required=True, type=int)
    p.add_argument("--nodes", required=True, type=int)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not 1 <= args.nodes <= MAX_NODES or not 0 <= args.rank < args.nodes:
        p.error("a command after --, and 0 <= rank < nodes")
    project = environment.project_dir(default=os.getcwd())
    try:
        return run(project, args.job, args.rank, args.nodes, command)
    except JobError as e:
        print(f"gpulab-job-node: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

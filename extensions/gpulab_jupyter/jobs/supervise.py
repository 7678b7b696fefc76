"""``python -m gpulab_jupyter.jobs.supervise <job folder>``: runs one job.

Started in a session of its own (so a kernel, a terminal or the Jupyter server that
started it can go away), it starts the job's command in another process group,
streams its output to ``output.log``, and writes ``result.json`` when it ends. A
SIGTERM (``gpulab-job stop``) is passed on to the job's whole process group, then,
after ``STOP_GRACE_S``, a SIGKILL.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpulab_jupyter.jobs.model import read_json, write_json

STOP_GRACE_S = 10.0


def _log_line(log, text: str) -> None:
    log.write(f"[gpulab-job] {time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode())
    log.flush()


def run(folder: Path) -> int:
    job = read_json(folder / "job.json")
    if job is None:
        return 2
    stop = {"asked": 0.0}
    with open(folder / "output.log", "ab", buffering=0) as log:
        _log_line(log, f"starting: {shlex.join(job['argv'])}")
        try:
            child = subprocess.Popen(
                job["argv"],
                cwd=job["extra"]["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:  # the program went away, or is no program
            message = f"{job['argv'][0]} could not start: {e.strerror or e}"
            _log_line(log, f"failed: {message}")
            write_json(
                folder / "result.json",
                {"state": "failed", "exit_code": None, "ended": time.time(), "message": message},
            )
            return 0
        write_json(
            folder / "state.json",
            {"state": "running", "pid": os.getpid(), "child": child.pid, "since": time.time()},
        )

        def on_term(signum, frame):
            stop["asked"] = stop["asked"] or time.monotonic()
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
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
        try:  # what the job left behind in its group (workers of a DataLoader, say)
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if stop["asked"]:
            state, message = "stopped", "stopped by its user"
        elif code == 0:
            state, message = "succeeded", "finished"
        else:
            state = "failed"
            message = f"exit code {code}" if code > 0 else f"killed by signal {-code}"
        _log_line(log, f"{state}: {message}")
    write_json(
        folder / "result.json",
        {"state": state, "exit_code": code, "ended": time.time(), "message": message},
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))

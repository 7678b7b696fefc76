"""The kernel's Python environment: snapshot, torch-stack constraints, pip runs, revert.

pip runs in the kernel's own interpreter (``sys.executable``), always from an
argument list. What pip uninstalls is kept aside (see ``_piprun``), so a failed
install is undone exactly: new distributions are uninstalled and replaced ones
are moved back.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from .piplog import plain
from .spec import is_torch_stack

_DIST_DIR = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(-py[^-]*)?\.(dist|egg)-info$")


@dataclass(frozen=True)
class Dist:
    name: str  # canonical
    version: str
    path: str  # the .dist-info (or .egg-info) folder


def snapshot(paths: list[str] | None = None) -> dict[str, Dist]:
    """Installed distributions as imports see them (first on sys.path wins)."""
    importlib.invalidate_caches()
    found: dict[str, Dist] = {}
    for entry in sys.path if paths is None else paths:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for base in names:
            if base.startswith("~") or not base.endswith(("dist-info", "egg-info")):
                continue
            m = _DIST_DIR.match(base)
            path = os.path.join(os.path.abspath(entry or "."), base)
            if m:
                name, version = canonicalize_name(m["name"]), m["version"]
            else:
                meta = importlib.metadata.PathDistribution(Path(path)).metadata
                if not meta or not meta["Name"]:
                    continue
                name, version = canonicalize_name(meta["Name"]), meta["Version"]
            found.setdefault(name, Dist(name, version, path))
    return found


def changed(before: dict[str, Dist], after: dict[str, Dist]) -> list[str]:
    """Names installed, upgraded, downgraded or moved between two snapshots."""
    return sorted(n for n, d in after.items() if before.get(n) != d)


def constraints(installed: dict[str, Dist]) -> list[str]:
    """Pins of the image's torch stack (torch, torchvision, torchaudio, triton, nvidia-*)."""
    return [f"{d.name}=={d.version}" for d in installed.values() if is_torch_stack(d.name)]


def env_lock_path() -> str:
    """One install at a time per environment (a file next to the interpreter's prefix)."""
    if os.access(sys.prefix, os.W_OK):
        return os.path.join(sys.prefix, ".gpulab-install.lock")
    digest = hashlib.sha256(sys.prefix.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"gpulab-install-{digest}.lock")


@dataclass
class PipRun:
    returncode: int
    lines: list[str]
    timed_out: bool = False
    interrupted: bool = False


def run_pip(
    args: list[str],
    manifest: Path,
    log_path: Path,
    env: dict[str, str],
    timeout: float,
    on_line: Callable[[str], None] = lambda line: None,
) -> PipRun:
    """Run pip (through _piprun) with output to ``log_path`` and ``on_line``, each
    line without terminal escape codes.

    The whole process group is killed on timeout or interrupt.
    """
    cmd = [sys.executable, "-m", "gpulab_jupyter.magics._piprun", str(manifest), *args]
    lines: list[str] = []
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        expired = threading.Event()

        def kill():
            expired.set()
            _kill_group(proc)

        timer = threading.Timer(timeout, kill)
        timer.daemon = True
        timer.start()
        try:
            for line in proc.stdout:
                line = plain(line.rstrip("\n"))  # the log is read as text, not in a terminal
                log.write(line + "\n")
                lines.append(line)
                on_line(line)
            rc = proc.wait()
        except KeyboardInterrupt:
            _kill_group(proc)
            proc.wait()
            log.write("gpulab: interrupted by the user\n")
            return PipRun(-2, lines, interrupted=True)
        finally:
            timer.cancel()
            proc.stdout.close()
        if expired.is_set():
            log.write(f"gpulab: stopped after {timeout:.0f} s\n")
        return PipRun(rc, lines, timed_out=expired.is_set())


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _manifest(manifest: Path) -> tuple[list[list[str]], list[str]]:
    moves: list[list[str]] = []
    dirs: list[str] = []
    if manifest.exists():
        for line in manifest.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                moves += record.get("moves", [])
                dirs += record.get("dirs", [])
    return moves, dirs


def finalize(manifest: Path) -> None:
    """The install is kept: delete what pip moved aside."""
    _, dirs = _manifest(manifest)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def remove_dist(dist: Dist) -> bool:
    """Uninstall one distribution by its RECORD (pip itself would be confused by the
    stash folders pip left next to it). False when it has no RECORD."""
    record = Path(dist.path) / "RECORD"
    if not record.is_file():
        return False
    site = Path(dist.path).parent
    parents = set()
    for row in csv.reader(record.read_text(errors="replace").splitlines()):
        if not row or not row[0]:
            continue
        target = Path(os.path.normpath(site / row[0]))
        if target.is_file() or target.is_symlink():
            target.unlink()
            if target.suffix == ".py":  # bytecode compiled by later imports
                for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
                    pyc.unlink()
        parents.add(target.parent)
    shutil.rmtree(dist.path, ignore_errors=True)
    for folder in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        while folder != site and site in folder.parents:
            pycache = folder / "__pycache__"
            if pycache.is_dir() and not any(pycache.iterdir()):
                pycache.rmdir()
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break
            folder = folder.parent
    return True


def revert(
    before: dict[str, Dist], manifest: Path, log_path: Path, env: dict, index_options=()
) -> list[str]:
    """Put the environment back as ``before``; returns what could not be restored.

    New and replaced distributions are removed, then what pip moved aside is
    moved back. ``index_options`` are used only when a replaced version was not
    kept (an old pip) and must be installed again.
    """
    after = snapshot()
    names = changed(before, after)
    problems = []
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"gpulab: reverting {', '.join(names) or 'nothing new'}\n")
        for name in names:
            if not remove_dist(after[name]):
                cmd = [sys.executable, "-m", "pip", "uninstall", "-y", "--no-input", name]
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                log.write(done.stdout + done.stderr)
        moves, dirs = _manifest(manifest)
        for original, stashed in reversed(moves):
            original = original.rstrip("/" + os.sep)
            if os.path.lexists(stashed):
                _remove(original)
                os.makedirs(os.path.dirname(original), exist_ok=True)
                shutil.move(stashed, original)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        now = snapshot()
        for dist in [d for n, d in before.items() if n in names and now.get(n) != d]:
            cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input"]
            cmd += [*index_options, f"{dist.name}=={dist.version}"]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            log.write(done.stdout + done.stderr)
            if done.returncode != 0:
                problems.append(f"{dist.name} {dist.version}")
        log.write(f"gpulab: reverted; not restored: {', '.join(problems) or 'none'}\n")
    return problems


def log_file(project_dir: Path, names: list[str]) -> Path:
    """A new log file under the project's .gpulab/logs (or the user's cache)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    label = "-".join(names)[:60] or "apt"
    base = f"gpu_install-{stamp}-{os.getpid()}-{label}.log"
    for folder in (project_dir / ".gpulab" / "logs", Path.home() / ".cache" / "gpulab" / "logs"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / base
            path.touch()
            return path
        except OSError:
            continue
    return Path(tempfile.mkstemp(prefix="gpu_install-", suffix=".log")[1])

"""Verification of an install in a fresh interpreter, and of its GPU code.

The import check runs in a new process of the kernel's interpreter (the
kernel's own modules are never reloaded), from an empty folder so a project
folder named like the package cannot shadow it. For compiled CUDA code each
shared object's SASS/PTX architectures are compared with the visible GPUs.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from gpulab_contract import arch

from . import cudabin

MARK = "@@gpulab-verify@@"
SKIP_TOP_LEVEL = {"tests", "test", "docs", "doc", "examples", "benchmarks", "scripts"}
_SCRIPT = r"""
import importlib, json, sys, traceback
spec = json.loads(sys.argv[1])
out = {"imports": {}, "check": None}

def problem(e):
    tb = traceback.extract_tb(e.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    return {"type": type(e).__name__, "message": str(e), "where": where}

for mod in spec["modules"]:
    try:
        importlib.import_module(mod)
        out["imports"][mod] = None
    except BaseException as e:
        out["imports"][mod] = problem(e)
if spec["check"] and not any(out["imports"].values()):
    try:
        exec(compile(spec["check"], "<--check>", "exec"), {"__name__": "__gpulab_check__"})
        out["check"] = "ok"
    except BaseException as e:
        out["check"] = problem(e)
print("\n" + sys.argv[2] + json.dumps(out), flush=True)
"""


@dataclass
class Verdict:
    ok: bool = True
    problems: list[str] = field(default_factory=list)  # plain words, for the user
    notes: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)  # imported successfully


def _distribution(name: str) -> importlib.metadata.Distribution | None:
    importlib.invalidate_caches()
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def top_level_modules(name: str) -> list[str]:
    """The modules a distribution installs at the top level (what to import)."""
    dist = _distribution(name)
    if dist is None:
        return []
    listed = (dist.read_text("top_level.txt") or "").split()
    if not listed:
        for f in dist.files or []:
            parts = f.parts
            if not parts or parts[0] == ".." or parts[0].endswith((".dist-info", ".data")):
                continue
            if len(parts) == 1 and parts[0].endswith((".py", ".so", ".pyd")):
                listed.append(parts[0].split(".")[0])
            elif len(parts) > 1 and parts[-1].endswith((".py", ".so")):
                listed.append(parts[0])
    keep = []
    for mod in listed:
        mod = mod.replace("/", ".")
        if mod.isidentifier() and not mod.startswith("__") and mod not in SKIP_TOP_LEVEL:
            if mod not in keep:
                keep.append(mod)
    return sorted(keep)


def shared_objects(name: str) -> list[str]:
    dist = _distribution(name)
    out = []
    for f in (dist.files or []) if dist else []:
        base = f.name
        if base.endswith(".so") or ".so." in base:
            path = str(dist.locate_file(f))
            if os.path.isfile(path):
                out.append(path)
    return out


def explain(mod: str, err: dict) -> str:
    """An import or check failure in plain words."""
    msg, kind = err["message"], err["type"]
    text = f"{kind}: {msg}" + (f" (at {err['where']})" if err.get("where") else "")
    head = f"import {mod} failed" if mod else "the --check code failed"
    hints = [
        ("no kernel image is available", "the package has no GPU code for this GPU's architecture"),
        ("undefined symbol", "it was compiled against a different torch (or library) than the "
         "one installed; build it from source against this torch (--no-build-isolation)"),
        ("cannot open shared object file", "a shared library it needs is missing from the image"),
        ("GLIBCXX_", "it was compiled with a newer C++ compiler than this image has"),
        ("PTX was compiled with an unsupported toolchain",
         "its PTX needs a newer NVIDIA driver than this host has"),
        ("CUDA driver version is insufficient", "the NVIDIA driver is older than its CUDA"),
    ]  # fmt: skip
    for needle, words in hints:
        if needle in msg:
            return f"{head}: {words}.\n    {text}"
    return f"{head}: {text}"


def import_check(modules: list[str], check: str, timeout: float = 600) -> Verdict:
    """Import ``modules`` (then run ``check``) in a fresh interpreter."""
    verdict = Verdict()
    payload = json.dumps({"modules": modules, "check": check or ""})
    with tempfile.TemporaryDirectory(prefix="gpulab-verify-") as empty:
        try:
            done = subprocess.run(
                [sys.executable, "-c", _SCRIPT, payload, MARK],
                capture_output=True,
                text=True,
                errors="replace",
                cwd=empty,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return Verdict(False, [f"importing {', '.join(modules)} took over {timeout:.0f} s"])
    marked = [ln for ln in done.stdout.splitlines() if ln.startswith(MARK)]
    if not marked:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        why = "\n    ".join(tail) or f"exit code {done.returncode}"
        return Verdict(False, [f"the fresh interpreter crashed while importing:\n    {why}"])
    result = json.loads(marked[-1][len(MARK) :])
    for mod, err in result["imports"].items():
        if err:
            verdict.ok = False
            verdict.problems.append(explain(mod, err))
        else:
            verdict.modules.append(mod)
    if isinstance(result["check"], dict):
        verdict.ok = False
        verdict.problems.append(explain("", result["check"]))
    elif result["check"] == "ok":
        verdict.notes.append("the --check code ran")
    return verdict


def gpu_check(name: str, capabilities: list[str], problem: str = "") -> Verdict:
    """Does every CUDA binary of ``name`` carry code that runs on these GPUs?"""
    verdict = Verdict()
    for path in shared_objects(name):
        code = cudabin.cuda_code(path)
        if not code:
            continue
        base = os.path.basename(path)
        if not capabilities:
            verdict.notes.append(
                f"{base} carries {code.describe()}; there is no GPU here to check it against"
                + (f" ({problem})" if problem else "")
            )
            continue
        for cap in capabilities:
            if not code.runs_on(cap):
                sm = arch.sm(cap)
                verdict.ok = False
                verdict.problems.append(
                    f"{base} has no code for this GPU ({sm}, compute capability {cap}): it "
                    f"carries {code.describe()} only, so its kernels would fail with "
                    f'"no kernel image is available for execution on the device" ({sm}). '
                    "Build it from source for this GPU (--from-source)."
                )
        if verdict.ok:
            verdict.notes.append(f"{base} carries {code.describe()}: runs on this GPU")
    return verdict

"""A finding (ok / warn / fail, what was seen, the fix), its rendering and exit code."""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass

OK, WARN, FAIL = "ok", "warn", "fail"
STATUSES = (OK, WARN, FAIL)
_COLOURS = {OK: "\033[32m", WARN: "\033[33m", FAIL: "\033[31m"}
_RESET, _DIM = "\033[0m", "\033[2m"


@dataclass(frozen=True)
class Finding:
    """One check's result. ``fix`` is one sentence; empty only when nothing is to be done."""

    id: str
    status: str
    seen: str
    fix: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")
        if self.status != OK and not self.fix:
            raise ValueError(f"finding {self.id} ({self.status}) needs a fix")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def gpu_absent(id: str, seen: str, fix: str, cpu_only: bool) -> Finding:
    """A check that needs a GPU on a machine without one.

    A CPU-only hub is a supported setup: with ``cpu_only`` (``gpulab doctor
    --cpu-only``) such findings are ok, otherwise they warn, so a GPU host that
    lost its GPU (driver gone, VM without pass-through) is noticed.
    """
    if cpu_only:
        return Finding(id, OK, seen + " (CPU-only host, as declared with --cpu-only)")
    return Finding(id, WARN, seen, fix)


def exit_code(findings: list[Finding], strict: bool = False) -> int:
    """1 when a check failed (or, with ``strict``, warned), else 0: a warning says what
    to improve, and gpulab runs with it, so scripts (``gpulab doctor && ...``) go on."""
    worst = {f.status for f in findings}
    return 1 if FAIL in worst or (strict and WARN in worst) else 0


def to_json(findings: list[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2)


def from_dicts(items: list[dict]) -> list[Finding]:
    return [Finding(d["id"], d["status"], d["seen"], d.get("fix", "")) for d in items]


def counts(findings: list[Finding]) -> dict[str, int]:
    return {s: sum(f.status == s for f in findings) for s in STATUSES}


def render_table(findings: list[Finding], color: bool = False, width: int = 100) -> str:
    """A table for people: status, check id, what was seen, and the fix under it."""
    # Check ids longer than the column (image.<name:tag>.cuda) get a line of their own.
    id_w = min(max((len(f.id) for f in findings), default=5), 26)
    text_w = max(width - 6 - id_w - 2, 30)
    indent = " " * (6 + id_w + 2)

    def paint(s: str, code: str) -> str:
        return f"{code}{s}{_RESET}" if color else s

    lines = [paint(f"{'':6}{'CHECK':<{id_w}}  SEEN  (-> FIX)", _DIM)]
    for f in findings:
        status = paint(f"{f.status:<6}", _COLOURS[f.status])
        seen = textwrap.wrap(f.seen, text_w, break_on_hyphens=False) or [""]
        if len(f.id) <= id_w:
            lines.append(f"{status}{f.id:<{id_w}}  {seen[0]}")
        else:
            lines += [f"{status}{f.id}", indent + seen[0]]
        lines += [indent + s for s in seen[1:]]
        if f.fix:
            fix = textwrap.wrap(
                "-> " + f.fix, text_w, subsequent_indent="   ", break_on_hyphens=False
            )
            lines += [
                indent + paint(s, _COLOURS[f.status] if f.status != OK else _DIM) for s in fix
            ]
    c = counts(findings)
    summary = f"{c[OK]} ok, {c[WARN]} warnings, {c[FAIL]} failures"
    if c[FAIL]:
        summary += ": fix the failures above, gpulab cannot work well until then"
    elif c[WARN]:
        summary += ": gpulab can run; the warnings say what to improve"
    worst = FAIL if c[FAIL] else WARN if c[WARN] else OK
    lines += ["", paint(summary, _COLOURS[worst])]
    return "\n".join(lines)

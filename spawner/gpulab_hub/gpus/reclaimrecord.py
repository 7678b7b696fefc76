"""The standing reclaim warnings: which idle GPU holder was warned when, why (someone
waits, or idle release) and when it stops unless used. Kept in one small JSON file
beside the allocation record (same lock and atomic, fsynced writes), so a restart of
the keeper or the hub keeps the clock, and the home page can say "this project stops
at 14:05 unless you use it".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.gpus.queue import NAME
from gpulab_hub.gpus.reclaim import IDLE, WAITING, warning_words

FILE = "gpu-reclaim.json"
MAX_WARNINGS = 10_000


def path_of(allocations_file: str | Path) -> Path:
    """Where the warnings live: beside the allocation record (one setting places both)."""
    return Path(allocations_file).with_name(FILE)


@dataclass(frozen=True)
class Warning:  # noqa: A001 (a reclaim warning, not Python's)
    owner: str
    project: str
    warned_at: float  # epoch seconds
    stops_at: float  # epoch seconds: stopped then unless used
    reason: str = WAITING  # reclaim.WAITING (someone waits) or reclaim.IDLE (idle release)
    idle_since: float | None = None  # its last activity when warned

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.project)


class ReclaimRecord(jsonfile.LockedRecord):
    kind = stateversion.KINDS["gpu-reclaim"]
    section = "warnings"
    what = "The GPU reclaim record"
    on_damage = "standing warnings are forgotten: an idle project is warned again, its grace anew"
    max_bytes = 2 << 20

    def _parse(self, section) -> dict[tuple[str, str], Warning]:
        if not isinstance(section, list) or len(section) > MAX_WARNINGS:
            raise TypeError('"warnings" is not a list of warnings')
        out = {}
        for w in section:
            if not isinstance(w, dict):
                raise TypeError("a warning is not an object")
            owner, project = w["owner"], w["project"]
            if not all(isinstance(n, str) and NAME.fullmatch(n) for n in (owner, project)):
                raise ValueError(f"not a user and project name: {owner!r}/{project!r}")
            times = (w["warned_at"], w["stops_at"])
            if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in times):
                raise TypeError("a warning's times are not numbers")
            reason = w.get("reason", WAITING)
            if reason not in (WAITING, IDLE):
                raise ValueError(f"not a reason for a warning: {reason!r}")
            idle = w.get("idle_since")
            if idle is not None and not (
                isinstance(idle, int | float) and not isinstance(idle, bool)
            ):
                raise TypeError("a warning's idle_since is not a number")
            out[(owner, project)] = Warning(
                owner, project, float(times[0]), float(times[1]), reason,
                None if idle is None else float(idle),
            )  # fmt: skip
        return out

    def _missing(self) -> dict:
        return {}

    def _recover(self) -> dict:
        return {}

    def _dump(self, warnings: dict[tuple[str, str], Warning]) -> list[dict]:
        return [
            {"owner": w.owner, "project": w.project, "warned_at": w.warned_at,
             "stops_at": w.stops_at, "reason": w.reason, "idle_since": w.idle_since}
            for _, w in sorted(warnings.items())
        ]  # fmt: skip

    def warnings(self) -> dict[tuple[str, str], Warning]:
        with self.locked():
            return self._read()

    def replace(self, warnings: dict[tuple[str, str], Warning]) -> None:
        """Make the record ``warnings`` (written only if that changes it)."""
        with self.locked():
            if self._read() != warnings:
                self._write(dict(warnings))


def warnings_of(allocations_file: str | Path, owner: str) -> dict[str, Warning]:
    """project -> its standing warning, of ``owner``'s warned projects (blocking; none
    where no record exists)."""
    path = path_of(allocations_file)
    if not path.exists():
        return {}
    return {p: w for (o, p), w in ReclaimRecord(path).warnings().items() if o == owner}


def stops_of(allocations_file: str | Path, owner: str) -> dict[str, float]:
    """project -> when it stops unless used, of ``owner``'s warned projects (blocking)."""
    return {p: w.stops_at for p, w in warnings_of(allocations_file, owner).items()}


def warning_of(allocations_file: str | Path, owner: str, project: str) -> Warning | None:
    """The standing warning of ``owner``'s ``project`` (blocking; None: not warned)."""
    path = path_of(allocations_file)
    if not path.exists():
        return None
    return ReclaimRecord(path).warnings().get((owner, project))


def words_of(w: Warning, now: float) -> str:
    """What the warned project's JupyterLab says, ``now``."""
    idle_for = now - w.idle_since if w.idle_since is not None else 0.0
    return warning_words(w.stops_at - now, w.reason, idle_for)

"""What the usage page shows, read from the usage ledger and the allocation record.

Blocking file reads: the page calls :func:`build` and :func:`csv_text` on a worker
thread. The window is one of ``WINDOWS`` (the page's allow-list); nothing from the
address reaches a path or a query.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

from sqlalchemy.exc import SQLAlchemyError

from gpulab_hub import hubsettings
from gpulab_hub.db import tables
from gpulab_hub.gpus import allocator, usage, waiting

DAY = 24 * 3600.0
# ?window=<key>: the only windows the page offers -> (its words, seconds)
WINDOWS = {
    "24h": ("the last 24 hours", DAY),
    "7d": ("the last 7 days", 7 * DAY),
    "30d": ("the last 30 days", 30 * DAY),
}
DEFAULT_WINDOW = "7d"


def window_words(seconds: float) -> str:
    """The home page's words for the budget window: "this week", "in the last 2 days"."""
    if seconds == 7 * DAY:
        return "this week"
    if seconds % DAY == 0 and seconds >= DAY:
        days = seconds / DAY
        return "in the last day" if days == 1 else f"in the last {days:g} days"
    return f"in the last {seconds / 3600:g} h"


def budgets_of(where: hubsettings.Layout, members: Mapping[str, list[str]]) -> usage.Budgets:
    """The hub's GPU budgets (``ProjectSpawner.gpu_budget_hours``), read as the queue reads
    them (waiting.budgets_of); ``members``: the users of each group a budget names."""
    return waiting.budgets_of(SimpleNamespace(gpu_budget_hours=dict(where.budget_hours)), members)


def budget_groups(where: hubsettings.Layout) -> list[str]:
    return waiting.budget_groups(SimpleNamespace(gpu_budget_hours=dict(where.budget_hours)))


@dataclass
class Line:
    """One row of a table: GPU-hours of a user, a project or a GPU in the window."""

    key: tuple[str, ...]
    hours: float = 0.0
    holdings: int = 0  # ended holdings in the window
    under_way: int = 0  # holdings not ended yet
    budget: float | None = None  # users only
    util_hours: float = 0.0  # hours with a measured utilisation, and their weighted sum
    util_sum: float = 0.0

    @property
    def avg_util(self) -> str:
        return f"{self.util_sum / self.util_hours:.0f} %" if self.util_hours else "not measured"

    @property
    def over(self) -> bool:
        return self.budget is not None and self.hours >= self.budget


@dataclass
class Report:
    window: str
    words: str
    since: float
    now: float
    users: list[Line] = field(default_factory=list)
    projects: list[Line] = field(default_factory=list)
    gpus: list[Line] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not be read, in words

    @property
    def total(self) -> float:
        return sum(line.hours for line in self.users)

    @property
    def since_iso(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.since))

    @property
    def now_iso(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.now))


def _line(table: dict, key: tuple[str, ...]) -> Line:
    if key not in table:
        table[key] = Line(key)
    return table[key]


def _ordered(table: dict) -> list[Line]:
    return sorted(table.values(), key=lambda line: (-line.hours, line.key))


def build(
    where: hubsettings.Layout,
    window: str,
    members: Mapping[str, list[str]],
    labels: Callable[[], dict[str, str]] = dict,
    now: float | None = None,
) -> Report:
    """Blocking: GPU-hours by user, project and GPU over ``window`` (a key of WINDOWS),
    ended holdings from the ledger and those under way from the allocation record.
    ``labels``: UUID -> the words users see for this host's GPUs."""
    words, seconds = WINDOWS[window]
    now = time.time() if now is None else now
    since = now - seconds
    report = Report(window, words, since, now)
    users: dict = {}
    projects: dict = {}
    gpus: dict = {}
    host = labels()
    names = dict(host)
    ledger = usage.of_layout(where)
    try:
        records = list(ledger.records(since, now))
    except SQLAlchemyError as e:
        records = []
        report.problems.append(f"The GPU usage ledger (the hub's database) cannot be read: {e}")
    if ledger.skipped:
        report.problems.append(
            f"{ledger.skipped} row(s) of the GPU usage table ({tables.usage.name}) are no "
            "GPU usage record and were skipped."
        )
    # a GPU's words: as the host names it now, else as its latest holding recorded them
    for r in sorted(records, key=lambda r: r.end):
        if r.label and r.uuid not in host:
            names[r.uuid] = r.label
    for r in records:
        h = r.hours(since, now)
        label = names.get(r.uuid) or r.uuid
        for line in (
            _line(users, (r.owner,)),
            _line(projects, (r.owner, r.project)),
            _line(gpus, (label, r.uuid)),
        ):
            line.hours += h
            line.holdings += 1
            if r.util is not None:
                line.util_hours += h
                line.util_sum += h * r.util
    try:
        held = allocator.AllocationStore(where.allocations_file).holdings()
    except (allocator.AllocationError, OSError) as e:
        held = {}
        report.problems.append(f"The GPU allocation record cannot be read: {e}")
    for uuid, holders in held.items():
        for holder in holders:
            h = max(0.0, now - max(holder.since, since)) / usage.HOUR
            label = names.get(uuid) or uuid
            for line in (
                _line(users, (holder.owner,)),
                _line(projects, (holder.owner, holder.project)),
                _line(gpus, (label, uuid)),
            ):
                line.hours += h
                line.under_way += 1
    budgets = budgets_of(where, members)
    for line in users.values():
        line.budget = budgets.of(line.key[0])
    report.users, report.projects, report.gpus = (
        _ordered(users), _ordered(projects), _ordered(gpus)
    )  # fmt: skip
    return report


def csv_text(where: hubsettings.Layout, window: str, now: float | None = None) -> str:
    """Blocking: the ended holdings of ``window`` as CSV (usage.UsageLedger.export_csv:
    no cell starts a formula)."""
    _, seconds = WINDOWS[window]
    now = time.time() if now is None else now
    out = io.StringIO()
    usage.of_layout(where).export_csv(out, now - seconds, now)
    return out.getvalue()

"""The GPU usage ledger: every GPU holding, recorded when it ends, in the hub's database.

One row a device a holding in the table ``gpulab_usage`` (db/tables.py): who, which
project, which GPU (UUID and the words users see, e.g. "GPU 1 (NVIDIA H100)" or a
slice), from, to, and the average utilisation (percent; None where the host cannot
measure it). The holdings of one stop are written in one transaction (all or none),
which also deletes the rows that ended more than the retention ago
(``ProjectSpawner.gpu_usage_retention_days``: 90 days unless the admin says otherwise;
never less than the fair-share window). Reads are queries over an index: fair share
and budgets read the window they need (``hours_by_user`` sums it in the database),
whatever the table's size.

``hours_by_user`` is what the queue's fair-share order and the budgets read;
``Budgets`` says who is over budget; ``export_csv`` is the admin's export. The ledger
file of gpulab before its database (gpu-usage.jsonl) is imported once at the upgrade
(gpus/usagefile.py). Every method is blocking work (the records pool).
"""

from __future__ import annotations

import csv
import datetime
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

import sqlalchemy as sa

from gpulab_hub import jsonfile
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import tables
from gpulab_hub.gpus.allocator import Held
from gpulab_hub.layout import GPU_USAGE_RETENTION_DAYS

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # owner and project
UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}")  # GPU-…, MIG-…, or a slice's id
LABEL = re.compile(r"[A-Za-z0-9 ()/._:+-]{0,128}")  # "GPU 1 (NVIDIA H100 80GB HBM3)"
HOUR = 3600.0
DAY = 24 * HOUR
RETENTION_DAYS = GPU_USAGE_RETENTION_DAYS  # ProjectSpawner.gpu_usage_retention_days


class UsageError(Exception):
    """A record the ledger refuses, or a ledger it cannot use; ``str()`` says which."""


@dataclass(frozen=True)
class Record:
    owner: str
    project: str
    uuid: str  # the GPU's or slice's UUID
    label: str  # as users see it: "GPU 1 (NVIDIA H100 80GB HBM3)", "slice 0/4 of GPU 0"
    start: float  # epoch seconds
    end: float
    util: float | None = None  # average GPU utilisation over the holding, percent

    def __post_init__(self) -> None:
        ok = (
            isinstance(self.owner, str)
            and NAME.fullmatch(self.owner)
            and isinstance(self.project, str)
            and NAME.fullmatch(self.project)
            and isinstance(self.uuid, str)
            and UUID.fullmatch(self.uuid)
            and isinstance(self.label, str)
            and LABEL.fullmatch(self.label)
            and _number(self.start)
            and _number(self.end)
            and self.start <= self.end
            and (self.util is None or (_number(self.util) and 0 <= self.util <= 100))
        )
        if not ok:
            raise UsageError(f"not a GPU usage record gpulab keeps: {self!r}")

    def hours(self, since: float = -math.inf, until: float = math.inf) -> float:
        """GPU-hours of this holding inside [since, until]."""
        return max(0.0, min(self.end, until) - max(self.start, since)) / HOUR


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Budgets:
    """GPU-hour budgets over the fair-share window, set by the admin.

    A user's budget is their own (``users``); else the smallest of their groups'
    (``groups``: each member gets that budget, it is not shared); else ``default``;
    None: no budget. Over budget means using at least the budget.
    """

    users: Mapping[str, float] = field(default_factory=dict)
    groups: Mapping[str, float] = field(default_factory=dict)
    members: Mapping[str, Iterable[str]] = field(default_factory=dict)  # group: its users
    default: float | None = None

    def of(self, user: str) -> float | None:
        if user in self.users:
            return self.users[user]
        mine = [h for g, h in self.groups.items() if user in set(self.members.get(g, ()))]
        return min(mine) if mine else self.default

    def over(self, hours: Mapping[str, float]) -> frozenset[str]:
        """The users in ``hours`` who have used their budget up."""
        return frozenset(u for u, h in hours.items() if (b := self.of(u)) is not None and h >= b)

    def words(self, user: str, hours: float, window: str = "this week") -> str:
        """What the home page says, e.g. "GPU this week: 6.2 h of 20 h"."""
        b = self.of(user)
        return f"GPU {window}: {hours:.1f} h" + ("" if b is None else f" of {b:g} h")


def check_retention(retention: float, window: float) -> None:
    """Refuse a retention (seconds) shorter than the fair-share window (seconds): fair
    share and budgets would forget what they must count."""
    if not (math.isfinite(retention) and retention >= window > 0):
        raise ValueError(
            f"ProjectSpawner.gpu_usage_retention_days ({retention / DAY:g}) must be at least "
            f"the fair-share window, ProjectSpawner.gpu_usage_window ({window / DAY:g} days): "
            "raise the retention or shorten the window."
        )


class UsageLedger:
    """The table of ended GPU holdings in the hub's database at ``url``; safe for
    several hub processes at once (the hub, its GPU keeper, the ``gpulab`` command)."""

    def __init__(self, url: str, clock=time.time, retention: float = RETENTION_DAYS * DAY,
                 log=None):  # fmt: skip
        self.url = url
        self._clock = clock
        self.retention = retention  # seconds a row is kept after its holding ended
        self.log = log or jsonfile.LOG
        self.skipped = 0  # rows the last read refused (not a record gpulab keeps)

    def append(self, records: Iterable[Record]) -> None:
        """Add holdings that ended, in one transaction (all or none, durable when this
        returns); rows past the retention go in the same transaction."""
        rows = []
        for r in records:
            if not isinstance(r, Record):
                raise UsageError(f"not a GPU usage record: {r!r}")
            rows.append(row_of(r))
        if not rows:
            return
        with db_engine.begin(self.url) as conn:
            conn.execute(insert(), rows)
            self._prune(conn)

    def prune(self) -> int:
        """Delete the rows past the retention; how many."""
        with db_engine.begin(self.url) as conn:
            return self._prune(conn)

    def _prune(self, conn: sa.Connection) -> int:
        cut = self._clock() - self.retention
        return conn.execute(tables.usage.delete().where(tables.usage.c.ended < cut)).rowcount

    def records(self, since: float = -math.inf, until: float = math.inf) -> list[Record]:
        """The holdings that overlap [since, until], in the order they started."""
        u = tables.usage.c
        query = sa.select(u.owner, u.project, u.uuid, u.label, u.started, u.ended, u.util)
        query = _overlapping(query, since, until).order_by(u.started, u.id)
        with db_engine.begin(self.url) as conn:
            found = conn.execute(query).all()
        self.skipped = 0
        out = []
        for row in found:
            try:
                out.append(Record(*row))
            except UsageError:  # a row written by hand: not counted, said once
                self.skipped += 1
        if self.skipped:
            self.log.warning(
                "The GPU usage table has %d row(s) that are no GPU usage record; they were "
                "skipped.", self.skipped,
            )  # fmt: skip
        return out

    def owners(self) -> frozenset[str]:
        """The users with any recorded holding."""
        with db_engine.begin(self.url) as conn:
            found = conn.execute(sa.select(tables.usage.c.owner).distinct()).scalars()
            return frozenset(found)

    def hours_by_user(
        self, window: float, now: float | None = None, held: Held | None = None
    ) -> dict[str, float]:
        """GPU-hours per user over the last ``window`` seconds, holdings under way
        (``held``, from the allocation record) counted up to now: one query over the
        window (the index on the end time), summed in the database."""
        now = self._clock() if now is None else now
        since = now - window
        u = tables.usage.c
        # the part of each holding inside [since, now]: min(end, now) - max(start, since)
        inside = sa.case((u.ended < now, u.ended), else_=now) - sa.case(
            (u.started > since, u.started), else_=since
        )
        query = _overlapping(sa.select(u.owner, sa.func.sum(inside)), since, now)
        with db_engine.begin(self.url) as conn:
            found = conn.execute(query.group_by(u.owner)).all()
        out: dict[str, float] = {o: float(s or 0.0) / HOUR for o, s in found}
        for hs in (held or {}).values():
            for h in hs:
                part = max(0.0, now - max(h.since, since)) / HOUR
                out[h.owner] = out.get(h.owner, 0.0) + part
        return out

    def export_csv(self, out: TextIO, since: float = -math.inf, until: float = math.inf) -> int:
        """Write the holdings in [since, until] as CSV (times in UTC); how many rows."""
        w = csv.writer(out)
        w.writerow(["user", "project", "gpu", "gpu_uuid", "from", "to", "gpu_hours", "avg_util"])
        n = 0
        for r in self.records(since, until):
            util = "" if r.util is None else f"{r.util:.1f}"
            w.writerow(
                [
                    _cell(r.owner),
                    _cell(r.project),
                    _cell(r.label),
                    _cell(r.uuid),
                    _utc(r.start),
                    _utc(r.end),
                    f"{r.hours():.3f}",
                    util,
                ]
            )
            n += 1
        return n


def _overlapping(query, since: float, until: float):
    u = tables.usage.c
    if since > -math.inf:
        query = query.where(u.ended >= since)
    if until < math.inf:
        query = query.where(u.started <= until)
    return query


def row_of(r: Record) -> dict:
    """``r`` as a row of gpulab_usage (its user's id looked up by name in the insert)."""
    return {
        "owner": r.owner, "project": r.project, "uuid": r.uuid, "label": r.label,
        "started": float(r.start), "ended": float(r.end),
        "util": None if r.util is None else float(r.util),
        "user_name": r.owner,  # the insert's lookup of the user's id
    }  # fmt: skip


def insert():
    """The insert of rows made by :func:`row_of`: each row's user_id is the JupyterHub
    user of its owner's name (NULL where the hub has no such user)."""
    users = tables.USERS
    user_id = (
        sa.select(users.c.id)
        .where(users.c.name == sa.bindparam("user_name", type_=sa.Unicode))
        .scalar_subquery()
    )
    return tables.usage.insert().values(user_id=user_id)


def of_layout(where) -> UsageLedger:
    """The ledger of the hub whose layout is ``where`` (hubsettings.Layout)."""
    return UsageLedger(where.db_url, retention=where.usage_retention)


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cell(s: str) -> str:
    """A cell a spreadsheet shows as text, never runs as a formula."""
    return "'" + s if s[:1] in ("=", "+", "-", "@") else s

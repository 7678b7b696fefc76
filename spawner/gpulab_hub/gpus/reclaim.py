"""Reclaiming idle GPUs: who is warned, who is stopped (pure).

A holder is idle when it has no busy kernel, no running job, no SSH session, its
GPUs are unused (utilisation below ``Rules.busy_util``; unknown utilisation, as
on WSL2, counts as in use) and it has been so for ``Rules.idle_after``. While
starts wait for GPUs, idle holders are warned ("someone is waiting for this GPU:
this project stops in 10 min unless you use it") and stopped, files kept, once
``Rules.grace`` has passed since the warning with no use in between. Idle holders
are taken in this order: over-budget users first, then those warned earliest, then
those idle longest; the keeper chooses among them only those whose stops the
queue's own grant turns into grants (``queue.reclaim_for``: per-user limits,
budgets and fair-share order applied), so no project is stopped for a GPU nobody
gets. A holder with a running job or a busy GPU is never chosen, whatever else
holds. Nobody waiting: no one is warned or stopped for the queue, and standing
warnings are withdrawn.

Idle release (``Rules.release_after``, 0: off): a holder idle in every way for
that long is warned ("this project has been idle for 45 min: it stops in 10 min
unless you use it") and stopped after the grace even when nobody waits, so GPUs
forgotten over lunch or overnight come back without waiting for the idle culler.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

Key = tuple[str, str]
# the idle holders, the first to be reclaimed first -> those the waiting starts can use
Needed = Callable[[Sequence[Key]], Collection[Key]]


@dataclass(frozen=True)
class Facts:
    """What the hub knows about one holder (a project holding GPUs) right now."""

    owner: str
    project: str
    gpus: int = 1  # devices it holds
    busy_kernel: bool = False
    running_job: bool = False
    ssh_session: bool = False
    gpu_util: float | None = None  # percent, recent average over its GPUs; None: unknown
    idle_since: float = 0.0  # epoch seconds: last kernel, job, SSH or GPU activity
    warned_at: float | None = None  # when it was warned; None: not warned

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.project)


@dataclass(frozen=True)
class Rules:
    grace: float = 300.0  # seconds from the warning to the stop (admin-set)
    idle_after: float = 300.0  # seconds idle before a holder is warned
    busy_util: float = 5.0  # percent: at or above, the GPU is in use
    release_after: float = 0.0  # seconds idle before a holder is warned, nobody waiting; 0: off

    def __post_init__(self) -> None:
        if min(self.grace, self.idle_after, self.busy_util, self.release_after) < 0:
            raise ValueError(f"GPU reclaim timings cannot be negative: {self}")


@dataclass(frozen=True)
class Decision:
    warn: tuple[Facts, ...] = ()  # warn now (not warned yet)
    stop: tuple[Facts, ...] = ()  # stop now: warned, grace over, still idle
    withdraw: tuple[Facts, ...] = ()  # warned, but used since or no longer needed
    released: frozenset[tuple[str, str]] = frozenset()  # of warn and stop: idle release,
    # not needed by the queue (their warning says so, not that someone waits)


def in_use(f: Facts, busy_util: float) -> bool:
    """Whether the holder is using its GPU: kernel, job, SSH, or a GPU not known idle."""
    gpu_busy = f.gpu_util is None or f.gpu_util >= busy_util
    return f.busy_kernel or f.running_job or f.ssh_session or gpu_busy


def decide(
    holders: Sequence[Facts],
    waiting: int | Needed,
    now: float,
    rules: Rules = Rules(),
    over_budget: Collection[str] = (),
) -> Decision:
    """Whom to warn and whom to stop, for the queue, and (``rules.release_after``)
    for having been idle that long. ``waiting``: which of the idle holders (given in
    reclaim order) the waiting starts can use (the keeper's: ``queue.reclaim_for``);
    a number: that many GPUs wanted, whoever waits (0: nobody)."""
    s = rules
    idle = [
        f
        for f in holders
        if not in_use(f, s.busy_util)
        and now - f.idle_since >= s.idle_after
        and (f.warned_at is None or f.idle_since <= f.warned_at)  # no use since the warning
    ]
    idle.sort(
        key=lambda f: (
            f.owner not in over_budget,
            f.warned_at is None,
            f.warned_at or 0.0,
            f.idle_since,
            f.key,
        )
    )
    if isinstance(waiting, int):  # holders in order until they hold that many GPUs
        keys: set[Key] = set()
        wanted = waiting
        for f in idle:
            if wanted <= 0:
                break
            keys.add(f.key)
            wanted -= max(1, f.gpus)
    else:
        keys = set(waiting([f.key for f in idle])) & {f.key for f in idle}
    chosen = [f for f in idle if f.key in keys]
    if s.release_after > 0:
        released = [f for f in idle if f.key not in keys and now - f.idle_since >= s.release_after]
        chosen += released
        keys |= {f.key for f in released}
    else:
        released = []
    return Decision(
        warn=tuple(f for f in chosen if f.warned_at is None),
        stop=tuple(f for f in chosen if f.warned_at is not None and now - f.warned_at >= s.grace),
        withdraw=tuple(f for f in holders if f.warned_at is not None and f.key not in keys),
        released=frozenset(f.key for f in released),
    )


WAITING, IDLE = "waiting", "idle"  # why a holder was warned


def warning_words(grace: float, reason: str = WAITING, idle_for: float = 0.0) -> str:
    """What the warned project's JupyterLab shows, ``grace`` seconds before the stop;
    ``idle_for``: seconds idle (an idle release's words)."""
    stops = f"this project stops in {max(0, round(grace / 60))} min unless you use it"
    if reason == IDLE:
        idle = f"this project has been idle for {round(idle_for / 60)} min"
        return f"{idle}: {stops} (its files are kept)"
    return f"someone is waiting for this GPU: {stops} (its files are kept)"

"""Reclaiming idle GPUs while someone waits, as a pure decision: who is warned,
who is stopped, and that a holder with a running job or a busy GPU never is."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab_hub.gpus.reclaim import Decision, Facts, Rules, decide, warning_words

NOW = 1_750_000_000.0
MIN = 60.0


def idle(owner: str, minutes: float, warned_min: float | None = None, **kw) -> Facts:
    """A holder idle for ``minutes``, warned ``warned_min`` minutes ago (None: not)."""
    warned = None if warned_min is None else NOW - warned_min * MIN
    return Facts(
        owner, kw.pop("project", "p"), gpu_util=kw.pop("gpu_util", 0.0),
        idle_since=NOW - minutes * MIN, warned_at=warned, **kw,
    )  # fmt: skip


def test_nobody_waiting_nobody_is_warned_and_warnings_are_withdrawn():
    a, b = idle("ann", 50), idle("bob", 50, warned_min=3)
    assert decide([a, b], waiting=0, now=NOW) == Decision(withdraw=(b,))


def test_idle_holders_are_warned_then_stopped_after_the_grace_time():
    fresh = idle("ann", 15)
    assert decide([fresh], waiting=1, now=NOW) == Decision(warn=(fresh,))
    early = idle("ann", 15, warned_min=4)
    assert decide([early], waiting=1, now=NOW) == Decision()  # warned, grace (5 min) not over
    late = idle("ann", 25, warned_min=5)
    assert decide([late], waiting=1, now=NOW) == Decision(stop=(late,))
    s = Rules(grace=30 * MIN)
    assert decide([late], waiting=1, now=NOW, rules=s) == Decision()
    assert warning_words(600) == (
        "someone is waiting for this GPU: this project stops in 10 min unless you use it "
        "(its files are kept)"
    )


def test_a_holder_used_since_its_warning_keeps_its_gpu():
    used = idle("ann", 2, warned_min=8)  # warned 8 min ago, active 2 min ago
    assert decide([used], waiting=1, now=NOW) == Decision(withdraw=(used,))


def test_not_idle_long_enough_or_in_use_in_any_way_is_never_chosen():
    spared = [
        idle("ann", 4),  # idle, but only 4 min (5 before a warning)
        idle("bob", 90, running_job=True),
        idle("cat", 90, busy_kernel=True),
        idle("dan", 90, ssh_session=True),
        idle("eve", 90, gpu_util=40.0),
        idle("fay", 90, gpu_util=None),  # utilisation unknown (WSL2): counted as in use
        idle("gus", 90, warned_min=30, running_job=True),  # a job started after the warning
    ]
    assert decide(spared, waiting=5, now=NOW) == Decision(withdraw=(spared[-1],))


def test_only_as_many_as_the_queue_needs_over_budget_first_then_warned_then_longest_idle():
    a, b = idle("ann", 200), idle("bob", 30)
    c = idle("cat", 20, warned_min=12)
    d = idle("dan", 12, project="big", gpus=2)
    assert decide([a, b, c, d], waiting=1, now=NOW) == Decision(stop=(c,))
    assert decide([a, b, c, d], waiting=2, now=NOW) == Decision(warn=(a,), stop=(c,))
    over = decide([a, b, c, d], waiting=2, now=NOW, over_budget={"dan"})
    assert over == Decision(warn=(d,), withdraw=(c,))  # dan's two GPUs cover both
    assert decide([a, b, c, d], waiting=9, now=NOW) == Decision(warn=(a, b, d), stop=(c,))


FACTS = st.builds(
    Facts,
    owner=st.sampled_from(["ann", "bob", "cat", "dan"]),
    project=st.sampled_from(["p", "q", "r"]),
    gpus=st.integers(1, 3),
    busy_kernel=st.booleans(),
    running_job=st.booleans(),
    ssh_session=st.booleans(),
    gpu_util=st.none() | st.floats(0, 100),
    idle_since=st.floats(NOW - 5 * 3600, NOW),
    warned_at=st.none() | st.floats(NOW - 3600, NOW),
)


@settings(max_examples=300, deadline=None)
@given(
    holders=st.lists(FACTS, max_size=8, unique_by=lambda f: f.key),
    waiting=st.integers(0, 6),
    over=st.sets(st.sampled_from(["ann", "bob", "cat", "dan"])),
)
def test_a_job_or_a_busy_gpu_is_never_reclaimed_and_nothing_is_reclaimed_unneeded(
    holders, waiting, over
):
    s = Rules()
    got = decide(holders, waiting, NOW, s, over_budget=over)
    chosen = got.warn + got.stop
    for f in chosen:
        assert not (f.running_job or f.busy_kernel or f.ssh_session)
        assert f.gpu_util is not None and f.gpu_util < s.busy_util
        assert NOW - f.idle_since >= s.idle_after
    for f in got.stop:
        assert f.warned_at is not None and NOW - f.warned_at >= s.grace
        assert f.idle_since <= f.warned_at  # not used since the warning
    if waiting == 0:
        assert chosen == ()
    # no more holders than the queue needs: without any one of them, it would be short
    kept = [f for f in holders if f.warned_at is not None and f not in got.withdraw]
    picked = set(chosen) | set(kept)
    if picked:
        assert sum(f.gpus for f in picked) - max(f.gpus for f in picked) < waiting
    # over-budget holders go first: no idle over-budget holder is passed over
    eligible_over = [
        f for f in holders
        if f.owner in over and f not in got.withdraw and f.warned_at is None
        and NOW - f.idle_since >= s.idle_after
        and not (f.running_job or f.busy_kernel or f.ssh_session)
        and f.gpu_util is not None and f.gpu_util < s.busy_util
    ]  # fmt: skip
    if any(f.owner not in over for f in chosen):
        assert all(f in chosen for f in eligible_over)


# --- idle release: nobody waits, but a holder idle in every way for long is released ------

RELEASE = Rules(release_after=45 * MIN)


def test_idle_release_warns_and_stops_a_long_idle_holder_with_nobody_waiting():
    long_idle = idle("ann", 50)
    short = idle("bob", 30)  # idle, not yet 45 min
    got = decide([long_idle, short], waiting=0, now=NOW, rules=RELEASE)
    assert got == Decision(warn=(long_idle,), released=frozenset({long_idle.key}))
    warned = idle("ann", 60, warned_min=10)
    got = decide([warned], waiting=0, now=NOW, rules=RELEASE)
    assert got == Decision(stop=(warned,), released=frozenset({warned.key}))
    # used since the warning: withdrawn; off (0): nobody waiting, nobody chosen
    used = idle("ann", 2, warned_min=8)
    assert decide([used], 0, NOW, RELEASE) == Decision(withdraw=(used,))
    assert decide([long_idle, short], 0, NOW, Rules()) == Decision()


def test_idle_release_never_takes_a_job_a_busy_kernel_an_ssh_session_or_a_busy_gpu():
    spared = [
        idle("bob", 300, running_job=True),
        idle("cat", 300, busy_kernel=True),
        idle("dan", 300, ssh_session=True),
        idle("eve", 300, gpu_util=40.0),
        idle("fay", 300, gpu_util=None),
    ]
    assert decide(spared, waiting=0, now=NOW, rules=RELEASE) == Decision()


def test_a_holder_the_queue_needs_is_warned_for_the_queue_not_for_idle_release():
    a, b = idle("ann", 200), idle("bob", 50)
    got = decide([a, b], waiting=1, now=NOW, rules=RELEASE)
    assert got == Decision(warn=(a, b), released=frozenset({b.key}))


def test_the_words_say_why():
    assert warning_words(600, "idle", idle_for=45 * MIN) == (
        "this project has been idle for 45 min: this project stops in 10 min unless you use "
        "it (its files are kept)"
    )
    assert warning_words(-5).startswith(
        "someone is waiting for this GPU: this project stops in 0 min"
    )


@settings(max_examples=300, deadline=None)
@given(
    holders=st.lists(FACTS, max_size=8, unique_by=lambda f: f.key),
    waiting=st.integers(0, 6),
    release=st.floats(11 * MIN, 3 * 3600),
)
def test_idle_release_takes_only_holders_idle_in_every_way_for_that_long(holders, waiting, release):
    s = Rules(release_after=release)
    got = decide(holders, waiting, NOW, s)
    without = decide(holders, waiting, NOW, Rules())
    for f in got.warn + got.stop:
        assert not (f.running_job or f.busy_kernel or f.ssh_session)
        assert f.gpu_util is not None and f.gpu_util < s.busy_util
    for f in got.warn + got.stop:
        if f.key in got.released:
            assert NOW - f.idle_since >= release
            assert f not in without.warn + without.stop  # the queue did not need it
        else:
            assert f in without.warn + without.stop  # the queue's choice is unchanged
    assert set(without.warn + without.stop) <= set(got.warn + got.stop)

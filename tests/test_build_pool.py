"""The build pool's quick lane (images/builds.py), with builds that are plain functions on
its threads: what each start's spawn page is told, which build runs when, a build that
runs past the lane's time waiting for the user's slot, and a stopped start that never
builds, a quick build giving its hub slot up to another user's build, and no quick build
where the hub's slots are taken. tests/test_build_lanes.py does the same with real builds
on a hub."""

from __future__ import annotations

import asyncio
import threading

from gpulab_hub.images import QuickBuildOver, builds


class Builds:
    """Builds that end when the test says so, and what each start was told."""

    def __init__(self):
        self.release: dict[str, threading.Event] = {}
        self.ran: list[tuple[str, bool]] = []
        self.said: dict[str, list[str]] = {}

    def build(self, name: str, over_in_quick: bool = False):
        self.release[name] = threading.Event()

        def run(quick: threading.Event | None) -> str:
            self.ran.append((name, quick is not None))
            if quick is not None and over_in_quick:
                raise QuickBuildOver("ran past the quick lane", [])
            for _ in range(3000):  # 30 s
                if self.release[name].wait(0.01):
                    return f"image-of-{name}"
                if quick is not None and quick.is_set():  # as the build's watch stops it
                    raise QuickBuildOver("gave its slot up", [])
            raise AssertionError(f"{name} was never let finish")

        return run

    def emit(self, name: str):
        return lambda _progress, message: self.said.setdefault(name, []).append(message)


async def until(check, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within the time")


def start(pool, b: Builds, user: str, name: str, **kw) -> asyncio.Task:
    return asyncio.ensure_future(pool.run(user, name, b.emit(name), b.build(name, **kw)))


def test_a_rebuild_runs_beside_the_users_big_build_and_a_third_waits_naming_it():
    async def main():
        pool, b = builds.BuildPool(threads=4, per_user=1, quick_s=60), Builds()
        big = start(pool, b, "ann", "big")
        await until(lambda: ("big", False) in b.ran)
        small = start(pool, b, "ann", "small")
        await until(lambda: ("small", True) in b.ran)  # at once, in the quick lane
        third = start(pool, b, "ann", "third")  # the lane is taken: it waits for the slot
        await until(lambda: "third" in b.said)
        assert b.said["small"] == [
            "Your other image build (project big) is running: this rebuild runs beside it"
            " for up to 60 s (a rebuild that reuses its cached steps needs seconds)"
        ]
        assert b.said["third"] == [
            "Waiting for your other image build (project big) to finish (you may run 1 at a"
            " time on this hub). Stop starting to give up the wait."
        ]
        # another user is not held by ann's builds
        other = start(pool, b, "bob", "bobs")
        await until(lambda: ("bobs", False) in b.ran)
        b.release["small"].set()
        assert await small == "image-of-small"
        assert not big.done() and ("third", False) not in b.ran
        b.release["big"].set()
        assert await big == "image-of-big"
        await until(lambda: ("third", False) in b.ran)  # the slot, once big's thread ended
        b.release["third"].set()
        b.release["bobs"].set()
        assert await third == "image-of-third" and await other == "image-of-bobs"
        assert pool.asked == 0 and pool.running == 0

    asyncio.run(main())


def test_a_big_build_in_the_quick_lane_waits_for_the_slot_once_past_its_time():
    async def main():
        pool, b = builds.BuildPool(threads=4, per_user=1, quick_s=20), Builds()
        big = start(pool, b, "ann", "big")
        await until(lambda: ("big", False) in b.ran)
        huge = start(pool, b, "ann", "huge", over_in_quick=True)
        await until(lambda: len(b.said.get("huge", [])) == 2)
        assert b.said["huge"][1] == (
            "Waiting for your other image build (project big) to finish: this build ran past"
            " 20 s beside it, more than a quick rebuild; it then goes on from the steps it"
            " finished (you may run 1 at a time on this hub). Stop starting to give up the wait."
        )
        assert b.ran == [("big", False), ("huge", True)]  # not again until big ended
        b.release["big"].set()
        await big
        await until(lambda: ("huge", False) in b.ran)  # now in the user's slot, no time bound
        b.release["huge"].set()
        assert await huge == "image-of-huge"

    asyncio.run(main())


def test_a_stopped_start_that_waits_never_builds_and_the_lane_is_free_after_the_thread():
    async def main():
        pool, b = builds.BuildPool(threads=4, per_user=1, quick_s=60), Builds()
        big = start(pool, b, "ann", "big")
        await until(lambda: ("big", False) in b.ran)
        small = start(pool, b, "ann", "small")
        await until(lambda: ("small", True) in b.ran)
        waiting = start(pool, b, "ann", "waiting")
        await until(lambda: "waiting" in b.said)
        waiting.cancel()  # "Stop starting"
        small.cancel()  # its thread goes on: the lane stays taken until it ended
        await asyncio.sleep(0)
        late = start(pool, b, "ann", "late")
        await until(lambda: "late" in b.said)
        assert b.said["late"][0].startswith("Waiting for your other image build (project big)")
        b.release["small"].set()
        b.release["big"].set()
        await big
        await until(lambda: ("late", False) in b.ran)
        b.release["late"].set()
        await late
        assert ("waiting", False) not in b.ran and ("waiting", True) not in b.ran

    asyncio.run(main())


def test_without_a_quick_lane_the_second_build_waits():
    async def main():
        pool, b = builds.BuildPool(threads=4, per_user=1, quick_s=0), Builds()
        big = start(pool, b, "ann", "big")
        await until(lambda: ("big", False) in b.ran)
        small = start(pool, b, "ann", "small")
        await until(lambda: "small" in b.said)
        assert b.ran == [("big", False)]
        b.release["big"].set()
        b.release["small"].set()
        await big
        assert await small == "image-of-small"

    asyncio.run(main())


def test_another_users_build_takes_the_slot_of_a_quick_build_which_then_waits():
    async def main():
        pool, b = builds.BuildPool(threads=2, per_user=1, quick_s=60), Builds()
        big = start(pool, b, "ann", "big")
        await until(lambda: ("big", False) in b.ran)
        small = start(pool, b, "ann", "small")
        await until(lambda: ("small", True) in b.ran)  # the hub's 2 slots are taken now
        bobs = start(pool, b, "bob", "bobs")
        await until(lambda: ("bobs", False) in b.ran)  # at once: ann's quick build gave way
        await until(lambda: len(b.said.get("small", [])) == 2)
        assert b.said["small"][1] == (
            "Waiting for your other image build (project big) to finish: this build gave its"
            " place beside it to another user's build; it then goes on from the steps it"
            " finished (you may run 1 at a time on this hub). Stop starting to give up the wait."
        )
        assert b.ran == [("big", False), ("small", True), ("bobs", False)]
        b.release["big"].set()
        await big
        await until(lambda: ("small", False) in b.ran)  # in ann's slot now
        b.release["small"].set()
        b.release["bobs"].set()
        assert await small == "image-of-small" and await bobs == "image-of-bobs"
        assert pool.asked == 0 and pool.running == 0 and not pool.quick_running

    asyncio.run(main())


def test_no_quick_build_starts_while_the_hubs_slots_are_taken():
    async def main():
        pool, b = builds.BuildPool(threads=2, per_user=1, quick_s=60), Builds()
        big = start(pool, b, "ann", "big")
        bobs = start(pool, b, "bob", "bobs")
        await until(lambda: ("big", False) in b.ran and ("bobs", False) in b.ran)
        small = start(pool, b, "ann", "small")
        await until(lambda: "small" in b.said)
        assert b.said["small"] == [
            "Waiting for your other image build (project big) to finish (you may run 1 at a"
            " time on this hub). Stop starting to give up the wait."
        ]
        b.release["bobs"].set()
        await bobs
        await asyncio.sleep(0.2)
        assert ("small", True) not in b.ran  # a started build waits for its user's slot
        b.release["big"].set()
        await big
        await until(lambda: ("small", False) in b.ran)
        b.release["small"].set()
        assert await small == "image-of-small"

    asyncio.run(main())

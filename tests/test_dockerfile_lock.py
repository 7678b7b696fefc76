"""One lock on a project's Dockerfile (issue 35, item 7): Save a copy's install writer
(sharing/installs.py) and %gpu_install (gpulab_jupyter.magics.dockerfile, its own code,
in a process of its own) hold the same lock, ``.gpulab/dockerfile.lock``, and exclude
each other; a held lock gives the page a sentence within its bound, and waiting for it
holds none of the hub's threads (a user can hold their own lock for ever). The project
folder is the user's: a link, a FIFO or a linked ``.gpulab`` in the lock's place is
refused in words, and nothing outside the folder is opened, made or locked."""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpulab_hub import blocking
from gpulab_hub.sharing import installs
from gpulab_jupyter.magics import dockerfile, options, runline

USER = "1000:100"  # the image's notebook user, for the block's USER line
BOUND_S = 2.0  # the page's wait for a held lock, shortened from 30 s
BUSY = f"an install in it held its Dockerfile for {BOUND_S:.0f} s; try again once it is done"
NOT_A_FILE = "its .gpulab/dockerfile.lock is not a regular file"

# %gpu_install's lock, taken in a process of its own by the magic's own code and
# library (filelock), held until its stdin closes.
HOLD = (
    "import sys\n"
    "from pathlib import Path\n"
    "from filelock import FileLock\n"
    "from gpulab_jupyter.magics import dockerfile\n"
    "lock = FileLock(str(dockerfile._lock_path(Path(sys.argv[1]))))\n"
    "lock.acquire()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)
# %gpu_install recording a line, waiting at most argv[2] seconds for the lock.
UPDATE = (
    "import sys\n"
    "from pathlib import Path\n"
    "from gpulab_jupyter.magics import dockerfile\n"
    "dockerfile.LOCK_TIMEOUT = float(sys.argv[2])\n"
    "try:\n"
    "    dockerfile.update(Path(sys.argv[1]), [('six', sys.argv[3])])\n"
    "except dockerfile.DockerfileError as e:\n"
    "    print(e)\n"
    "    sys.exit(3)\n"
)


def written(package: str, version: str) -> str:
    """The RUN line %gpu_install records for ``package`` (its own code)."""
    opts = options.parse(package)
    return runline.run_line(opts.specs[0], version, opts, {}, False, [package])


HUMANIZE = written("humanize", "4.9.0")


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setattr(installs, "LOCK_TIMEOUT", BOUND_S)
    folder = tmp_path / "alice" / "dest"
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text("FROM debian:bookworm\n")
    return folder


def found() -> installs.Found:
    return installs.Found(installs=[installs.pip_install(HUMANIZE)])


async def bring(folder: Path) -> str:
    """What Save a copy does with the destination's folder (copy.py's _bring)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return await installs.bring_along(fd, found(), USER, os.getuid(), os.getgid())
    finally:
        os.close(fd)


def magic_holds(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder / "Dockerfile")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def managed(folder: Path) -> list[str]:
    return sorted(dockerfile.managed_packages((folder / "Dockerfile").read_text()))


async def test_a_held_magic_lock_refuses_the_page_in_words_within_its_bound(project):
    before = (project / "Dockerfile").read_bytes()
    holder = magic_holds(project)
    try:
        started = time.monotonic()
        assert await bring(project) == BUSY
        took = time.monotonic() - started
        assert BOUND_S <= took < BOUND_S + 5, took
        assert (project / "Dockerfile").read_bytes() == before
    finally:
        release(holder)
    assert await bring(project) == ""  # free again: written
    assert managed(project) == ["humanize"]


async def test_the_magic_waits_for_the_page_and_then_records_its_own_line(project, monkeypatch):
    """The page holds the lock mid-write: the magic is refused in its own words while
    it does, and records its line once the page is done, beside the page's line."""
    holding, go_on = threading.Event(), threading.Event()
    write = installs.write_installs

    def slow_write(*args):
        holding.set()
        assert go_on.wait(60)
        return write(*args)

    monkeypatch.setattr(installs, "write_installs", slow_write)
    page = asyncio.ensure_future(bring(project))
    assert await asyncio.to_thread(holding.wait, 30)
    magic = [sys.executable, "-c", UPDATE, str(project / "Dockerfile")]
    refused = await asyncio.to_thread(
        subprocess.run, [*magic, "1", written("six", "1.16.0")], capture_output=True, text=True
    )
    assert refused.returncode == 3, refused.stderr
    assert "Another install held the Dockerfile's lock for 1.0 s; try again." in refused.stdout
    waiting = asyncio.ensure_future(
        asyncio.to_thread(
            subprocess.run, [*magic, "60", written("six", "1.16.0")], capture_output=True,
            text=True,
        )
    )  # fmt: skip
    await asyncio.sleep(1)
    assert not waiting.done()  # the magic waits for the page's write...
    go_on.set()
    assert await page == ""
    done = await waiting  # ...and then records its own line
    assert done.returncode == 0, done.stdout + done.stderr
    assert managed(project) == ["humanize", "six"]


async def test_waiting_for_a_held_lock_holds_none_of_the_hubs_threads(project):
    """Eight pages wait on a lock the destination's user holds; meanwhile the records
    pool (every user's shares, links, settings) answers at once."""
    holder = magic_holds(project)
    try:
        pages = [asyncio.ensure_future(bring(project)) for _ in range(8)]
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await blocking.run(blocking.RECORDS, time.monotonic)
        assert time.monotonic() - started < 1.0
        assert not any(p.done() for p in pages)
        assert await asyncio.gather(*pages) == [BUSY] * 8
    finally:
        release(holder)


def plant_link(folder: Path, outside: Path) -> None:
    (folder / ".gpulab").mkdir()
    (folder / ".gpulab" / "dockerfile.lock").symlink_to(outside / "victim")


def plant_fifo(folder: Path, outside: Path) -> None:
    (folder / ".gpulab").mkdir()
    os.mkfifo(folder / ".gpulab" / "dockerfile.lock")


def plant_folder_link(folder: Path, outside: Path) -> None:
    (folder / ".gpulab").symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize(
    ("plant", "words"),
    [
        (plant_link, NOT_A_FILE),
        (plant_fifo, NOT_A_FILE),
        (plant_folder_link, "its .gpulab is a link"),
    ],
)
async def test_a_planted_lock_is_refused_and_nothing_outside_is_touched(
    project, tmp_path, plant, words
):
    outside = tmp_path / "hub-side"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("the hub's own file\n")
    before = (project / "Dockerfile").read_bytes()
    plant(project, outside)

    started = time.monotonic()
    assert await bring(project) == words
    assert time.monotonic() - started < BOUND_S  # refused at once: no wait, no hang
    assert (project / "Dockerfile").read_bytes() == before
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]  # nothing made there
    assert victim.read_text() == "the hub's own file\n"
    with victim.open() as f:  # and nothing of the hub holds a lock on it
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

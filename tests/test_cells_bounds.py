"""What a cell run on the server keeps of its output (gpulab_jupyter/outputbound.py),
through jupyter-server-nbmodel's own output hook into a real shared notebook (pycrdt),
and what makes a project busy while a cell runs (cells.py, activity.py, idle.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from jupyter_server_nbmodel import actions
from pycrdt import Array, Doc, Map, Text

from gpulab_jupyter import cells, outputbound
from gpulab_jupyter.activity import ActivityReporter
from gpulab_jupyter.idle import activity_body


def notebook(*outputs_of_others: list[dict]):
    doc = Doc()
    ycells = doc.get("cells", type=Array)
    for n, outputs in enumerate(outputs_of_others):
        ycells.append(Map({"id": f"o{n}", "cell_type": "code", "source": Text(""),
                           "outputs": Array([Map(o) for o in outputs])}))  # fmt: skip
    me = Map({"id": "me", "cell_type": "code", "source": Text(""), "outputs": Array()})
    ycells.append(me)
    return me


def stream(text: str, name: str = "stdout") -> dict:
    return {"header": {"msg_type": "stream"}, "parent_header": {}, "metadata": {},
            "content": {"name": name, "text": text}}  # fmt: skip


def message(kind: str, content: dict) -> dict:
    return {"header": {"msg_type": kind}, "parent_header": {}, "metadata": {}, "content": content}


def run(bounds, ycell, messages) -> list:
    """Feed ``messages`` to the wrapped hook as one execution; what it kept in memory."""
    hook = outputbound.bounded_output_hook(actions._output_hook, bounds)
    budget = bounds.budget_for(0)
    token = outputbound._current.set(budget)
    kept, state = [], actions._StreamState()
    try:
        for msg in messages:
            hook(kept, ycell, state, msg)
    finally:
        outputbound._current.reset(token)
        if budget.dirty:
            budget.write(0)
    return kept


def texts(ycell) -> list[str]:
    return [str(o.get("text", "")) for o in ycell["outputs"]]


BOUNDS = dict(max_cell_chars=10_000, tail_chars=2_000, min_cell_chars=1_000, refresh_s=1e9)


def test_a_flood_keeps_its_head_and_tail_and_says_how_much_was_dropped():
    bounds = outputbound.OutputBounds(**BOUNDS)
    ycell = notebook()
    lines = [f"line {i:06d}\n" for i in range(20_000)]  # 240,000 characters
    kept = run(bounds, ycell, [stream(x) for x in lines])
    head, shown = texts(ycell)
    assert head == "".join(lines)[: len(head)] and 7_000 < len(head) <= 8_000
    marker, tail = shown.lstrip("\n").split("\n", 1)
    assert "".join(lines).endswith(tail) and len(tail) == 2_000
    dropped = int(re.search(r"([\d,]+) characters", marker).group(1).replace(",", ""))
    assert len(head) + dropped + len(tail) == len("".join(lines))
    assert len(kept) < 1_000  # the route's copy in memory: the head's messages only


def test_a_progress_bar_past_the_budget_still_overwrites_its_line():
    bounds = outputbound.OutputBounds(**BOUNDS)
    ycell = notebook()
    flood = [stream("x" * 99 + "\n") for _ in range(200)]
    bar = [stream(f"\r{i}/500", "stdout") for i in range(1, 501)]
    run(bounds, ycell, flood + bar)
    assert texts(ycell)[-1].endswith("\n500/500") and "499/500" not in texts(ycell)[-1]


def test_the_notebooks_other_cells_leave_this_one_less():
    bounds = outputbound.OutputBounds(**{**BOUNDS, "max_notebook_chars": 6_000})
    big = {"output_type": "stream", "name": "stdout", "text": "y" * 4_000}
    ycell = notebook([big])
    run(bounds, ycell, [stream("z" * 100 + "\n") for _ in range(100)])
    head = texts(ycell)[0]
    assert len(head) <= 6_000 - 4_000 - 1_000  # what the other cell leaves, less the tail
    assert "left out here" in texts(ycell)[-1]


def test_clear_output_gives_the_cell_its_budget_again_and_errors_always_show():
    bounds = outputbound.OutputBounds(**BOUNDS)
    ycell = notebook()
    flood = [stream("x" * 999 + "\n") for _ in range(30)]
    error = message("error", {"ename": "ValueError", "evalue": "bad", "traceback": ["tb"]})
    run(bounds, ycell, [*flood, message("clear_output", {"wait": False}), stream("fresh\n"),
                        *flood, error])  # fmt: skip
    outputs = ycell["outputs"].to_py()
    assert outputs[0]["text"].startswith("fresh\n")
    assert any(o.get("ename") == "ValueError" for o in outputs), outputs


def test_a_running_or_queued_cell_is_activity_for_the_culler_and_reclaim():
    tracker = cells.RunningCells()
    settings = {"gpulab_cells": tracker}
    reporter = ActivityReporter(settings, engine=None, sampler=None)
    assert not reporter.cells_busy()
    key = tracker.start({"request_id": "r1", "cell_id": "c1", "document_path": "t.ipynb"})
    assert reporter.cells_busy() and tracker.busy_paths() == {"t.ipynb"}
    body = tracker.body(tracker.running[key]["since"] + 125)
    assert body["running"][0]["seconds"] == 125 and body["running"][0]["cell_id"] == "c1"
    tracker.end(key)
    assert not reporter.cells_busy()
    now = datetime.now(UTC)
    settings = {"gpulab_cells_last_activity": now - timedelta(seconds=20)}
    body = activity_body(settings, now - timedelta(hours=1), 600, now)
    assert body["kept_by"] == ["cell"]


def test_a_first_message_larger_than_the_budget_still_fills_the_head():
    # a kernel sends what was printed in its last 0.2 s as one message: megabytes
    bounds = outputbound.OutputBounds(**BOUNDS)
    ycell = notebook()
    printed = "".join(f"{i:09d}\n" for i in range(100_000))
    run(bounds, ycell, [stream(printed)])
    head, shown = texts(ycell)
    assert len(head) == 8_000 and printed.startswith(head)
    assert shown.endswith(printed[-2_000:])


def test_a_bar_outside_ascii_rewrites_its_line_in_the_shared_notebook():
    # tqdm's bar: "█" is 3 bytes in UTF-8, where pycrdt's Text counts its offsets
    from gpulab_jupyter.streams import stream_hook

    ycell = notebook()
    hook = stream_hook(actions._output_hook)
    state, kept = actions._StreamState(), []
    for i in range(1, 6):
        hook(kept, ycell, state, stream(f"\r{'█' * i}{' ' * (5 - i)}| {i}/5", "stderr"))
    hook(kept, ycell, state, stream("\n", "stderr"))
    assert texts(ycell) == ["█████| 5/5\n"]
    assert len(kept) == 6  # the library's copy of each message, for its HTTP answer

"""Bounded outputs for cells run on the server (jupyter-server-nbmodel).

jupyter-server-nbmodel writes every output a cell sends into the notebook's shared
document (and keeps a copy in memory for its HTTP answer) without a limit: a cell
that prints 1 GB puts 1 GB into the notebook, its saved .ipynb, the collaboration
store and the memory of the project's server. Here each execution has a budget of
characters (``OutputBounds``): what fits is written as the library writes it (the
head); past it, nothing more reaches the document except, refreshed at most every
``refresh_s``, one last stream output holding a line that says how much was
dropped and the last ``tail_chars`` characters printed (a progress bar still
overwrites its line there). A notebook's cells together stay under
``max_notebook_chars``: a cell's budget is what the notebook's other cells leave.

:func:`install` wraps the library's ``_output_hook`` and ``_execute_snippet``
(module functions of ``jupyter_server_nbmodel.actions``, looked up by name at each
call), the hook with display updates too (``displays.py``: the library ignores
``update_display_data``) and streams written at the right offsets (``streams.py``:
the library's rewrite of a line breaks on text outside ASCII); the pure part
(:class:`Budget`) is tested without a kernel.
"""

from __future__ import annotations

import contextvars
import json
import time
from dataclasses import dataclass, field

from traitlets import Float, Integer
from traitlets.config import Configurable

from .displays import DISPLAYS, display_hook
from .streams import stream_hook

# The execution the running hook belongs to (set by the wrapped _execute_snippet).
_current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "gpulab_output_budget", default=None
)
MARKER = "[gpulab: {dropped} of this cell's output left out here: {what}; the last {tail} follow]\n"


class OutputBounds(Configurable):
    """How much output of a cell run on the server is kept."""

    max_cell_chars = Integer(
        1_000_000,
        config=True,
        help="""Characters of output one execution of a cell may keep in the notebook
        (streams, rich displays and errors counted by their JSON size): the first part
        as printed, then a line saying how much was dropped and the last
        ``tail_chars`` characters. Example: ``c.OutputBounds.max_cell_chars = 500000``""",
    )
    tail_chars = Integer(
        100_000,
        config=True,
        help="""Of a cell's budget, how many characters are the end of its output (the
        last lines printed). At most half of ``max_cell_chars``.
        Example: ``c.OutputBounds.tail_chars = 50000``""",
    )
    max_notebook_chars = Integer(
        20_000_000,
        config=True,
        help="""Characters of output all the cells of one notebook keep together: a cell
        run on the server gets what the other cells leave (at least ``min_cell_chars``).
        Example: ``c.OutputBounds.max_notebook_chars = 50000000``""",
    )
    min_cell_chars = Integer(
        20_000,
        config=True,
        help="""A cell's budget when its notebook's other cells already hold
        ``max_notebook_chars``. Example: ``c.OutputBounds.min_cell_chars = 10000``""",
    )
    refresh_s = Float(
        2.0,
        config=True,
        help="""While a cell prints past its budget, how often (seconds) the kept end
        of its output is rewritten in the notebook. Example: ``c.OutputBounds.refresh_s = 5``""",
    )

    def budget_for(self, others: int) -> Budget:
        cell = min(self.max_cell_chars, max(self.min_cell_chars, self.max_notebook_chars - others))
        tail = max(0, min(self.tail_chars, cell // 2))
        return Budget(head=cell - tail, tail=tail, refresh_s=self.refresh_s)


def output_size(output: dict) -> int:
    """What an output costs: a stream its text, anything else its JSON."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return len(text) if isinstance(text, str) else sum(len(t) for t in text)
    return len(json.dumps(output, default=str))


@dataclass
class Budget:
    """One execution's outputs against its budget (pure; the document part is
    :meth:`write`)."""

    head: int
    tail: int
    refresh_s: float = 2.0
    used: int = 0  # characters written as printed (the head)
    dropped_chars: int = 0
    dropped_outputs: int = 0  # rich outputs left out
    overflow: bool = False
    tail_text: str = ""
    tail_cursor: int = 0
    tail_name: str = "stdout"
    written_at: float = field(default=-1e9)
    dirty: bool = False
    ycell: object = None
    tail_output: bool = False  # whether the last output is the one holding marker and tail

    def size(self, other: Budget) -> None:
        """Take the head and tail of ``other`` (sized once the notebook is known)."""
        self.head, self.tail = other.head, other.tail

    def reset(self) -> None:
        """clear_output: the cell is empty again, and so is its budget."""
        self.used = self.dropped_chars = self.dropped_outputs = 0
        self.overflow, self.dirty = False, False
        self.tail_text, self.tail_cursor, self.tail_output = "", 0, False

    def room(self, output: dict) -> int:
        """Of a stream that did not fit, how many characters still go into the head
        (counted as written); 0 for anything else, or once the head is full."""
        if output.get("output_type") != "stream" or self.used >= self.head:
            return 0
        room = self.head - self.used
        self.used = self.head
        return room

    def fits(self, output: dict) -> bool:
        """Whether ``output`` may be written as printed (counts it if so)."""
        if self.overflow:
            return False
        size = output_size(output)
        if self.used + size <= self.head:
            self.used += size
            return True
        self.overflow = True
        return False

    def take(self, output: dict) -> None:
        """An output past the head: a stream goes into the tail, anything else is
        counted as dropped."""
        from jupyter_server_nbmodel.actions import _apply_terminal_controls

        self.dirty = True
        if output.get("output_type") != "stream":
            self.dropped_outputs += 1
            return
        text = output.get("text", "")
        text = text if isinstance(text, str) else "".join(text)
        self.tail_name = output.get("name", self.tail_name)
        if len(text) > 2 * self.tail:  # the kept end is all new: skip what it overwrites
            self.dropped_chars += len(self.tail_text) + len(text) - self.tail
            text, self.tail_text, self.tail_cursor = text[-self.tail :], "", 0
        self.tail_text, self.tail_cursor = _apply_terminal_controls(
            self.tail_text, text, self.tail_cursor
        )
        extra = len(self.tail_text) - self.tail
        if extra > 0:
            self.tail_text = self.tail_text[extra:]
            self.tail_cursor = max(0, self.tail_cursor - extra)
            self.dropped_chars += extra

    def marker(self) -> str:
        what = []
        if self.dropped_chars:
            what.append(f"{self.dropped_chars:,} characters")
        if self.dropped_outputs:
            what.append(f"{self.dropped_outputs:,} displays")
        dropped = " and ".join(what) or "nothing yet"
        return MARKER.format(
            dropped=dropped,
            what=f"the cell printed more than {self.head + self.tail:,} characters",
            tail=f"{len(self.tail_text):,} characters",
        )

    def shown(self) -> str:
        """The text of the last stream output while over budget."""
        return "\n" + self.marker() + self.tail_text

    def due(self, now: float) -> bool:
        return self.dirty and now - self.written_at >= self.refresh_s

    def write(self, now: float) -> None:
        """Put the marker and the tail into the cell (one output, rewritten)."""
        from pycrdt import Map, Text

        self.written_at, self.dirty = now, False
        if self.ycell is None:
            return
        outputs = self.ycell["outputs"]
        text = self.shown()
        with outputs.doc.transaction():
            last = outputs[len(outputs) - 1] if len(outputs) else None
            ytext = last.get("text") if self.tail_output and hasattr(last, "get") else None
            if isinstance(ytext, Text) and str(ytext).startswith("\n[gpulab: "):
                del ytext[:]
                ytext += text
            else:
                outputs.append(
                    Map({"output_type": "stream", "name": self.tail_name, "text": Text(text)})
                )
                self.tail_output = True


def others_size(ycell) -> int:
    """Output characters of the notebook's other cells (the document of ``ycell``)."""
    from pycrdt import Array

    try:
        cells = ycell.doc.get("cells", type=Array)
    except (TypeError, ValueError):
        return 0
    me = ycell.get("id")
    total = 0
    for cell in cells:
        if cell.get("id") == me or "outputs" not in cell:
            continue
        for output in cell["outputs"]:
            total += output_size(output.to_py() if hasattr(output, "to_py") else dict(output))
    return total


def bounded_output_hook(original, bounds: OutputBounds):
    """``jupyter_server_nbmodel.actions._output_hook``, within the running execution's
    budget."""

    def hook(outputs, ycell, stream_state, msg):
        budget = _current.get()
        msg_type = msg["header"]["msg_type"]
        if budget is None or msg_type not in ("display_data", "stream", "execute_result",
                                              "error", "clear_output"):  # fmt: skip
            return original(outputs, ycell, stream_state, msg)
        if budget.ycell is None and ycell is not None:
            budget.ycell = ycell
            budget.size(bounds.budget_for(others_size(ycell)))
            DISPLAYS.forget_cell(ycell)  # its outputs were cleared as it started
        if msg_type == "clear_output":
            budget.reset()
            return original(outputs, ycell, stream_state, msg)
        # What it costs (not nbformat's validated output: that is most of the time here).
        output = {"output_type": msg_type, **(msg.get("content") or {})}
        if budget.fits(output):
            return original(outputs, ycell, stream_state, msg)
        room = budget.room(output)
        if room > 0:  # a stream's first part still fits the head (a kernel batches prints)
            text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
            content = {**msg["content"], "text": text[:room]}
            original(outputs, ycell, stream_state, {**msg, "content": content})
            output = {**output, "text": text[room:]}
        if msg_type == "error":  # what went wrong is always shown (and counted)
            import nbformat

            output = nbformat.v4.output_from_msg(msg)
            outputs.append(output)
            if ycell is not None:
                ycell["outputs"].append(output)
            return None
        budget.take(output)
        now = time.monotonic()
        if budget.due(now):
            budget.write(now)
        return None

    hook.__gpulab_bounded__ = True
    return hook


def bounded_execute(original, bounds: OutputBounds, tracker):
    """``jupyter_server_nbmodel.actions._execute_snippet`` with a budget per execution
    (and the tail written once more when it ends), told to ``tracker`` (its ``start``
    and ``end``: cells.RunningCells) as it starts and ends."""

    async def execute(client, ydoc, snippet, metadata, *args, **kwargs):
        budget = bounds.budget_for(0)  # resized by the first output (the notebook's others)
        token = _current.set(budget)
        key = tracker.start(metadata)
        try:
            result = await original(client, ydoc, snippet, metadata, *args, **kwargs)
        finally:
            tracker.end(key)
            _current.reset(token)
            if budget.dirty:
                budget.write(time.monotonic())
        return result

    execute.__gpulab_bounded__ = True
    return execute


def install(bounds: OutputBounds, tracker) -> bool:
    """Wrap jupyter-server-nbmodel's hooks once; False where it is not installed."""
    try:
        from jupyter_server_nbmodel import actions
    except ImportError:
        return False
    if not getattr(actions._output_hook, "__gpulab_bounded__", False):
        # nbmodel's hook with streams at the right offsets (streams.py) and display
        # updates (displays.py), under the bound
        hook = stream_hook(actions._output_hook)
        hook = display_hook(hook, lambda: bounds.max_cell_chars)
        actions._output_hook = bounded_output_hook(hook, bounds)
    if not getattr(actions._execute_snippet, "__gpulab_bounded__", False):
        actions._execute_snippet = bounded_execute(actions._execute_snippet, bounds, tracker)
    return True

"""Progress of an install in the notebook: ipywidgets when a frontend can show
them (stage line plus a collapsible log tail), plain text otherwise.

A widget lives only as long as its kernel: a saved notebook keeps the output's
other formats. So the widget is displayed with a text/plain and text/html of its
own (not ipywidgets' ``VBox(children=...)``), and when the install ends the same
output is replaced (``update_display``) by a static HTML and text summary: the
outcome, the stages and the log's last lines. Every line shown is plain text
(no terminal escape codes).
"""

from __future__ import annotations

import html
import os
import sys
import time
from collections import deque
from pathlib import Path

from .piplog import plain

STAGES = ("resolving", "building", "installing", "verifying", "recording")
TAIL = 40
_PRE = "max-height:24em;overflow:auto;font-size:85%"


def widgets_available() -> bool:
    if os.environ.get("GPULAB_PROGRESS", "").lower() == "text":
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return False  # terminal IPython: no widget frontend
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class Progress:
    """``stage(name)``, ``line(text)`` while working; ``finish(ok)`` at the end."""

    def __init__(self, title: str, use_widgets: bool | None = None, log: Path | None = None):
        self.title = title
        self.log = log
        self.current = ""
        self.done = False
        self.tail: deque[str] = deque(maxlen=TAIL)
        self.started = time.monotonic()
        self._shown = 0.0
        self.widgets = widgets_available() if use_widgets is None else use_widgets
        if self.widgets:
            import ipywidgets as w
            from IPython.display import display

            self._label = w.HTML()
            self._log = w.HTML()
            self._acc = w.Accordion(children=[self._log], selected_index=None)
            self._acc.set_title(0, "Log (last lines)")
            self._box = w.VBox([self._label, self._acc])
            self._render()
            data = self._box._repr_mimebundle_()
            data.update(self._fallback())
            self._handle = display(data, raw=True, display_id=True)

    def _fallback(self) -> dict[str, str]:
        """What a saved notebook shows of the live widget (saved before the end)."""
        text = (
            f"%gpu_install {self.title}: still running when this output was saved; "
            "its outcome is not known here."
        )
        if self.log:
            text += f" Its log: {self.log}"
        return {"text/plain": text, "text/html": f"<p>{html.escape(text)}</p>"}

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.0f} s"

    def _stages_html(self, done: bool = False, ok: bool = True) -> str:
        parts = []
        for s in STAGES:
            if s == self.current and not done:
                parts.append(f"<b>{s}…</b>")
            else:
                parts.append(f"<span style='opacity:0.6'>{s}</span>")
        status = ("✔ done" if ok else "✘ failed") if done else self._elapsed()
        title = html.escape(self.title)
        return f"<code>%gpu_install</code> {title}: {' › '.join(parts)} ({status})"

    def _log_html(self) -> str:
        return f"<pre style='{_PRE}'>" + html.escape("\n".join(self.tail)) + "</pre>"

    def _render(self, done: bool = False, ok: bool = True) -> None:
        self._label.value = self._stages_html(done, ok)
        self._log.value = self._log_html()

    def outcome(self, ok: bool) -> str:
        """One line: how the install ended (for the summary)."""
        if ok:
            return f"✔ done in {self._elapsed()}"
        return f"✘ failed while {self.current or 'starting'}, after {self._elapsed()}"

    def summary(self, ok: bool) -> dict[str, str]:
        """The static output that replaces the widget: text/html and text/plain."""
        head = f"%gpu_install {self.title}: {self.outcome(ok)}"
        where = f"full log: {self.log}" if self.log else "the log's last lines"
        text = [head]
        if self.log:
            text.append(f"Full log: {self.log}")
        colour = "" if ok else " style='color:var(--jp-error-color1, #c62828)'"
        page = [
            f"<div class='gpulab-install'><p{colour}><code>%gpu_install</code> "
            f"{html.escape(self.title)}: {html.escape(self.outcome(ok))}</p>"
        ]
        if self.tail:
            page.append(
                f"<details><summary>Log, last {len(self.tail)} lines "
                f"({html.escape(where)})</summary>{self._log_html()}</details>"
            )
        page.append("</div>")
        return {"text/plain": "\n".join(text), "text/html": "".join(page)}

    def stage(self, name: str) -> None:
        if name == self.current:
            return
        self.current = name
        if self.widgets:
            self._render()
        else:
            print(f"%gpu_install {self.title}: {name}…", flush=True)

    def line(self, text: str) -> None:
        self.tail.append(plain(text))
        if self.widgets and time.monotonic() - self._shown > 0.3:
            self._shown = time.monotonic()
            self._render()

    def finish(self, ok: bool) -> None:
        """The end: the live widget becomes the static summary (a saved notebook keeps it)."""
        if self.done:
            return
        self.done = True
        if self.widgets:
            self._render(done=True, ok=ok)
            self._handle.update(self.summary(ok), raw=True)
            for widget in (self._box, self._acc, self._log, self._label):
                widget.close()


def say(text: str, error: bool = False) -> None:
    print(plain(text), file=sys.stderr if error else sys.stdout, flush=True)

"""Progress of an install in the notebook: ipywidgets when a frontend can show
them (stage line plus a collapsible log tail), plain text otherwise."""

from __future__ import annotations

import html
import os
import sys
import time
from collections import deque

STAGES = ("resolving", "building", "installing", "verifying", "recording")
TAIL = 40


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

    def __init__(self, title: str, use_widgets: bool | None = None):
        self.title = title
        self.current = ""
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
            display(self._box)

    def _stages_html(self, done: bool = False, ok: bool = True) -> str:
        parts = []
        for s in STAGES:
            if s == self.current and not done:
                parts.append(f"<b>{s}…</b>")
            else:
                parts.append(f"<span style='opacity:0.6'>{s}</span>")
        elapsed = time.monotonic() - self.started
        status = ("✔ done" if ok else "✘ failed") if done else f"{elapsed:.0f} s"
        title = html.escape(self.title)
        return f"<code>%gpu_install</code> {title}: {' › '.join(parts)} ({status})"

    def _render(self, done: bool = False, ok: bool = True) -> None:
        self._label.value = self._stages_html(done, ok)
        self._log.value = (
            "<pre style='max-height:24em;overflow:auto;font-size:85%'>"
            + html.escape("\n".join(self.tail))
            + "</pre>"
        )

    def stage(self, name: str) -> None:
        if name == self.current:
            return
        self.current = name
        if self.widgets:
            self._render()
        else:
            print(f"%gpu_install {self.title}: {name}…", flush=True)

    def line(self, text: str) -> None:
        self.tail.append(text)
        if self.widgets and time.monotonic() - self._shown > 0.3:
            self._shown = time.monotonic()
            self._render()

    def finish(self, ok: bool) -> None:
        if self.widgets:
            self._render(done=True, ok=ok)
            if not ok:
                self._acc.selected_index = 0


def say(text: str, error: bool = False) -> None:
    print(text, file=sys.stderr if error else sys.stdout, flush=True)

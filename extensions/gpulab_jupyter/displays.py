"""Display updates for cells run on the server (jupyter-server-nbmodel).

A cell may show an output and change it later: ``display(obj, display_id=True)``
returns a handle whose ``.update(...)`` sends the kernel message
``update_display_data`` (``%gpu_install``'s progress becomes its summary that way,
and so do many libraries' progress displays). jupyter-server-nbmodel 0.2.9 writes
``display_data`` into the notebook and ignores ``update_display_data``
(``jupyter_server_nbmodel/actions.py``, ``_output_hook``: ``elif msg_type ==
"update_display_data": # FIXME``), so the update never reached the notebook.

Here, per notebook document, a map display id → the outputs written with that id
(cell id, position among the cell's outputs, a fingerprint of what was written):
the display id travels in the message's ``transient`` part, which nbformat does not
keep in the saved output, so it can only be known as the output is written. An
update replaces each of those outputs (its data and metadata; the output's type and
execution count stay), in whichever cell it is: a handle made in one cell may be
updated from a later one. An entry is forgotten when its cell runs again or clears
its output, or when the output at its place is no longer of the kind written (its
type and formats: someone cleared the outputs in the browser; a page that rewrote
what it shows, as jupyterlab-widgets does to a closed widget's view, leaves it
the same). An update larger than the cell's bound is
replaced by a line saying so (``outputbound.py``).

:func:`display_hook` wraps the library's ``_output_hook``; it is installed by
``outputbound.install``, under the bound.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass

EARLY_KEPT = 32  # updates kept per document for outputs not written yet
TOO_BIG = "[gpulab: a display update of {size:,} characters left out: more than a cell keeps]"


@dataclass
class Shown:
    """One output written with a display id."""

    cell_id: str
    index: int
    print: str  # fingerprint of the output as written (or last updated): its shape


def fingerprint(output: dict) -> str:
    """What an output written for a display id is known by at its place: its type and
    the formats it holds, not their content. A page may rewrite the output it shows
    (jupyterlab-widgets blanks a closed widget's ``model_id`` in the view's data, and
    the page writes that back into the shared notebook), which does not make it
    another output; clearing or re-running the cell does (forget_cell) and so does
    another kind of output at that place."""
    data = output.get("data")
    kinds = sorted(data) if isinstance(data, dict) else []
    shape = [output.get("output_type"), kinds]
    return hashlib.sha256(json.dumps(shape, default=str).encode()).hexdigest()


def plain(value) -> dict:
    return value.to_py() if hasattr(value, "to_py") else dict(value)


class Displays:
    """display id → outputs written, per notebook document (dropped with it)."""

    def __init__(self):
        self._docs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # display id → the last update that found nothing to replace, per document: an
        # update may reach the server before the output it updates was written (the
        # server's kernel client and the document travel apart); applied as it comes
        self._early: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def of(self, ycell) -> dict[str, list[Shown]] | None:
        doc = getattr(ycell, "doc", None)
        if doc is None:
            return None
        try:
            return self._docs.setdefault(doc, {})
        except TypeError:  # a document that takes no weak reference: not tracked
            return None

    def forget_cell(self, ycell) -> None:
        """The cell runs again or cleared its output: its displays are gone."""
        ids = self.of(ycell)
        if not ids:
            return
        cell_id = ycell.get("id")
        for display_id in list(ids):
            ids[display_id] = [s for s in ids[display_id] if s.cell_id != cell_id]
            if not ids[display_id]:
                del ids[display_id]

    def written(self, ycell, display_id: str) -> None:
        """The last output of ``ycell`` was just written for ``display_id``."""
        ids = self.of(ycell)
        outputs = ycell["outputs"]
        if ids is None or not len(outputs):
            return
        index = len(outputs) - 1
        ids.setdefault(display_id, []).append(
            Shown(ycell.get("id"), index, fingerprint(plain(outputs[index])))
        )
        early = self._early.get(ycell.doc, {}).pop(display_id, None)
        if early is not None:
            self.update(ycell, display_id, *early)

    def update(self, ycell, display_id: str, data: dict, metadata: dict) -> int:
        """Replace every output shown for ``display_id`` in ``ycell``'s notebook;
        how many were replaced."""
        from pycrdt import Array

        ids = self.of(ycell)
        shown = (ids or {}).get(display_id)
        if not shown:
            if ids is not None:
                early = self._early.setdefault(ycell.doc, {})
                early.pop(display_id, None)
                early[display_id] = (data, metadata)
                while len(early) > EARLY_KEPT:
                    del early[next(iter(early))]
            return 0
        try:
            cells = {c.get("id"): c for c in ycell.doc.get("cells", type=Array)}
        except (TypeError, ValueError):
            return 0
        kept, done = [], 0
        with ycell.doc.transaction():
            for s in shown:
                cell = cells.get(s.cell_id)
                outputs = cell["outputs"] if cell is not None and "outputs" in cell else None
                if outputs is None or s.index >= len(outputs):
                    continue
                old = plain(outputs[s.index])
                if fingerprint(old) != s.print:
                    continue  # not the output written any more
                new = {**old, "data": data, "metadata": metadata}
                del outputs[s.index]
                outputs.insert(s.index, new)
                s.print = fingerprint(plain(outputs[s.index]))
                kept.append(s)
                done += 1
        if kept:
            ids[display_id] = kept
        else:
            ids.pop(display_id, None)
        return done


DISPLAYS = Displays()


def display_hook(original, max_chars):
    """``jupyter_server_nbmodel.actions._output_hook`` with display updates;
    ``max_chars()`` is how large an updated output may be."""

    def hook(outputs, ycell, stream_state, msg):
        msg_type = msg["header"]["msg_type"]
        content = msg.get("content") or {}
        display_id = (content.get("transient") or {}).get("display_id")
        if msg_type == "update_display_data":
            if ycell is None or not isinstance(display_id, str):
                return None
            data, metadata = content.get("data") or {}, content.get("metadata") or {}
            size = len(json.dumps(data, default=str))
            if size > max_chars():
                data, metadata = {"text/plain": TOO_BIG.format(size=size)}, {}
            DISPLAYS.update(ycell, display_id, data, metadata)
            return None
        result = original(outputs, ycell, stream_state, msg)
        if ycell is None:
            return result
        if msg_type == "clear_output":
            DISPLAYS.forget_cell(ycell)
        elif msg_type in ("display_data", "execute_result") and isinstance(display_id, str):
            DISPLAYS.written(ycell, display_id)
        return result

    hook.__gpulab_displays__ = True
    return hook

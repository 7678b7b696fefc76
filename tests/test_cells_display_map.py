"""The display map of cells run on the server's side (gpulab_jupyter/displays.py) over a
real shared notebook (pycrdt, as jupyter-collaboration holds it): an update replaces
the output written for its display id even after a page rewrote that output's content
(jupyterlab-widgets blanks a closed widget's model_id and the page writes it back),
an update that reaches the server before its output was written is applied when the
output comes, and an output of another kind at that place (the outputs cleared and
something else shown) is left alone."""

from __future__ import annotations

import pytest

pycrdt = pytest.importorskip("pycrdt")

from gpulab_jupyter.displays import Displays  # noqa: E402

VIEW = "application/vnd.jupyter.widget-view+json"
SUMMARY = {"text/plain": "%gpu_install x: ✔ done in 3 s", "text/html": "<p>done</p>"}


def notebook():
    doc = pycrdt.Doc()
    cells = doc.get("cells", type=pycrdt.Array)
    cells.append(pycrdt.Map({"id": "c1", "cell_type": "code", "outputs": pycrdt.Array()}))
    return doc, cells[0]


def show(ycell, data: dict) -> None:
    ycell["outputs"].append({"output_type": "display_data", "data": data, "metadata": {}})


def outputs(ycell) -> list[dict]:
    return [o.to_py() if hasattr(o, "to_py") else dict(o) for o in ycell["outputs"]]


def widget() -> dict:
    return {VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0},
            "text/plain": "still running", "text/html": "<p>still running</p>"}  # fmt: skip


def test_an_update_replaces_a_widget_view_the_page_rewrote():
    doc, ycell = notebook()
    displays = Displays()
    show(ycell, widget())
    displays.written(ycell, "d1")
    # the page blanks the closed widget's model id in what it shows, and writes it back
    rewritten = widget()
    rewritten[VIEW]["model_id"] = ""
    with doc.transaction():
        del ycell["outputs"][0]
        ycell["outputs"].insert(0, {"output_type": "display_data", "data": rewritten,
                                    "metadata": {}})  # fmt: skip
    assert displays.update(ycell, "d1", SUMMARY, {}) == 1
    assert [o["data"] for o in outputs(ycell)] == [SUMMARY]


def test_an_update_before_its_output_is_applied_when_the_output_comes():
    doc, ycell = notebook()
    displays = Displays()
    show(ycell, {"text/plain": "before"})
    displays.written(ycell, "other")
    assert displays.update(ycell, "d1", SUMMARY, {}) == 0
    show(ycell, widget())
    displays.written(ycell, "d1")
    assert [o["data"] for o in outputs(ycell)] == [{"text/plain": "before"}, SUMMARY]


def test_an_output_of_another_kind_at_its_place_is_left_alone():
    doc, ycell = notebook()
    displays = Displays()
    show(ycell, widget())
    displays.written(ycell, "d1")
    with doc.transaction():
        del ycell["outputs"][:]
        ycell["outputs"].append({"output_type": "stream", "name": "stdout", "text": "hi\n"})
    assert displays.update(ycell, "d1", SUMMARY, {}) == 0
    assert outputs(ycell) == [{"output_type": "stream", "name": "stdout", "text": "hi\n"}]

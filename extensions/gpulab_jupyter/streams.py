"""Streams (prints) of cells run on the server, written into the shared notebook
with the right offsets.

jupyter-server-nbmodel 0.2.9 (``jupyter_server_nbmodel/actions.py``, ``_output_hook``,
its ``msg_type == "stream"`` branch) rewrites a stream's text in place when a
carriage return or backspace changed its end (a progress bar): ``del
previous_text[shared:]`` with ``shared`` counted in Python characters. pycrdt's
``Text`` (0.14) counts offsets in UTF-8 bytes, so as soon as the text holds a
character outside ASCII (tqdm's bar is made of "█"), the deletion is misplaced and
yrs panics ("Couldn't remove N elements from an array"): the cell's run ends in an
error and its output stops there.

:func:`stream_hook` writes stream messages as the library does (same
``_StreamState``, same ``_apply_terminal_controls``, the same one output per stream
run) with the shared prefix converted to the text's own byte offset; every other
message goes to the library's hook unchanged.
"""

from __future__ import annotations


def _byte_offset(text: str, chars: int) -> int:
    return len(text[:chars].encode("utf-8"))


def write_stream(ycell, stream_state, output: dict) -> None:
    """``output`` (an nbformat stream) into ``ycell``'s outputs: appended to the last
    output of the same stream, terminal controls applied."""
    from jupyter_server_nbmodel.actions import (
        _apply_terminal_controls,
        _common_prefix_length,
        _stream_text,
    )
    from pycrdt import Map, Text

    cell_outputs = ycell["outputs"]
    last = cell_outputs[-1] if len(cell_outputs) else None
    if last is not None and last.get("name") != output["name"]:
        last = None
    if last is None:
        stream_state.reset(output["name"])
    elif stream_state.name != output["name"]:
        # the cell already holds this stream (a resumed run): continue its text
        stream_state.reset(output["name"], _stream_text(last["text"]))
    stream_state.text, stream_state.cursor = _apply_terminal_controls(
        stream_state.text, output["text"], stream_state.cursor
    )
    expected = stream_state.text
    if last is None:
        with cell_outputs.doc.transaction():
            cell_outputs.append(Map({**output, "text": Text(expected)}))
        return
    previous = last["text"]
    actual = _stream_text(previous)
    if actual == expected or actual.startswith(expected):
        return
    with cell_outputs.doc.transaction():
        if isinstance(previous, Text):
            shared = _common_prefix_length(actual, expected)
            if shared < len(actual):
                del previous[_byte_offset(actual, shared) :]
            previous += expected[shared:]
        else:
            last["text"] = Text(expected)


def stream_hook(original):
    """``jupyter_server_nbmodel.actions._output_hook`` with streams written by
    :func:`write_stream`."""

    def hook(outputs, ycell, stream_state, msg):
        if msg["header"]["msg_type"] != "stream" or ycell is None:
            return original(outputs, ycell, stream_state, msg)
        import nbformat

        output = nbformat.v4.output_from_msg(msg)
        outputs.append(output)  # the library's copy, for its HTTP answer
        write_stream(ycell, stream_state, output)
        return None

    hook.__gpulab_streams__ = True
    return hook

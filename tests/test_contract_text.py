"""One ANSI stripper (gpulab_contract.text) for build logs, job logs and pip's output:
each case one of the three old strippers handled, and those none of them did."""

from __future__ import annotations

import pytest

from gpulab_contract.text import strip_ansi
from gpulab_hub.images.project import plain_text
from gpulab_jupyter.jobs import handlers
from gpulab_jupyter.magics import piplog

CASES = [
    # all three old ones: CSI colours and cursor moves
    ("\x1b[31mred\x1b[0m plain", "red plain"),
    ("\x1b[1;32mok\x1b[m", "ok"),
    ("\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),
    ("\x1b[2K\x1b[1Gprogress", "progress"),
    # all three: a two-character escape (ESC M: reverse index, ESC =: keypad)
    ("a\x1bMb\x1b=c", "abc"),
    # the build log's and pip's: OSC window titles and links, ended by BEL or ESC \
    ("\x1b]0;docker build\x07step 1", "step 1"),
    ("\x1b]8;;https://pypi.org/\x1b\\a link\x1b]8;;\x1b\\", "a link"),
    # the build log's and pip's: CSI with intermediates (DECSCUSR)
    ("\x1b[2 qcursor", "cursor"),
    # pip's only: an OSC cut off (a program killed mid-title), a lone ESC at the end,
    # the 8-bit CSI
    ("before\x1b]0;title never ended", "before"),
    ("cut\x1b]0;off\nthe next line stays", "cut\nthe next line stays"),
    ("end\x1b", "end"),
    ("\x9b31mred8\x9b0m", "red8"),
    # none of them: character sets (ESC ( B), save/restore cursor (ESC 7, ESC 8),
    # reset (ESC c), DCS and APC strings, 8-bit OSC
    ("\x1b(Bplain\x1b)0", "plain"),
    ("\x1b7saved\x1b8", "saved"),
    ("\x1bcreset", "reset"),
    ("\x1bPq#0;1;2\x1b\\sixel gone", "sixel gone"),
    ("\x1b_app\x1b\\text", "text"),
    ("\x9d0;title\x9cafter", "after"),
    # and what is no escape stays
    ("a[31m] b\tc (x) ~", "a[31m] b\tc (x) ~"),
    ("ünïcode — ok", "ünïcode — ok"),
]


@pytest.mark.parametrize(("raw", "plain"), CASES)
def test_escape_sequences_are_stripped(raw, plain):
    assert strip_ansi(raw) == plain


@pytest.mark.parametrize(("raw", "plain"), CASES)
def test_each_reader_strips_with_the_contracts_grammar(raw, plain):
    """The hub's build log page, the Jobs panel's log tail and %gpu_install's pip
    output show the same text for the same bytes."""
    assert plain_text(raw) == plain
    assert handlers.plain(raw) == plain
    assert piplog.plain(raw) == plain


def test_no_escape_survives_any_mix():
    text = "\n".join(raw for raw, _ in CASES) * 3
    out = strip_ansi(text)
    assert "\x1b" not in out and "\x9b" not in out and "\x9d" not in out
    assert out == "\n".join(plain for _, plain in CASES) * 3

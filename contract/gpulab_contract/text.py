"""Terminal output as plain text: one grammar of escape sequences for both sides (the
hub's build logs, the project's job logs and pip's output in %gpu_install).

ECMA-48 (ISO 6429), as terminals read it:

- CSI, 7-bit ``ESC [`` or 8-bit ``\\x9b``: parameters ``0-?``, intermediates `` -/``,
  a final ``@-~`` (colours, cursor moves, erasing);
- control strings, ``ESC ]`` (OSC: window titles, links), ``ESC P`` (DCS), ``ESC X``
  (SOS), ``ESC ^`` (PM), ``ESC _`` (APC) or their 8-bit forms, up to BEL or the string
  terminator (``ESC \\`` or ``\\x9c``); where a program was cut off, to the end of
  its line (a log's later lines stay);
- every other escape: ``ESC``, intermediates `` -/``, one final ``0-~`` (``ESC ( B``
  picks a character set, ``ESC 7`` saves the cursor, ``ESC c`` resets, ``ESC M``);
- a lone ESC.
"""

from __future__ import annotations

import re

__all__ = ["ANSI", "CONTROL", "strip_ansi"]

ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"  # strings
    r"|\x1b[ -/]*[0-~]"  # other escapes
    r"|\x1b"  # a lone ESC
)
# Control characters other than tab and line feed (carriage returns included: each
# caller decides what one means first).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (other characters untouched)."""
    return ANSI.sub("", text)

"""Reading what a probe answered: hostile input, read as a whole or not at all.

The probe (probe.py) runs inside an image its user built, with that image's
``python3``: whatever it prints is the image's word. An answer is one line
``@@gpulab-doctor@@<JSON object>`` in at most :data:`MAX_OUTPUT` bytes of output;
the object must match its mode's schema whole (every field of the kind the
probe writes, bounded, printable text, no field the probe does not write).
Anything else is :class:`Unreadable`, and no part of it is believed.
"""

from __future__ import annotations

import json
import re

from jsonschema import Draft202012Validator, FormatChecker

from gpulab_hub.doctor.probe import ENV_KEYS

MARKER = "@@gpulab-doctor@@"
MAX_OUTPUT = 1 << 20  # bytes of a probe's output read, at most (a real answer is ~10 KiB)
MAX_SHOWN = 200  # characters of a probe's last line shown when it gave no answer
CANNOT_READ = "answered the doctor's probe with something it cannot read"


class ProbeError(Exception):
    """The probe gave no answer (no python3, Docker refused, too slow); the reason in words."""


class Unreadable(ProbeError):
    """The probe answered with something the doctor cannot read; nothing of it is believed."""


_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("text")
def _text(value: object) -> bool:
    """One line of printable characters (no control, escape or line-break character)."""
    return not isinstance(value, str) or value.isprintable()


@_FORMATS.checks("lines")
def _lines(value: object) -> bool:
    """Printable lines: newlines and tabs allowed, no other control character."""
    return not isinstance(value, str) or value.replace("\n", "").replace("\t", "").isprintable()


def _text_of(n: int) -> dict:
    return {"type": "string", "format": "text", "maxLength": n}


def _lines_of(n: int) -> dict:
    return {"type": "string", "format": "lines", "maxLength": n}


def _list_of(item: dict, n: int) -> dict:
    return {"type": "array", "items": item, "maxItems": n}


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


PATH = _text_of(4096)
DEVICE_NODE = {"type": "string", "pattern": r"\A/dev/nvidia[0-9]{1,4}\Z"}
SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 1024}
CC = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}}
CC |= {"minItems": 2, "maxItems": 2}
TORCH = _object(
    {
        "version": _text_of(128),
        "cuda": _text_of(32),
        "arch_flags": _list_of(_text_of(64), 64),
        "error": _lines_of(4096),
        "available": {"type": "boolean"},
        "device_count": SMALL_INT,
        "devices": _list_of(_object({"name": _text_of(128), "cc": CC}, ("name", "cc")), 64),
        "bf16": {"type": "boolean"},
        "cudnn": {"type": ["integer", "null"], "minimum": 0, "maximum": 10**9},
        "cuda_error": _lines_of(4096),
    },
    ("version",),
)
LIB = _object(
    {
        "path": PATH,
        "real": PATH,
        "where": {"enum": ["LD_LIBRARY_PATH", "pip", "loaded"]},
        "version": _list_of({"type": "integer", "minimum": 0, "maximum": 10**9}, 8),
    },
    ("path", "real", "where"),
)
SCHEMAS = {
    "image": _object({"python": _text_of(64), "torch": TORCH}, ("python", "torch")),
    "project": _object(
        {
            "python": _text_of(64),
            "env": _object({k: _text_of(8192) for k in ENV_KEYS}),
            "device_nodes": _list_of(DEVICE_NODE, 64),
            "ldconfig": _lines_of(256 << 10),
            "realpaths": {
                "type": "object",
                "maxProperties": 1024,
                "propertyNames": PATH,
                "additionalProperties": PATH,
            },
            "torch": TORCH,
            "libs": _list_of(LIB, 1024),
        },
        ("python", "env", "device_nodes", "ldconfig", "realpaths", "torch", "libs"),
    ),
    "nvml": _object(
        {
            "gpus": _list_of(
                _object(
                    {"index": SMALL_INT, "name": _text_of(128), "cc": CC}, ("index", "name", "cc")
                ),
                64,
            ),
            "driver_version": _text_of(64),
            "error": _lines_of(4096),
        },
        ("gpus",),
    ),
}
_WHY = {  # what is wrong, in words, never the value itself (it is the image's)
    "type": "is not of the kind the probe writes",
    "format": "holds control characters",
    "maxLength": "is too long",
    "maxItems": "has too many entries",
    "maxProperties": "has too many entries",
    "minItems": "has too few entries",
    "additionalProperties": "has a field the probe never writes",
    "required": "lacks a field the probe always writes",
    "pattern": "is not of the form the probe writes",
    "enum": "is not one of the values the probe writes",
    "minimum": "is out of range",
    "maximum": "is out of range",
}
_VALIDATORS = {m: Draft202012Validator(s, format_checker=_FORMATS) for m, s in SCHEMAS.items()}
_FIELD = re.compile(r"[A-Za-z0-9_]{1,32}")


def _who(mode: str) -> str:
    return "the project's image" if mode == "project" else "the image"


def check(facts: object, mode: str) -> dict:
    """``facts`` if it is an answer of ``mode`` as the probe writes it, else Unreadable."""
    error = next(iter(_VALIDATORS[mode].iter_errors(facts)), None)
    if error is not None:
        where = "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" if _FIELD.fullmatch(p) else ".?"
            for p in error.absolute_path
        )
        why = _WHY.get(str(error.validator), "is not what the probe writes")
        raise Unreadable(f"{_who(mode)} {CANNOT_READ}: its answer{where} {why}")
    return facts  # type: ignore[return-value]


def shown(text: str) -> str:
    """A line of a probe's output as the doctor may show it: printable, cut short."""
    clean = "".join(c if c.isprintable() else "?" for c in text.strip())
    return clean if len(clean) <= MAX_SHOWN else clean[: MAX_SHOWN - 3] + "..."


def read(output: bytes, cut: bool, mode: str) -> dict:
    """The probe's answer in ``output`` (at most MAX_OUTPUT bytes; ``cut``: there was more)."""
    if cut:
        raise Unreadable(f"{_who(mode)} {CANNOT_READ}: over {MAX_OUTPUT >> 20} MiB of output")
    lines = output.split(b"\n")
    answers = [line for line in lines if line.startswith(MARKER.encode())]
    if not answers:
        last = next((ln for ln in reversed(lines) if ln.strip()), b"")
        said = shown(last.decode(errors="replace")) or "no output"
        raise ProbeError(f"the probe gave no answer; its last line: {said}")
    if len(answers) > 1:
        raise Unreadable(
            f"{_who(mode)} {CANNOT_READ}: {len(answers)} answers where the probe gives one"
        )
    try:
        facts = json.loads(answers[0][len(MARKER) :].decode(), parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise Unreadable(f"{_who(mode)} {CANNOT_READ}: not JSON ({type(e).__name__})") from None
    return check(facts, mode)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")

"""Spawn options: the spawn form and the validation of ``user_options``.

``user_options`` come from the browser or the REST API: untrusted. Only the
keys and values listed here are accepted.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from html import escape

from jupyterhub.slugs import is_valid_display_name

from gpulab_hub.projects import stacks

ALLOWED = {"use_last_good": bool, "gpus": int, "gpu_type": str, "mig_profile": str, "stack": str}
# The hardware a project runs on: kept in JupyterHub's database with the other options
# of its last start (or set on the Change runtime page, home/runtime.py), the default of
# its next start.
RUNTIME = ("gpus", "gpu_type", "mig_profile")
MAX_GPUS = 64
MAX_DISPLAY_NAME = 100
# Whole-value patterns, used with fullmatch only ("$" also matches before a final newline).
_MIG = re.compile(r"\d{1,2}g\.\d{1,4}gb(\+me)?")
_TYPE = re.compile(r"[A-Za-z0-9 ._-]{1,64}")
_COUNT = re.compile(r"[0-9]{1,3}")


class OptionsError(ValueError):
    """An option the user sent that gpulab does not accept."""


def validate(user_options: dict) -> dict:
    """Return a clean copy of ``user_options`` or raise OptionsError."""
    clean = {}
    for key, value in (user_options or {}).items():
        kind = ALLOWED.get(key)
        if kind is None:
            raise OptionsError(
                f"Unknown spawn option {key!r}; allowed: {', '.join(sorted(ALLOWED))}."
            )
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise OptionsError(f"Spawn option {key!r} must be a {kind.__name__}.")
        clean[key] = value
    if not 0 <= clean.get("gpus", 0) <= MAX_GPUS:
        raise OptionsError(f"Spawn option 'gpus' must be between 0 and {MAX_GPUS}.")
    if clean.get("mig_profile") and not _MIG.fullmatch(clean["mig_profile"]):
        raise OptionsError("Spawn option 'mig_profile' must look like '1g.10gb'.")
    if clean.get("gpu_type") and not _TYPE.fullmatch(clean["gpu_type"]):
        raise OptionsError("Spawn option 'gpu_type' must be a GPU model name such as 'H100'.")
    if "stack" in clean:
        stack_of(clean)
    return clean


def stack_of(user_options: dict | None) -> str:
    """The starting point a new project's Dockerfile is first written with (the spawn
    option 'stack', a name from the stacks list matched whole; "minimal" where none)."""
    name = (user_options or {}).get("stack", stacks.DEFAULT)
    try:
        return stacks.get(name).name
    except stacks.UnknownStack as e:
        raise OptionsError(str(e)) from e


def stack_lines(user_options: dict | None, cpu_torch_index: str = "") -> str:
    """The Dockerfile lines of the starting point in ``user_options`` (see stack_of), its
    torch from ``cpu_torch_index`` where given (stacks.lines)."""
    return stacks.lines(stack_of(user_options), cpu_torch_index)


def check_display_name(name: str) -> str:
    """A project's display name (free text from the home page or the REST API):
    JupyterHub's rules for new names (printable, single spaces, no control or line
    characters), at most MAX_DISPLAY_NAME characters. JupyterHub 6.1 checks them
    only when a server is made, not when one is renamed or started again."""
    name = unicodedata.normalize("NFC", name)
    if not is_valid_display_name(name) or len(name) > MAX_DISPLAY_NAME:
        raise OptionsError(
            f"The display name {name[:MAX_DISPLAY_NAME]!r} was refused: use 1 to "
            f"{MAX_DISPLAY_NAME} printable characters, with single spaces and no line "
            "breaks or control characters."
        )
    return name


def one_line(text: str, limit: int = MAX_DISPLAY_NAME) -> str:
    """``text`` as one line of printable characters (for a Dockerfile comment)."""
    out = "".join(
        c if c == " " or not unicodedata.category(c).startswith(("C", "Z")) else "?"
        for c in text[:limit]
    )
    return out


@dataclass(frozen=True)
class GpuChoices:
    """What the spawn form offers on a host with GPUs."""

    max_count: int
    default_count: int
    types: tuple[str, ...] = ()
    mig_profiles: tuple[str, ...] = ()
    chosen_type: str = ""  # preselected (the project's remembered choice); "" any
    chosen_mig: str = ""  # preselected; "" a whole GPU


def _select(label: str, name: str, element_id: str, options: str) -> str:
    return f"""
<div class="mb-3">
  <label class="form-label" for="{element_id}">{label}</label>
  <select class="form-select" name="{name}" id="{element_id}">{options}</select>
</div>"""


def _sel(chosen: bool) -> str:
    return " selected" if chosen else ""


def remembered(spawner) -> dict:
    """The hardware options (RUNTIME) the project keeps for its next start."""
    kept = (getattr(spawner.orm_spawner, "user_options", None) or {}) if spawner else {}
    if not isinstance(kept, dict):
        return {}
    try:  # JupyterHub's REST API stores any user_options: only valid ones count
        return validate({k: kept[k] for k in RUNTIME if k in kept})
    except OptionsError:
        return {}


def _gpu_fields(g: GpuChoices) -> str:
    counts = "".join(
        f'<option value="{n}"{" selected" if n == g.default_count else ""}>{n}</option>'
        for n in range(g.max_count + 1)
    )
    html = _select("GPUs for this project", "gpus", "gpulab-gpus", counts)
    if g.types:
        opts = '<option value="">any</option>' + "".join(
            f'<option value="{escape(t)}"{_sel(t == g.chosen_type)}>{escape(t)}</option>'
            for t in g.types
        )
        html += _select("GPU model", "gpu_type", "gpulab-gpu-type", opts)
    if g.mig_profiles:
        opts = '<option value="">a whole GPU</option>' + "".join(
            f'<option value="{escape(p)}"{_sel(p == g.chosen_mig)}>MIG slice {escape(p)}</option>'
            for p in g.mig_profiles
        )
        html += _select("Or one MIG slice", "mig_profile", "gpulab-mig", opts)
    return html


def _last_good_fields(description: str, changed: bool) -> str:
    """The choice after a failed build. While the build's content is what failed, the
    last image that built comes first and is chosen (building the same Dockerfile again
    would fail the same way); once it ``changed`` (fixed, from inside that image or
    elsewhere), building it again does: Start then starts the fix."""
    last_good = f"""
<div class="form-check">
  <input class="form-check-input" type="radio" name="image_choice" value="last-good"
         id="gpulab-last-good"{"" if changed else " checked"}>
  <label class="form-check-label" for="gpulab-last-good">
    Start the last image that built ({escape(description)}){"" if changed else " and fix the"}
    {"without the Dockerfile's changes" if changed else "Dockerfile from inside"}
  </label>
</div>"""
    rebuild = f"""
<div class="form-check">
  <input class="form-check-input" type="radio" name="image_choice" value="rebuild"
         id="gpulab-rebuild"{" checked" if changed else ""}>
  <label class="form-check-label" for="gpulab-rebuild">Build the Dockerfile again{
        " with its changes" if changed else ""
    }</label>
</div>"""
    if changed:
        note = """
<p id="gpulab-build-failed-note">The last build of this project's Dockerfile failed,
  and the Dockerfile (or a file it copies) has changed since. Build it again to start
  with your changes.</p>"""
        return note + rebuild + last_good
    note = """
<p id="gpulab-build-failed-note">The last build of this project's Dockerfile failed.
  Start the last image that built to fix the Dockerfile from inside; build it again
  once it is fixed.</p>"""
    return note + last_good + rebuild


def form(
    last_good_description: str | None,
    build_failed: bool,
    gpus: GpuChoices | None = None,
    changed_since_failure: bool = False,
) -> str:
    """HTML of the spawn form; empty (no form, start at once) unless there is a choice.

    On a host with GPUs the user picks how many; after a failed build, they may
    start the last image that built and fix the Dockerfile from inside, and once
    the Dockerfile changed (``changed_since_failure``), build it again is chosen.
    """
    html = _gpu_fields(gpus) if gpus else ""
    if build_failed and last_good_description:
        html += _last_good_fields(last_good_description, changed_since_failure)
    return html


def _first(formdata: dict[str, list[str]], key: str) -> str | None:
    values = formdata.get(key)
    return values[0] if values else None


def from_form(formdata: dict[str, list[str]], spawner=None) -> dict:
    """Form fields -> user_options (then checked by validate()).

    The starting point chosen when the project was made (JupyterHub keeps the
    'stack' option of its creation in the database) is kept unless the form names one:
    a project created now and started later still gets it on its first start."""
    opts: dict = {}
    stack = _first(formdata, "stack")
    if stack is None and spawner is not None:
        stack = (getattr(spawner.orm_spawner, "user_options", None) or {}).get("stack")
    if stack is not None:
        opts["stack"] = stack
    choice = _first(formdata, "image_choice")
    if choice is not None:
        if choice not in ("rebuild", "last-good"):
            raise OptionsError(f"Unknown image choice {choice!r}.")
        opts["use_last_good"] = choice == "last-good"
    gpus = _first(formdata, "gpus")
    if gpus is not None:
        if not _COUNT.fullmatch(gpus):
            raise OptionsError("The number of GPUs must be a whole number.")
        opts["gpus"] = int(gpus)
    for key in ("gpu_type", "mig_profile"):
        value = _first(formdata, key)
        if value:
            opts[key] = value
    if spawner is not None and not any(k in formdata for k in RUNTIME):
        # a form without hardware fields (a host without GPUs) keeps the project's choice
        opts.update(remembered(spawner))
    return validate(opts)


def refuse_unchecked_display_name(orm_spawner, name: str, db) -> None:
    """Refuse (and forget: back to ``name``) a display name JupyterHub stored unchecked
    on ``orm_spawner`` (a rename); ``db`` is JupyterHub's session, on its thread."""
    if orm_spawner is None or not orm_spawner.display_name:
        return
    try:
        check_display_name(orm_spawner.display_name)
    except OptionsError:
        orm_spawner.display_name = name
        db.commit()
        raise

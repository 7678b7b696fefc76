"""Spawn options: the spawn form and the validation of ``user_options``.

``user_options`` come from the browser or the REST API: untrusted. Only the
keys and values listed here are accepted.
"""

from __future__ import annotations

from html import escape

ALLOWED = {"use_last_good": bool}


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
        if not isinstance(value, kind):
            raise OptionsError(f"Spawn option {key!r} must be a {kind.__name__}.")
        clean[key] = value
    return clean


def form(last_good_description: str | None, build_failed: bool) -> str:
    """HTML of the spawn form; empty (no form, start at once) unless there is a choice.

    After a failed build, the user may start the last image that built and fix
    the Dockerfile from inside the project.
    """
    if not (build_failed and last_good_description):
        return ""
    return f"""
<p>The last build of this project's Dockerfile failed.</p>
<div class="form-check">
  <input class="form-check-input" type="radio" name="image_choice" value="rebuild"
         id="gpulab-rebuild" checked>
  <label class="form-check-label" for="gpulab-rebuild">Build the Dockerfile again</label>
</div>
<div class="form-check">
  <input class="form-check-input" type="radio" name="image_choice" value="last-good"
         id="gpulab-last-good">
  <label class="form-check-label" for="gpulab-last-good">
    Start the last image that built ({escape(last_good_description)}) and fix the
    Dockerfile from inside
  </label>
</div>
"""


def from_form(formdata: dict[str, list[str]]) -> dict:
    choice = (formdata.get("image_choice") or ["rebuild"])[0]
    if choice not in ("rebuild", "last-good"):
        raise OptionsError(f"Unknown image choice {choice!r}.")
    return {"use_last_good": choice == "last-good"}

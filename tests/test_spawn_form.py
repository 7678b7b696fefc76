"""The spawn form after a failed build, as its HTML reaches the browser (no hub needed).

A user whose Dockerfile just failed to build meets this form on their next start: the
choice that is ticked is what "Start" does. Building the same Dockerfile again would
fail the same way, so the last image that built comes first and is ticked; the whole
description of that image shows (nothing cut off).
"""

from __future__ import annotations

from html.parser import HTMLParser

from gpulab_hub.projects import options

GOOD = "gpulab/project:0123456789abcdef, built 2026-11-26 17:05"


class Radios(HTMLParser):
    """The radio buttons of a form, in page order, with their labels' text."""

    def __init__(self, html: str):
        super().__init__()
        self.radios: list[dict] = []  # {value, id, checked}
        self.labels: dict[str, str] = {}  # for= -> text
        self._label: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "input" and a.get("type") == "radio":
            self.radios.append({"value": a["value"], "id": a["id"], "checked": "checked" in a})
        elif tag == "label":
            self._label = a.get("for")
            self.labels[self._label] = ""

    def handle_endtag(self, tag):
        if tag == "label":
            self._label = None

    def handle_data(self, data):
        if self._label is not None:
            self.labels[self._label] += data

    def label(self, value: str) -> str:
        radio = next(r for r in self.radios if r["value"] == value)
        return " ".join(self.labels[radio["id"]].split())


def test_after_a_failed_build_the_form_ticks_the_last_image_that_built():
    form = Radios(options.form(GOOD, True, None))
    assert [r["value"] for r in form.radios] == ["last-good", "rebuild"]
    assert [r["value"] for r in form.radios if r["checked"]] == ["last-good"]
    assert form.label("last-good") == (
        f"Start the last image that built ({GOOD}) and fix the Dockerfile from inside"
    )
    assert form.label("rebuild") == "Build the Dockerfile again"
    # what "Start" then sends: the ticked choice
    assert options.from_form({"image_choice": ["last-good"]}) == {"use_last_good": True}
    assert options.from_form({"image_choice": ["rebuild"]}) == {"use_last_good": False}


def test_once_the_dockerfile_changed_the_form_ticks_building_it_again():
    form = Radios(options.form(GOOD, True, None, changed_since_failure=True))
    assert [r["value"] for r in form.radios] == ["rebuild", "last-good"]
    assert [r["value"] for r in form.radios if r["checked"]] == ["rebuild"]
    assert form.label("rebuild") == "Build the Dockerfile again with its changes"
    assert form.label("last-good") == (
        f"Start the last image that built ({GOOD}) without the Dockerfile's changes"
    )


def test_the_whole_last_good_description_shows_escaped():
    words = " ".join(["word"] * 60)
    long = "gpulab/project:" + "f" * 16 + ", built 2026-11-26 17:05 <b>&</b> " + words
    html = options.form(long, True, None)
    assert " ".join(Radios(html).label("last-good").split()).startswith(
        f"Start the last image that built ({' '.join(long.split())})"
    )
    assert "<b>" not in html and "&lt;b&gt;&amp;&lt;/b&gt;" in html


def test_no_choice_without_a_failed_build_or_a_last_good_image():
    assert Radios(options.form(GOOD, False, None)).radios == []
    assert Radios(options.form(None, True, None)).radios == []
    gpus = options.GpuChoices(2, 1)
    assert Radios(options.form(GOOD, True, gpus)).radios[0]["value"] == "last-good"

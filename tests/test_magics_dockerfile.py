"""The managed-block writer of the magics: markers, updates, safety, and a fuzz test."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulab_hub import images
from gpulab_hub.sharing import installs
from gpulab_jupyter.magics import dockerfile as df

TEMPLATE = Path(__file__).resolve().parents[1] / "images" / "project.Dockerfile.j2"


def _rendered() -> str:
    """The project template as the spawner renders it for a new project."""
    return images.render(TEMPLATE.parent, TEMPLATE.name, display_name="p", base_image="b:1")


SIX = "RUN python -m pip install --no-cache-dir six==1.17.0 && python -c 'import six'"
SIX_OLD = "RUN python -m pip install --no-cache-dir six==1.16.0 && python -c 'import six'"
TOMLI = "RUN python -m pip install --no-cache-dir tomli==2.0.1 && python -c 'import tomli'"


def test_markers_are_the_templates_lines():
    lines = _rendered().splitlines()
    assert df.START_MARKER in lines
    assert df.END_MARKER in lines
    assert lines.index(df.START_MARKER) < lines.index(df.END_MARKER)
    # the template renders them from the contract: it never writes them itself
    assert ">>> gpulab managed block" not in TEMPLATE.read_text()


def test_the_hub_reads_the_block_the_magic_writes():
    """One parser on both sides: Save a copy (the hub) sees exactly the lines
    %gpu_install recorded, apt lines and all; a Dockerfile the magic refuses as
    malformed has no block for the hub either."""
    text = df.apply(_rendered(), [("six", SIX), ("tomli", TOMLI)], ["libgl1"], "1000:100")
    found = installs.managed_installs(text)
    assert [i.line for i in found.installs] == [SIX, TOMLI]
    assert found.apt == ["libgl1"] and not found.refused
    twice = (
        f"FROM a\n{df.START_MARKER}\n{SIX}\n{df.END_MARKER}\n{df.START_MARKER}\n{df.END_MARKER}\n"
    )
    with pytest.raises(df.DockerfileError):
        df.split(twice)
    assert not installs.managed_installs(twice).installs
    # a marker indented by a space is a marker for both
    spaced = f"FROM a\n  {df.START_MARKER}\n{SIX}\n {df.END_MARKER}\n"
    assert df.managed_packages(spaced) == {"six": "six==1.17.0"}
    assert [i.line for i in installs.managed_installs(spaced).installs] == [SIX]


def test_a_line_is_added_then_replaced_for_the_same_package():
    text = _rendered()
    one = df.apply(text, [("six", SIX_OLD)])
    assert one.count(SIX_OLD) == 1
    assert len(one.splitlines()) == len(text.splitlines()) + 1
    two = df.apply(one, [("tomli", TOMLI), ("six", SIX)])
    block = two.split(df.START_MARKER)[1].split(df.END_MARKER)[0].strip().splitlines()
    assert block == [SIX, TOMLI]  # replaced in place, the new one appended
    assert df.managed_packages(two) == {"six": "six==1.17.0", "tomli": "tomli==2.0.1"}
    assert df.apply(two, [("six", SIX)]) == two  # idempotent


def test_apt_packages_share_one_root_section_before_pip_lines():
    text = df.apply(_rendered(), [("six", SIX)], ["libgl1"], "1000:100")
    text = df.apply(text, [], ["ffmpeg", "libgl1"], "1000:100")
    block = text.split(df.START_MARKER)[1].split(df.END_MARKER)[0].strip().splitlines()
    assert block[0] == "USER root"
    assert "install -y --no-install-recommends ffmpeg libgl1 &&" in block[1]
    assert block[2:] == ["USER 1000:100", SIX]


def test_without_markers_a_block_follows_the_last_from():
    text = "FROM a AS build\nRUN make\nFROM b \\\n  AS final\nRUN echo user\n"
    out = df.apply(text, [("six", SIX)])
    assert out == (
        "FROM a AS build\nRUN make\nFROM b \\\n  AS final\n\n"
        f"{df.START_MARKER}\n{SIX}\n{df.END_MARKER}\nRUN echo user\n"
    )


@pytest.mark.parametrize(
    "text, words",
    [
        (f"FROM a\n{df.START_MARKER}\n{df.END_MARKER}\n{df.START_MARKER}\n{df.END_MARKER}\n",
         "more than one"),
        (f"FROM a\n{df.END_MARKER}\n{df.START_MARKER}\n", "before its start"),
        (f"FROM a\n{df.START_MARKER}\nRUN x\n", "lacks the managed block marker"),
        ("RUN echo no base\n", "no FROM line"),
    ],
)  # fmt: skip
def test_broken_dockerfiles_are_refused_with_a_reason(text, words):
    with pytest.raises(df.DockerfileError, match=words):
        df.apply(text, [("six", SIX)])


def test_update_is_atomic_and_keeps_the_mode(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(_rendered())
    path.chmod(0o640)
    old, new = df.update(path, [("six", SIX)])
    assert path.read_bytes() == new != old
    assert path.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / ".gpulab" / "dockerfile.lock").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_requirements_of_user_run_lines():
    assert df.pip_requirements("RUN pip install -U numpy 'scipy>=1' --index-url http://x") == [
        "numpy",
        "scipy>=1",
    ]
    assert df.pip_requirements("RUN A=1 python3 -m pip install ./wheel.whl && pip3 install b") == [
        "./wheel.whl",
        "b",
    ]
    assert df.requirement_name("./wheel.whl") == ""
    assert df.requirement_name("Foo_Bar[x]==1") == "foo-bar"


# --- fuzz: lines outside the block never change, byte for byte ----------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    max_size=30,
)
_line = st.one_of(
    _text.map(lambda t: "# " + t),  # comments
    st.just(""),
    _text.map(lambda t: "RUN echo " + t),
    _text.map(lambda t: "ENV A=" + t.replace("\\", "")),
    st.lists(_text.map(lambda t: "  && echo " + t.replace("\\", "")), min_size=1, max_size=3).map(
        lambda parts: "RUN true \\\n" + " \\\n".join(parts)  # continuations
    ),
    st.just("   # indented comment \t"),
    st.just("RUN pip install six==1.0  # not ours"),
).filter(lambda s: df.START_MARKER not in s and df.END_MARKER not in s)
_lines = st.lists(_line, max_size=8)
_entry = st.sampled_from([("six", SIX), ("six", SIX_OLD), ("tomli", TOMLI)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=_lines,
    inside=_lines,
    after=_lines,
    eol=st.sampled_from(["\n", "\r\n"]),
    last_eol=st.booleans(),
    entries=st.lists(_entry, max_size=3),
    apt=st.lists(st.sampled_from(["libgl1", "ffmpeg", "git=1:2.39"]), max_size=2),
)
def test_fuzz_lines_outside_the_block_are_untouched(
    before, inside, after, eol, last_eol, entries, apt
):
    def join(lines):
        return "".join(part + eol for ln in lines for part in ln.split("\n"))

    head = join(["FROM base:1", *before]) + df.START_MARKER + eol
    tail = df.END_MARKER + eol + join(after)
    if not last_eol and tail.endswith(eol):
        tail = tail[: -len(eol)]
    text = head + join(inside) + tail
    out = df.apply(text, entries, apt, "1000:100")
    assert out.startswith(head)
    assert out.endswith(tail)
    block = out[len(head) : len(out) - len(tail)]
    recorded = dict(entries)
    for key, line in recorded.items():
        assert block.count(line + eol) == 1, (key, block)
    assert df.managed_packages(out).keys() >= recorded.keys()
    assert df.apply(out, entries, apt, "1000:100") == out  # stable
    # Without markers: every original line is still there, in order.
    plain = join(["FROM base:1", *before, *after])
    lines = df.apply(plain, entries, apt, "1000:100").split(eol)
    start, end = lines.index(df.START_MARKER), lines.index(df.END_MARKER)
    assert start == 2 and lines[1] == ""  # a blank line, then the block, after FROM
    assert lines[:1] + lines[end + 1 :] == plain.split(eol)


def _write_lines(path: str, worker: int) -> None:
    for i in range(5):
        name = f"pkg-{worker}-{i}"
        df.update(Path(path), [(name, f"RUN python -m pip install --no-cache-dir {name}==1")])


def test_concurrent_writers_from_separate_processes_lose_nothing(tmp_path):
    import multiprocessing

    path = tmp_path / "Dockerfile"
    path.write_text(_rendered())
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_write_lines, args=(str(path), w)) for w in range(20)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    names = df.managed_packages(path.read_text())
    assert len(names) == 100
    assert names.keys() == {f"pkg-{w}-{i}" for w in range(20) for i in range(5)}

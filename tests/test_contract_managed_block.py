"""The contract's managed block places a new block after the last FROM exactly where
dockerfile-parse (which it replaced, to stay standard-library only) finds its end."""

from __future__ import annotations

import io

from dockerfile_parse import DockerfileParser
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab_contract import managed_block

LINES = [
    "FROM a\n", "FROM b AS final\n", "from c \\\n", "  AS lower\n", "FROM\n", "RUN make \\\n",
    "  && x\n", "# a comment\n", "# escape=`\n", "# syntax=docker/dockerfile:1\n",
    "FROM d `\n", "RUN y `\n", "\n", "   \n", "COPY . /x\n", "FROM e \\\n", "# inside\n",
    "  stage\n", "ENV A=1\n", "  FROM indented\n", "FROM f\r\n",
]  # fmt: skip


def _theirs(lines: list[str]) -> int | None:
    parser = DockerfileParser(fileobj=io.BytesIO("".join(lines).encode()))
    froms = [i for i in parser.structure if i["instruction"] == "FROM"]
    return froms[-1]["endline"] if froms else None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(LINES), max_size=14), st.sampled_from(["", "FROM z"]))
def test_the_last_from_ends_where_dockerfile_parse_says(lines, last):
    lines = [*lines, last] if last else lines
    assert managed_block.last_from_end(lines) == _theirs(lines)


def test_escape_directive_and_comments_inside_a_continuation():
    text = "# escape=`\nFROM a `\n# note\n  AS b\nRUN c\n"
    head, block, tail = managed_block.split(text)
    assert "".join(head).endswith("  AS b\n\n" + managed_block.START_MARKER + "\n")
    assert block == [] and tail[-1] == "RUN c\n"

"""What a project's Dockerfile may name (images/policy.py), read as Docker reads it.

Each refused form is an attack a project user can write today against Docker's
classic builder (another tenant's image by tag, ID or ID prefix; a fetch from the
host's loopback by ADD; BuildKit-only ways around both), and each refusal must
name the line and say what to write instead. Allowed forms pass, and allowed
bases come back pinned to their image ID, line numbers unchanged.
"""

from __future__ import annotations

import re

import pytest

from gpulab_hub.images import policy
from gpulab_hub.projects import ProjectError

BASE = "gpulab/base:latest"
CUDA = "gpulab/base:cuda12"
IDS = {BASE: "sha256:" + "ab" * 32, CUDA: "sha256:" + "cd" * 32}
ALLOWED = ("gpulab/base", CUDA)  # the first without its tag: ':latest' is implied
VICTIM_ID = "sha256:" + "1e7e4b35bd8a" + "0" * 52


def resolve(name: str) -> str | None:
    return IDS.get(name)


def check(text: str, allowed=ALLOWED) -> str:
    return policy.check(text, allowed, resolve)


def refused(text: str, line: int, *words: str) -> str:
    with pytest.raises(ProjectError) as e:
        check(text)
    message = str(e.value)
    assert message.startswith(f"Line {line} of the Dockerfile: "), message
    for word in words:
        assert word in message, message
    return message


def test_allowed_bases_are_pinned_to_their_id_and_lines_keep_their_numbers():
    text = (
        "# escape=`\n"
        "FROM --platform=$BUILDPLATFORM gpulab/base `\n"
        "  # a comment inside the instruction\n"
        "  AS Build\n"
        "RUN make\n"
        "FROM gpulab/base:cuda12\n"
        "COPY --from=build /out /opt/out\n"
        "COPY --from=0 /out /opt/again\n"
        'COPY --from=BUILD ["/a b", "/c"]\n'
        "COPY --chown=1000:100 --from=gpulab/base /etc/os-release /x\n"
        "ADD data.tar.gz /data/\n"
        "RUN echo done\n"
    )
    out = check(text)
    assert out.split("\n") == [
        "# escape=`",
        f"FROM --platform=$BUILDPLATFORM {IDS[BASE]} AS build",
        "",
        "",
        "RUN make",
        f"FROM {IDS[CUDA]}",
        "COPY --from=build /out /opt/out",
        "COPY --from=0 /out /opt/again",
        'COPY --from=BUILD ["/a b", "/c"]',
        f"COPY --chown=1000:100 --from={IDS[BASE]} /etc/os-release /x",
        "ADD data.tar.gz /data/",
        "RUN echo done",
        "",
    ]
    # the text sent to Docker passes the same rules with the IDs as the allowed names
    assert policy.check(out, tuple(IDS.values()), lambda ref: ref) == out


def test_the_hubs_own_new_project_dockerfile_passes():
    template = (
        '# gpulab project "x": this file is the project\'s environment.\n'
        "# hadolint ignore=DL3007\n"
        "FROM gpulab/base:latest\n\n"
        "# >>> gpulab managed block: written by %gpu_install, do not edit by hand >>>\n"
        "RUN pip install --no-cache-dir six==1.16.0\n"
        "# <<< gpulab managed block <<<\n"
    )
    assert check(template) == template.replace("gpulab/base:latest", IDS[BASE])


def test_scratch_args_crlf_and_a_byte_order_mark():
    assert check("FROM scratch\nCOPY a /a\n") == "FROM scratch\nCOPY a /a\n"
    out = check("\ufeffARG V=1\r\nFROM gpulab/base\r\nRUN echo $V\r\n")
    assert out == f"ARG V=1\nFROM {IDS[BASE]}\nRUN echo $V\n"


def test_a_moved_tag_cannot_swap_the_base_and_a_missing_one_is_named():
    assert IDS[BASE] in check("FROM gpulab/base\n")
    IDS[BASE], old = "sha256:" + "ef" * 32, IDS[BASE]
    try:
        assert check("FROM gpulab/base\n") == f"FROM {IDS[BASE]}\n"
    finally:
        IDS[BASE] = old
    with pytest.raises(ProjectError, match=r"Line 1 .*gpulab/base:latest is not on this hub"):
        policy.check("FROM gpulab/base\n", ALLOWED, lambda ref: None)
    with pytest.raises(ProjectError, match="not on this hub"):  # an answer that is no ID
        policy.check("FROM gpulab/base\n", ALLOWED, lambda ref: "gpulab/base:latest")


@pytest.mark.parametrize(
    "image",
    [
        "gpulabtest/project:0123456789abcdef",  # another tenant's project image
        "victim",
        "victim:latest",
        "otherhub/base:latest",  # another hub's image
        "docker.io/gpulab/base:latest",  # a registry name not on the list
        "gpulab/base:other",
        "gpulab/base@sha256:" + "ab" * 32,
        "GPULAB/BASE",
    ],
)
def test_from_an_image_not_offered_is_refused(image):
    msg = refused(f"ARG X=1\n\nFROM {image}\n", 3, f"FROM {image}", "gpulab/base:latest")
    assert "does not offer" in msg or "by its ID" in msg


@pytest.mark.parametrize(
    "image", [VICTIM_ID, VICTIM_ID[7:], VICTIM_ID[7:19], VICTIM_ID[7:11], "1e7e4b35bd8a"]
)
def test_from_an_image_id_or_prefix_is_refused(image):
    refused(f"FROM {image}\n", 1, "by its ID", "gpulab/base:latest")
    refused(f"FROM gpulab/base\nCOPY --from={image} / /x\n", 2, f"COPY --from={image}", "by its ID")


@pytest.mark.parametrize(
    "line", ["FROM $BASE", "FROM ${BASE}", "FROM ${BASE:-gpulab/base}", "FROM gpulab/$N"]
)
def test_a_name_built_from_variables_is_refused(line):
    refused(f"ARG BASE=victim\nARG N=base\n{line}\n", 3, "variable")
    refused("ARG V=victim\nFROM gpulab/base\nCOPY --from=$V / /x\n", 3, "variable")


@pytest.mark.parametrize(
    "line",
    [
        'FROM "victim"',
        "FROM 'victim'",
        "FROM vic\\tim",
        "FROM vic`tim",
    ],
)
def test_quotes_and_escapes_in_a_from_line_are_refused(line):
    refused(f"{line}\n", 1, "without quotes or escape")


def test_copy_from_another_image_by_every_spelling_is_refused():
    head = "FROM gpulab/base AS a\n"
    refused(head + "COPY --from=victim / /x\n", 2, "COPY --from=victim", "does not offer")
    refused(head + 'COPY --from="victim" / /x\n', 2, "COPY --from=victim")
    refused(head + 'COPY --chown=1:1 --from=victim ["/", "/x"]\n', 2, "COPY --from=victim")
    refused(head + "COPY --FROM=victim / /x\n", 2, "victim")
    refused(head + "COPY \\\n  --from=victim \\\n  / /x\n", 2, "COPY --from=victim")
    # a blank or comment line inside the continuation does not end it for Docker
    refused(head + "COPY \\\n\n   \n# hidden?\n --from=victim / /x\n", 2, "COPY --from=victim")
    # nor does the end of the file
    refused(head + "COPY --from=victim / /x \\", 2, "COPY --from=victim")


def test_options_that_docker_versions_read_differently_are_refused():
    head = "FROM gpulab/base\n"
    for line in ("COPY --from victim / /x", "COPY --link --from=victim / /x"):
        refused(head + line + "\n", 2, "equals sign")
    # bytes 0x85 and 0xA0 separate words in Docker's option parser: no hidden --from
    refused(head + "COPY --chown=\u00e0--from=victim / /x\n", 2, "plain ASCII")


def test_stages_are_earlier_ones_only():
    refused(
        "FROM gpulab/base AS a\nCOPY --from=b / /\nFROM gpulab/base AS b\n",
        2,
        "starts later, at line 3",
    )
    refused("FROM b\nFROM gpulab/base AS b\n", 1, "starts later, at line 2")
    refused("FROM gpulab/base AS a\nCOPY --from=a / /x\n", 2, "this stage itself")
    refused("FROM gpulab/base\nCOPY --from=0 / /x\n", 2, "no stage comes before")
    refused("FROM gpulab/base\nFROM scratch\nCOPY --from=1 / /x\n", 3, "only stage 0 comes")
    refused(
        "FROM gpulab/base\nFROM gpulab/base\nFROM scratch\nCOPY --from=3 / /x\n",
        4,
        "only stages 0 to 1",
    )
    refused("FROM gpulab/base AS a\nFROM gpulab/base AS A\n", 2, "already used at line 1")
    refused("FROM gpulab/base AS 1abc\n", 1, "must start with a letter")
    refused("FROM gpulab/base AS\n", 1, "FROM <image> AS <name>")
    refused("FROM gpulab/base victim\n", 1, "FROM <image> AS <name>")
    refused("FROM --pull=always gpulab/base\n", 1, "--platform")


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("http://127.0.0.1:8000/secret", "download"),
        ("https://example.org/f.tgz", "download"),
        ("ftp://example.org/f", "download"),
        ("HTTP://127.0.0.1/secret", "download"),
        ("'http://127.0.0.1:8000/secret'", "download"),
        ('"h"ttp://127.0.0.1:8000/secret', "download"),
        ("ht\\tp://127.0.0.1:8000/secret", "download"),
        ("git@github.com:someone/repo.git", "git"),
        ("https://github.com/someone/repo.git", "git"),
        ("https://github.com/someone/repo.git#main", "git"),
        ("github.com/someone/repo", "git"),
        ("someone@example.org:repo", "git"),
        ("repo.git", "git"),
    ],
)
def test_add_of_a_url_or_a_git_repository_is_refused_with_what_to_write(source, kind):
    msg = refused(f"FROM gpulab/base\nRUN true\nADD {source} /opt/x\n", 3, "RUN")
    assert ("RUN curl -fsSLo /opt/x" in msg) if kind == "download" else ("RUN git clone" in msg)
    refused(f'FROM gpulab/base\nADD ["{source}", "/opt/"]\n', 2, "ADD")


def test_add_url_message_says_the_command_to_run():
    msg = refused("FROM gpulab/base\nADD http://127.0.0.1:8000/w.bin /models/\n", 2)
    assert "RUN curl -fsSLo /models/w.bin http://127.0.0.1:8000/w.bin" in msg
    refused("FROM gpulab/base\nARG U=http://127.0.0.1:8000/s\nADD $U /x\n", 3, "variable")
    refused("FROM gpulab/base\nADD --keep-git-dir=true https://x/r.git /r\n", 2, "git clone")
    refused("FROM gpulab/base\nADD --checksum=sha256:00 f /f\n", 2, "RUN curl")
    refused("FROM gpulab/base AS a\nFROM gpulab/base\nADD --from=a /x /x\n", 3, "COPY --from")


def test_add_and_copy_of_project_files_stay():
    text = "FROM gpulab/base\nADD src.tar.gz /opt/\nADD --chown=1000:100 a b /c/\nCOPY . /w\n"
    assert check(text) == text.replace("gpulab/base", IDS[BASE])


@pytest.mark.parametrize(
    "line",
    [
        "RUN --mount=type=bind,from=victim,target=/v cat /v/secret",
        "RUN --mount=type=cache,target=/root/.cache pip install six",
        "RUN --mount=from=victim,target=/v true",
    ],
)
def test_run_mount_is_refused_with_a_sentence(line):
    refused(f"FROM gpulab/base\n{line}\n", 2, "RUN --mount needs Docker's BuildKit", "COPY")


def test_other_buildkit_and_trigger_forms_are_refused():
    refused("FROM gpulab/base\nRUN --network=host curl x\n", 2, "RUN --network")
    refused("FROM gpulab/base\nRUN --security=insecure true\n", 2, "RUN --security")
    refused("# syntax=docker/dockerfile:1\nFROM gpulab/base\n", 1, "# syntax=")
    refused("# check=skip=all\n# escape=`\nFROM gpulab/base\n", 2, "first line")
    refused("# escape=`\n# escape=\\\nFROM gpulab/base\n", 2, "already given")
    refused("# escape=x\nFROM gpulab/base\n", 1, "escape")
    refused("FROM gpulab/base AS a\nONBUILD COPY --from=victim / /x\nFROM a\n", 2, "ONBUILD")
    refused("// syntax=victim\nFROM gpulab/base\n", 1, "not a Dockerfile instruction")
    refused("FROM gpulab/base\n  \\\nCOPY --from=victim / /x\n", 2, "not a Dockerfile")
    refused("COPY --from=victim / /x\nFROM gpulab/base\n", 1, "only ARG")
    with pytest.raises(ProjectError, match="no FROM line"):
        check("# nothing\n")


def test_invisible_characters_are_refused_where_they_are():
    for ch in ("\u00a0", "\x0b", "\x0c", "\r", "\u2028", "\x85", "\x00"):
        msg = refused(f"FROM gpulab/base\nRUN echo{ch}x\n", 2, "invisible character")
        assert re.search(r"U\+[0-9A-F]{4}", msg)


def test_escape_directive_changes_continuations_as_docker_does():
    # with ` as the escape character, a trailing \ continues nothing
    text = "# escape=`\nFROM gpulab/base\nRUN echo a \\\nCOPY --from=victim / /x\n"
    refused(text, 4, "COPY --from=victim")
    text = "FROM gpulab/base\nRUN echo a `\nCOPY --from=victim / /x\n"
    refused(text, 3, "COPY --from=victim")


def test_names_are_compared_after_making_latest_explicit():
    assert policy.normalise("gpulab/base") == "gpulab/base:latest"
    assert policy.normalise("localhost:5000/base") == "localhost:5000/base:latest"
    assert policy.normalise("localhost:5000/base:1") == "localhost:5000/base:1"
    assert policy.normalise("a/b@sha256:" + "0" * 64) == "a/b@sha256:" + "0" * 64
    assert check("FROM gpulab/base:latest\n", allowed=("gpulab/base",)) == f"FROM {IDS[BASE]}\n"
    with pytest.raises(ProjectError, match="none yet"):
        check("FROM gpulab/base\n", allowed=())

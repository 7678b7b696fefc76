"""What a project's Dockerfile may name, and the Dockerfile text gpulab sends to Docker.

The Dockerfile is the project user's, so it is read as hostile input. ``FROM`` and
``COPY --from=`` may name only the admin's base images (``allowed_base_images``,
by name) and the Dockerfile's own earlier stages (by ``AS`` name, or ``--from=``
index): never an image ID or a prefix of one, another project's image or a name
built from variables. ``ADD`` adds project files only: a URL or a git repository
would be fetched by the Docker engine, from the host's own network. BuildKit-only
options (``RUN --mount``, ``# syntax=``) and ``ONBUILD`` are refused.

:func:`check` returns the text to build: each allowed base is pinned to the image
ID ``resolve_id`` gives for it now (in the text sent to Docker, never in the
user's file), so a tag moved between this check and the build cannot change what
the build starts from. Every other line is sent as the user wrote it, and line
numbers stay the same.

Docker and this module must read the Dockerfile alike, so instructions and
continuation lines come from dockerfile-parse, and words, options and parser
directives are split as Docker's own parser splits them; where Docker's versions
or the two parsers could read a line differently, the line is refused with what
to write instead, never guessed.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dockerfile_parse import DockerfileParser

from gpulab_hub.projects import ProjectError

INSTRUCTIONS = frozenset(
    "ADD ARG CMD COPY ENTRYPOINT ENV EXPOSE FROM HEALTHCHECK LABEL MAINTAINER "
    "ONBUILD RUN SHELL STOPSIGNAL USER VOLUME WORKDIR".split()
)
SCRATCH = "scratch"
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
# What a FROM image or a --from= value may be written as: a plain image name, a
# stage name or an index (no quotes, variables or escapes, which Docker rewrites).
_NAME = re.compile(r"[A-Za-z0-9._/:@-]+")
_STAGE = re.compile(r"[a-z][a-z0-9_.-]*")
_INDEX = re.compile(r"[0-9]+", re.ASCII)
_LOOKS_LIKE_ID = re.compile(r"(sha256:)?[0-9a-f]+|.*@sha256:.*")
_PLATFORM = re.compile(r"[A-Za-z0-9_./${}:-]+")
_DIRECTIVE = re.compile(r"#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*")
_ESCAPE_LIKE = re.compile(r"#\s*escape\s*=", re.I)
_ESCAPE_LINE = re.compile(r"#[ \t]*escape[ \t]*=[ \t]*([\\`])[ \t]*", re.I)
_WHITESPACE = re.compile(r"[\t\v\f\r ]+")  # Docker's reWhitespace
_GO_SPACE = frozenset("\t\n\v\f\r \x85\xa0")  # unicode.IsSpace of a single byte
_SCHEME = re.compile(r"://")
_SCP_LIKE = re.compile(r"[\w.-]+@[\w.-]+:.*")
_GIT_PATH = re.compile(r".*\.git(#.*)?", re.S)
# control characters, and white space other than space, tab and line end (Python's
# and Go's ideas of white space differ beyond these)
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]|[^\S \t\n]")
_SHOWN = 120  # longest piece of the user's text quoted in a message


def normalise(name: str) -> str:
    """An image name with an implicit ``:latest`` made explicit (``a/b`` -> ``a/b:latest``)."""
    if "@" in name or ":" in name.rsplit("/", 1)[-1]:
        return name
    return name + ":latest"


def check(text: str, allowed: Iterable[str], resolve_id: Callable[[str], str | None]) -> str:
    """The Dockerfile text to build: ``text`` with every allowed base pinned to its ID.

    ``allowed`` are the admin's base images (names; an implicit ``:latest`` is
    made explicit on both sides before comparing). ``resolve_id(name)`` gives the
    local image ID (``sha256:<64 hex>``) of an allowed name, or None when the
    engine does not have it. Raises ProjectError naming the Dockerfile line and
    saying what to write instead.
    """
    return _Checker(
        text, tuple(dict.fromkeys(normalise(a) for a in allowed if a)), resolve_id
    ).run()


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _refuse(line: int, message: str) -> ProjectError:
    return ProjectError(f"Line {line} of the Dockerfile: {message}")


def _clean(text: str) -> list[str]:
    """The Dockerfile's lines (no byte order mark, LF line ends), refusing the
    invisible and control characters that parsers disagree on as white space."""
    text = text.removeprefix("\ufeff").replace("\r\n", "\n")
    bad = _INVISIBLE.search(text)
    if bad:
        raise _refuse(
            text.count("\n", 0, bad.start()) + 1,
            f"it holds the invisible character U+{ord(bad[0]):04X}; replace it with a plain "
            "space, or remove it.",
        )
    return text.split("\n")


def _escape_token(lines: list[str]) -> str:
    """The escape character, from a ``# escape=`` directive on the first line only
    (Docker's versions disagree about one further down); ``# syntax=`` is refused."""
    escape = "\\"
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        m = _DIRECTIVE.fullmatch(line.strip(" \t"))
        if not m:
            break
        key = m[1].lower()
        if key in seen:
            raise _refuse(number, f"the '# {key}=' directive is already given on line {seen[key]}.")
        seen[key] = number
        if key == "syntax":
            raise _refuse(
                number,
                "'# syntax=' picks a BuildKit front end image, which gpulab's builds do not "
                "use; remove the line.",
            )
        if _ESCAPE_LIKE.match(line.lstrip(" \t")):
            em = _ESCAPE_LINE.fullmatch(line)
            if number != 1 or not em:
                raise _refuse(
                    number,
                    "write the escape directive alone on the first line, as '# escape=`' or "
                    "'# escape=\\'.",
                )
            escape = em[1]
    return escape


def _instructions(lines: list[str]) -> list[dict]:
    """dockerfile-parse's instructions, with the lines it reads unlike Docker made alike:
    a blank line inside a continuation (Docker skips it; dockerfile-parse would end the
    instruction there) reads as a comment, and a final empty line ends an instruction
    left open at the end of the file (Docker runs it; dockerfile-parse would drop it)."""
    fed = "".join(("#" if not line.strip(" \t") else line) + "\n" for line in lines) + "\n"
    parser = DockerfileParser(fileobj=io.BytesIO(fed.encode()))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


def _go_flags(line: str, space_args: bool) -> tuple[list[str], str | None]:
    """Docker's extractBuilderFlags: the leading ``--name[=value]`` words of an
    instruction's arguments (quotes removed, backslash escapes applied) and the rest.

    It walks the line byte by byte as Docker's Go code does (so bytes 0x85 and 0xA0
    inside a character separate words there, and here). ``space_args``: the newer
    parser, which also takes ``--name value``. The rest is None when it is not UTF-8.
    """
    b = line.encode().decode("latin-1")
    n = len(b)
    words: list[str] = []
    word: list[str] = []
    phase, quote, blank_ok = "spaces", "", False
    parsing_arg, need_arg = False, True
    pos = 0
    while pos <= n:
        ch = b[pos] if pos < n else ""
        if phase == "spaces":
            if pos == n:
                break
            if ch in _GO_SPACE:
                pos += 1
                continue
            if not parsing_arg and (ch != "-" or pos + 1 == n or b[pos + 1] != "-"):
                return words, _utf8(b[pos:])
            phase = "word"
        if pos == n:
            w = "".join(word)
            if w != "--" and (blank_ok or w):
                words.append(w)
            break
        if phase == "word":
            if ch in _GO_SPACE:
                phase = "spaces"
                w = "".join(word)
                if parsing_arg:
                    words[-1] += "=" + w
                    parsing_arg, need_arg = False, True
                else:
                    if w == "--":
                        return words, _utf8(b[pos:])
                    if blank_ok or w:
                        parsing_arg = space_args and need_arg
                        words.append(w)
                word, blank_ok = [], False
                pos += 1
                continue
            if ch == "=":
                need_arg = False
            if ch in "'\"":
                quote, blank_ok, phase = ch, True, "quote"
                pos += 1
                continue
            if ch == "\\":
                if pos + 1 == n:
                    pos += 1
                    continue
                pos += 1
                ch = b[pos]
            word.append(ch)
            pos += 1
            continue
        if ch == quote:
            phase = "word"
            pos += 1
            continue
        if ch == "\\":
            if pos + 1 == n:
                phase = "word"
                pos += 1
                continue
            pos += 1
            ch = b[pos]
        word.append(ch)
        pos += 1
    return words, ""


def _utf8(latin: str) -> str | None:
    try:
        return latin.encode("latin-1").decode()
    except UnicodeDecodeError:
        return None


@dataclass
class _Args:
    flags: list[tuple[str, str | None]]  # (name, value or None for a bare --name)
    rest: str


def _split(value: str, line: int) -> _Args:
    """An instruction's options and the rest, as every Docker version reads them."""
    old, new = _go_flags(value, False), _go_flags(value, True)
    if old != new:
        raise _refuse(
            line,
            "write each option with its value after an equals sign (--from=build, "
            "--link=true), so every Docker version reads it alike.",
        )
    words, rest = old
    if rest is None or not all(w.isascii() and w.isprintable() for w in words):
        raise _refuse(line, "write the options (--name=value) in plain ASCII letters.")
    flags: list[tuple[str, str | None]] = []
    for w in words:
        name, eq, val = w[2:].partition("=")
        flags.append((name.lower(), val if eq else None))
    return _Args(flags, rest.strip(" \t"))


def _arg_lists(rest: str) -> list[list[str]]:
    """COPY/ADD arguments as Docker may read them: its JSON form (strict or, in older
    versions, the first JSON value of the line) and as words."""
    lists = []
    s = rest.lstrip()
    if s.startswith("["):
        try:
            v, _ = json.JSONDecoder().raw_decode(s)
        except ValueError:
            v = None
        if isinstance(v, list):
            lists.append([w for w in v if isinstance(w, str)])
    return [*lists, [w for w in _WHITESPACE.split(rest) if w]]


def _quote_flag(name: str, value: str | None) -> str:
    if value is None:
        return f"--{name}"
    if re.fullmatch(r"[A-Za-z0-9_./:=,@+${}-]*", value):
        return f"--{name}={value}"
    return "--" + name + '="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class _Stage:
    name: str
    index: int
    line: int


class _Checker:
    def __init__(self, text: str, allowed: tuple[str, ...], resolve_id):
        self.text, self.allowed, self.resolve_id = text, allowed, resolve_id
        self.ids: dict[str, str] = {}

    # --- messages --------------------------------------------------------------
    def _offer(self) -> str:
        """The admin's base images, as a user reads them in a message."""
        if not self.allowed:
            return "none yet: ask the hub's admin (allowed_base_images)"
        return ", ".join(self.allowed)

    def _pin(self, name: str, line: int) -> str:
        if name not in self.ids:
            found = self.resolve_id(name)
            if not isinstance(found, str) or not _IMAGE_ID.fullmatch(found):
                raise _refuse(
                    line,
                    f"the base image {name} is not on this hub's Docker engine yet; ask the "
                    "hub's admin to pull or build it, then start the project again.",
                )
            self.ids[name] = found
        return self.ids[name]

    def _image(self, word: str, line: int, what: str) -> tuple[str, str | None]:
        """A FROM image or --from= value that names no stage: ('image', ID) when allowed."""
        if word == SCRATCH and what == "FROM ":
            return SCRATCH, None
        if normalise(word) in self.allowed:
            return word, self._pin(normalise(word), line)
        shown = f"{what}{_shown(word)}"
        fix = (
            f"Start FROM one of this hub's base images ({self._offer()}), or FROM a stage "
            "named above with AS."
            if what == "FROM "
            else "Copy from a stage above instead, by its AS name or its number (a base image "
            f"of this hub may be named too: {self._offer()})."
        )
        if _LOOKS_LIKE_ID.fullmatch(word):
            raise _refuse(
                line,
                f"{shown} names an image by its ID or digest; gpulab builds use only the "
                f"admin's base images, by name. {fix}",
            )
        raise _refuse(line, f"{shown} names an image this hub does not offer. {fix}")

    def _name_word(self, word: str, line: int, what: str) -> str:
        if "$" in word:
            raise _refuse(
                line,
                f"{what}{_shown(word)} takes a name from a variable; write the image's or "
                f"the stage's name itself (this hub's base images: {self._offer()}).",
            )
        if not _NAME.fullmatch(word):
            raise _refuse(
                line,
                f"{what}{_shown(word)} is not a plain image or stage name; write the name "
                "without quotes or escape characters.",
            )
        return word

    @property
    def example(self) -> str:
        return self.allowed[0] if self.allowed else "<image>"

    def _stage_ref(self, word: str, line: int, here: int, what: str) -> bool:
        """True when ``word`` names an earlier stage; refused when it names this or a later one."""
        key = word.lower()
        if key in self.stages:
            stage = self.stages[key]
            if stage.index < here:
                return True
            where = (
                "this stage itself"
                if stage.index == here
                else f"a stage that starts later, at line {stage.line}"
            )
            raise _refuse(
                line,
                f"{what}{_shown(word)} names {where}; a step can use only the stages above it.",
            )
        return False

    # --- instructions ----------------------------------------------------------
    def _from(self, ins: dict, line: int, here: int) -> str | None:
        args = _split(ins["value"], line)
        for name, value in args.flags:
            if name != "platform" or value is None or not _PLATFORM.fullmatch(value):
                raise _refuse(
                    line,
                    "FROM takes only the option --platform=<os/arch>; write FROM <image> or "
                    "FROM <image> AS <name>.",
                )
        words = [w for w in _WHITESPACE.split(args.rest) if w]
        if not (len(words) == 1 or (len(words) == 3 and words[1].lower() == "as")):
            raise _refuse(
                line, f"write FROM <image> or FROM <image> AS <name>, e.g. FROM {self.example}."
            )
        image = self._name_word(words[0], line, "FROM ")
        if self._stage_ref(image, line, here, "FROM "):
            return None
        _, pinned = self._image(image, line, "FROM ")
        if pinned is None:
            return None
        head = " ".join(["FROM", *(_quote_flag(n, v) for n, v in args.flags), pinned])
        return head + (f" AS {words[2].lower()}" if len(words) == 3 else "")

    def _copy(self, ins: dict, line: int, here: int) -> str | None:
        kind = ins["instruction"]
        args = _split(ins["value"], line)
        rewrite = False
        flags = []
        for name, value in args.flags:
            if kind == "ADD" and name in ("keep-git-dir", "checksum"):
                raise _refuse(
                    line,
                    f"ADD --{name} is for downloads, which gpulab's builds do not make with "
                    "ADD; download in a RUN step instead (RUN curl -fsSLo /path URL, or "
                    "RUN git clone URL /path).",
                )
            if name == "from":
                if kind == "ADD":
                    raise _refuse(line, "ADD has no --from; use COPY --from=<stage> instead.")
                if not value:
                    raise _refuse(line, "write --from=<stage name or number>.")
                word = self._name_word(value, line, "COPY --from=")
                if _INDEX.fullmatch(word):
                    if int(word) >= here:
                        before = {0: "no stage comes", 1: "only stage 0 comes"}.get(
                            here, f"only stages 0 to {here - 1} come"
                        )
                        raise _refuse(
                            line,
                            f"COPY --from={word} names stage {int(word)}, but {before} before "
                            "this line (stages are numbered from 0, in the order of their FROM "
                            "lines).",
                        )
                elif not self._stage_ref(word, line, here, "COPY --from="):
                    _, pinned = self._image(word, line, "COPY --from=")
                    if pinned is not None:
                        value, rewrite = pinned, True
            flags.append((name, value))
        if kind == "ADD":
            self._add_sources(args.rest, line)
        if not rewrite:
            return None
        return " ".join([kind, *(_quote_flag(n, v) for n, v in flags), args.rest])

    def _add_sources(self, rest: str, line: int) -> None:
        for words in _arg_lists(rest):
            dest = words[-1].strip("\"'") if len(words) > 1 else "/"
            for src in words[:-1] if len(words) > 1 else words:
                if "$" in src:
                    raise _refuse(
                        line,
                        f"ADD {_shown(src)} takes its source from a variable; write the "
                        "project file's path itself (to download a file, use a RUN step: "
                        "RUN curl -fsSLo /path URL).",
                    )
                plain = re.sub(r"[\"'\\`]", "", src)
                if _SCHEME.search(plain) and not _GIT_PATH.fullmatch(plain):
                    target = dest
                    if dest.endswith("/"):
                        base = plain.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
                        target = dest + (
                            base if re.fullmatch(r"[\w.+-]+", base or "") else "download"
                        )
                    raise _refuse(
                        line,
                        f"ADD {_shown(plain)} would have the Docker engine download it on "
                        "the host's own network, which builds may not reach. Download it in a "
                        "RUN step instead (RUN steps use the build's own network): RUN curl "
                        f"-fsSLo {_shown(target)} {_shown(plain)} (or pip install or git clone "
                        "in a RUN step). ADD and COPY take the project's own files, archives "
                        "included.",
                    )
                if (
                    _SCHEME.search(plain)
                    or plain.startswith(("git@", "github.com/"))
                    or _SCP_LIKE.fullmatch(plain)
                    or _GIT_PATH.fullmatch(plain)
                ):
                    raise _refuse(
                        line,
                        f"ADD {_shown(plain)} names a git repository; clone it in a RUN step "
                        f"instead, on the build's own network: RUN git clone {_shown(plain)} "
                        f"{_shown(dest)}. To add a project folder of that name, use COPY.",
                    )

    def _run(self, ins: dict, line: int) -> None:
        args = _split(ins["value"], line)
        for name, _ in args.flags:
            if name == "mount":
                raise _refuse(
                    line,
                    "RUN --mount needs Docker's BuildKit, which gpulab's builds do not use. "
                    "Copy what the step needs into the image first: COPY <project path> <path>, "
                    "or COPY --from=<a stage above> <path> <path>.",
                )
            raise _refuse(
                line,
                f"RUN --{name} is not allowed: a build step runs on the build's own network "
                "with no extra privileges, like the project's container; remove the option.",
            )

    # --- the whole file ----------------------------------------------------------
    def _collect_stages(self, instructions: list[dict]) -> None:
        self.stages: dict[str, _Stage] = {}
        index = 0
        for ins in instructions:
            if ins["instruction"] != "FROM":
                continue
            line = ins["startline"] + 1
            words = [w for w in _WHITESPACE.split(ins["value"]) if w]
            if len(words) >= 3 and words[-2].lower() == "as":
                name = words[-1].lower()
                if not _STAGE.fullmatch(name):
                    raise _refuse(
                        line,
                        f"the stage name {_shown(words[-1])} must start with a letter and hold "
                        "only letters, digits, '-', '_' and '.'.",
                    )
                if name in self.stages:
                    raise _refuse(
                        line,
                        f"the stage name {name} is already used at line {self.stages[name].line}; "
                        "give each stage its own name.",
                    )
                self.stages[name] = _Stage(name, index, line)
            index += 1

    def run(self) -> str:
        lines = _clean(self.text)
        _escape_token(lines)
        instructions = _instructions(lines)
        self._collect_stages(instructions)
        stage = -1
        rewrites: list[tuple[int, int, str]] = []
        for ins in instructions:
            kind, line = ins["instruction"], ins["startline"] + 1
            if kind not in INSTRUCTIONS:
                raise _refuse(line, f"{_shown(kind)} is not a Dockerfile instruction.")
            if stage < 0 and kind not in ("FROM", "ARG"):
                raise _refuse(
                    line,
                    f"only ARG may come before the first FROM; start with FROM {self.example}.",
                )
            new = None
            if kind == "FROM":
                stage += 1
                new = self._from(ins, line, stage)
            elif kind in ("COPY", "ADD"):
                new = self._copy(ins, line, stage)
            elif kind == "RUN":
                self._run(ins, line)
            elif kind == "ONBUILD":
                raise _refuse(
                    line,
                    "ONBUILD is not allowed: its instruction would run in another build. "
                    "Write the instruction itself.",
                )
            if new is not None:
                rewrites.append((ins["startline"], ins["endline"], new))
        if stage < 0:
            raise ProjectError(
                f"The Dockerfile has no FROM line; start it with FROM {self.example}."
            )
        for start, end, new in rewrites:
            lines[start] = new
            for i in range(start + 1, end + 1):
                lines[i] = ""
        return "\n".join(lines)

"""The managed block of a project's Dockerfile: its markers, its lines, one parser.

``%gpu_install`` (in the project) records each install as a line between two marker
lines; the hub's Save a copy reads a source project's block and writes lines into the
destination's; the project template (images/project.Dockerfile.j2) renders the
markers from here. All of them parse the block with this code, so the two sides never
disagree on where it is or what it holds. Pure text functions, standard library only:
reading, locking and writing the file are each side's own (they trust different
things: the hub reads a hostile project folder through descriptors).

Only the lines between the markers are ever rewritten; every byte outside them stays
as it was. Without markers, :func:`split` places a new block right after the last FROM
instruction (the final build stage).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

__all__ = [
    "APT_PACKAGE",
    "APT_RUN",
    "END_MARKER",
    "START_MARKER",
    "TRUSTED_HOST",
    "DockerfileError",
    "Item",
    "apply",
    "apt_item",
    "apt_packages",
    "block_lines",
    "canonical_name",
    "find_block",
    "instruction_text",
    "logical",
    "managed_packages",
    "parse_block",
    "pip_requirements",
    "requirement_name",
    "split",
]

# The two marker lines (a line holding one, spaces around it aside, is a marker).
START_MARKER = "# >>> gpulab managed block: written by %gpu_install, do not edit by hand >>>"
END_MARKER = "# <<< gpulab managed block <<<"
# The apt line %gpu_install writes (between USER root and USER <notebook user> where
# the image's user is not root).
APT_RUN = (
    "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
    "--no-install-recommends {packages} && rm -rf /var/lib/apt/lists/*"
)
# Whole-value patterns (fullmatch only): a Debian package (optionally =version), as
# the apt line may name it; a host name or IPv4 address with an optional port, as a
# pip line's --trusted-host may name it (at most 260 characters).
APT_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.\-]{0,99}(=[A-Za-z0-9.+~:\-]{1,100})?")
_LABEL = r"[A-Za-z0-9][A-Za-z0-9-]{0,62}"
TRUSTED_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL}){{0,20}}(?::[0-9]{{1,5}})?")
MAX_HOST = 260

_APT_INSTALL = re.compile(r"apt-get install ((?:-\S+ )*)(.+?) && rm -rf /var/lib/apt/lists/\*$")
_VALUE_OPTIONS = {
    "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint",
    "--trusted-host", "-C", "--config-settings", "-r", "--requirement",
}  # fmt: skip
_NAME_SEPARATORS = re.compile(r"[-_.]+")


class DockerfileError(Exception):
    """The Dockerfile's managed block cannot be read or updated; ``str()`` says why."""


@dataclass
class Item:
    """One logical piece of the managed block: a pip line, the apt lines, or other."""

    lines: list[str]  # physical lines, without line endings
    key: str = ""  # canonical distribution name of a pip line; "apt" for the apt lines
    apt: list[str] = field(default_factory=list)
    raw: list[str] | None = None  # the lines as read, with their endings (None: new)


def host_ok(host: str) -> bool:
    """Whether ``host`` is one a managed pip line may name in ``--trusted-host``."""
    return len(host) <= MAX_HOST and TRUSTED_HOST.fullmatch(host) is not None


def canonical_name(name: str) -> str:
    """A distribution's canonical name (PEP 503): 'Foo_Bar.baz' -> 'foo-bar-baz'."""
    return _NAME_SEPARATORS.sub("-", name).lower()


def split_lines(text: str) -> list[str]:
    """Physical lines, each with its own line ending (split on \\n only)."""
    return [line for line in re.split(r"(?<=\n)", text) if line]


def logical(lines: list[str]) -> list[list[str]]:
    """Group physical lines into instructions joined by backslash continuations.

    Inside a continuation, comment and blank lines do not end the instruction
    (Docker skips them there).
    """
    groups: list[list[str]] = []
    current: list[str] = []
    for line in lines:
        stripped = line.strip()
        current.append(line)
        if current[:-1] and (not stripped or stripped.startswith("#")):
            continue  # inside a continuation
        if not stripped.endswith("\\") or stripped.startswith("#"):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def instruction_text(lines: list[str]) -> str:
    """One logical instruction as a single line (continuations joined)."""
    parts = [ln.rstrip() for ln in lines if not ln.strip().startswith("#")]
    return " ".join(p[:-1].strip() if p.endswith("\\") else p.strip() for p in parts).strip()


def pip_requirements(instruction: str) -> list[str]:
    """Requirements (as written) that a ``RUN ... pip install ...`` instruction installs."""
    if not instruction.upper().startswith("RUN "):
        return []
    try:
        tokens = shlex.split(instruction[4:], posix=True)
    except ValueError:
        return []
    reqs: list[str] = []
    i = 0
    while i < len(tokens):
        if tokens[i] == "install" and i > 0 and tokens[i - 1] in ("pip", "pip3"):
            i += 1
            while i < len(tokens) and tokens[i] not in ("&&", "||", ";", "|"):
                tok = tokens[i]
                if tok in _VALUE_OPTIONS:
                    i += 2
                    continue
                if not tok.startswith("-"):
                    reqs.append(tok)
                i += 1
        i += 1
    return reqs


def requirement_name(req: str) -> str:
    """Canonical name of a written requirement; '' for paths and bare URLs."""
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if not m or "/" in req.split("@")[0] or req.startswith("."):
        return ""
    return canonical_name(m.group(1))


def apt_packages(instruction: str) -> list[str]:
    """The packages an ``apt-get install ... && rm -rf /var/lib/apt/lists/*`` line names."""
    m = _APT_INSTALL.search(instruction)
    return m.group(2).split() if m else []


def parse_block(lines: list[str]) -> list[Item]:
    """Items of the managed block (physical lines with their endings)."""
    items: list[Item] = []
    groups = logical(lines)
    texts = [instruction_text([ln.rstrip("\r\n") for ln in g]) for g in groups]
    i = 0
    while i < len(groups):
        text = texts[i]
        nxt = texts[i + 1] if i + 1 < len(groups) else ""
        after = texts[i + 2] if i + 2 < len(groups) else ""
        if text == "USER root" and apt_packages(nxt) and after.startswith("USER "):
            raw, key, apt, i = groups[i] + groups[i + 1] + groups[i + 2], "apt", nxt, i + 3
        else:
            raw, i = groups[i], i + 1
            reqs = pip_requirements(text)
            key = requirement_name(reqs[0]) if len(reqs) == 1 else ""
            key = "apt" if apt_packages(text) else key
            apt = text
        item = Item([ln.rstrip("\r\n") for ln in raw], key=key, raw=raw)
        if key == "apt":
            item.apt = apt_packages(apt)
        items.append(item)
    return items


def find_block(text: str) -> tuple[list[str], list[str], list[str]] | None:
    """(lines up to and including the start marker, block lines, end marker and after),
    each line with its ending; None where the Dockerfile has no markers at all.

    Raises :class:`DockerfileError` for two blocks, a lone marker, or an end marker
    before the start marker.
    """
    lines = split_lines(text)
    starts = [i for i, ln in enumerate(lines) if ln.strip() == START_MARKER]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == END_MARKER]
    if len(starts) > 1 or len(ends) > 1:
        raise DockerfileError(
            "The Dockerfile has more than one gpulab managed block; keep one pair of "
            f"the lines {START_MARKER!r} and {END_MARKER!r}."
        )
    if starts and ends:
        if ends[0] < starts[0]:
            raise DockerfileError("The managed block's end marker comes before its start marker.")
        return lines[: starts[0] + 1], lines[starts[0] + 1 : ends[0]], lines[ends[0] :]
    if starts or ends:
        missing = END_MARKER if starts else START_MARKER
        raise DockerfileError(f"The Dockerfile lacks the managed block marker line {missing!r}.")
    return None


def block_lines(text: str) -> list[str] | None:
    """The managed block's lines without their endings; None where the Dockerfile has
    no block, or not one well-formed block (a reader's view: nothing to read)."""
    try:
        found = find_block(text)
    except DockerfileError:
        return None
    if found is None:
        return None
    return [ln.removesuffix("\n").removesuffix("\r") for ln in found[1]]


def split(text: str) -> tuple[list[str], list[str], list[str]]:
    """:func:`find_block`, or where there are no markers, a new empty block placed right
    after the last FROM instruction (the final build stage)."""
    found = find_block(text)
    return found if found is not None else _new_block(split_lines(text))


def eol(lines: list[str]) -> str:
    """The line ending most of ``lines`` use."""
    crlf = sum(ln.endswith("\r\n") for ln in lines)
    return "\r\n" if crlf * 2 > len(lines) else "\n"


_ESCAPE_DIRECTIVE = re.compile(r"^\s*#\s*escape\s*=\s*(\\|`)\s*$", re.IGNORECASE)
_SYNTAX_DIRECTIVE = re.compile(r"^\s*#\s*syntax\s*=\s*(.*)\s*$", re.IGNORECASE)
_COMMENT = re.compile(r"^\s*#")
_INSTRUCTION = re.compile(r"^\s*(\S+)\s+(.*)$")


def last_from_end(lines: list[str]) -> int | None:
    """Index of the last physical line of the Dockerfile's last FROM instruction; None
    without one. Docker's grammar as the builder reads it: parser directives at the top
    (``# escape=`` picks the continuation character), comment lines (which neither
    start nor end an instruction, inside a continuation too), continuations."""
    escape = "\\"
    directives = True
    last = None
    current: str | None = None  # the instruction a continuation belongs to
    for n, line in enumerate(lines):
        if directives:
            m = _ESCAPE_DIRECTIVE.match(line)
            if m:
                escape = m.group(1)
            elif not _SYNTAX_DIRECTIVE.match(line):
                directives = False
        if _COMMENT.match(line):
            continue
        if current is None:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            current = m.group(1).upper()
        if not line.rstrip().endswith(escape):  # the instruction ends on this line
            if current == "FROM":
                last = n
            current = None
    return last  # (a FROM still continued at the end of the file does not count)


def _new_block(lines: list[str]) -> tuple[list[str], list[str], list[str]]:
    end = last_from_end(lines)
    if end is None:
        raise DockerfileError("The Dockerfile has no FROM line, so it has no place for packages.")
    ending = eol(lines)
    head = lines[: end + 1]
    if head and not head[-1].endswith("\n"):
        head[-1] += ending
    return [*head, ending, START_MARKER + ending], [], [END_MARKER + ending, *lines[end + 1 :]]


def managed_packages(text: str) -> dict[str, str]:
    """{canonical name: requirement as written} of the managed block's pip lines."""
    _, block, _ = split(text)
    out = {}
    for item in parse_block(block):
        if item.key and item.key != "apt":
            out[item.key] = pip_requirements(instruction_text(item.lines))[0]
    return out


def apt_item(packages: list[str], user: str) -> Item:
    """The apt lines for ``packages`` (``user``: the image's notebook user, switched
    back to after installing as root)."""
    run = APT_RUN.format(packages=" ".join(packages))
    lines = [run] if user in ("", "root", "0", "0:0") else ["USER root", run, f"USER {user}"]
    return Item(lines, key="apt", apt=list(packages))


def apply(text: str, pip_lines: list[tuple[str, str]], apt=(), user: str = "") -> str:
    """The Dockerfile with these pip lines ((name, RUN line) pairs) and apt packages
    recorded in its managed block (a new block after the last FROM where it has none)."""
    head, block, tail = split(text)
    ending = eol(head + block + tail)
    items = parse_block(block)
    for key, line in pip_lines:
        new = Item([line], key=key)
        same = [n for n, it in enumerate(items) if it.key == key]
        if same:
            items[same[0]] = new
            items = [it for n, it in enumerate(items) if n not in same[1:]]
        else:
            items.append(new)
    if apt:
        old = next((it for it in items if it.key == "apt"), None)
        names = {p.split("=")[0]: p for p in (old.apt if old else [])}
        names.update({p.split("=")[0]: p for p in apt})
        new = apt_item([names[n] for n in sorted(names)], user)
        if old is None:
            items.insert(0, new)
        elif new.apt != old.apt:
            items[items.index(old)] = new
    out: list[str] = []
    for item in items:
        out += item.raw if item.raw is not None else [ln + ending for ln in item.lines]
    return "".join(head + out + tail)

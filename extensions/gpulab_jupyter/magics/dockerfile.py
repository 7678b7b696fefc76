"""The managed block of a project's Dockerfile: parse, update, write safely.

Only the lines between the two markers are ever rewritten; every byte outside
them stays as it was. Writes happen under a file lock, to a temporary file in
the same folder that then replaces the Dockerfile (atomic rename), and only if
the file did not change while the new content was computed.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

# The two marker lines, exactly as images/project.Dockerfile.j2 writes them.
START_MARKER = "# >>> gpulab managed block: written by %gpu_install, do not edit by hand >>>"
END_MARKER = "# <<< gpulab managed block <<<"
LOCK_TIMEOUT = 120
_APT_INSTALL = re.compile(r"apt-get install ((?:-\S+ )*)(.+?) && rm -rf /var/lib/apt/lists/\*$")
_VALUE_OPTIONS = {
    "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint",
    "--trusted-host", "-C", "--config-settings", "-r", "--requirement",
}  # fmt: skip
APT_RUN = (
    "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
    "--no-install-recommends {packages} && rm -rf /var/lib/apt/lists/*"
)


class DockerfileError(Exception):
    """The Dockerfile cannot be updated; ``str()`` says why, for the user."""


@dataclass
class Item:
    """One logical piece of the managed block: a pip line, the apt lines, or other."""

    lines: list[str]  # physical lines, without line endings
    key: str = ""  # canonical distribution name of a pip line; "apt" for the apt lines
    apt: list[str] = field(default_factory=list)
    raw: list[str] | None = None  # the lines as read, with their endings (None: new)


def _split_lines(text: str) -> list[str]:
    """Physical lines, each with its own line ending (split on \\n only)."""
    return [line for line in re.split(r"(?<=\n)", text) if line]


def _logical(lines: list[str]) -> list[list[str]]:
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
    return canonicalize_name(m.group(1))


def apt_packages(instruction: str) -> list[str]:
    m = _APT_INSTALL.search(instruction)
    return m.group(2).split() if m else []


def parse_block(lines: list[str]) -> list[Item]:
    """Items of the managed block (physical lines with their endings)."""
    items: list[Item] = []
    groups = _logical(lines)
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


def managed_packages(text: str) -> dict[str, str]:
    """{canonical name: requirement as written} of the managed block's pip lines."""
    _, block, _ = split(text)
    out = {}
    for item in parse_block(block):
        if item.key and item.key != "apt":
            out[item.key] = pip_requirements(instruction_text(item.lines))[0]
    return out


def split(text: str) -> tuple[list[str], list[str], list[str]]:
    """(lines up to and including the start marker, block lines, end marker and after).

    Lines keep their endings. Without markers, a block is placed right after the
    last FROM instruction (the final build stage).
    """
    lines = _split_lines(text)
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
    return _new_block(lines)


def _eol(lines: list[str]) -> str:
    crlf = sum(ln.endswith("\r\n") for ln in lines)
    return "\r\n" if crlf * 2 > len(lines) else "\n"


def _new_block(lines: list[str]) -> tuple[list[str], list[str], list[str]]:
    from dockerfile_parse import DockerfileParser

    text = "".join(lines)
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode("utf-8", "surrogateescape")))
    froms = [i for i in parser.structure if i["instruction"] == "FROM"]
    if not froms:
        raise DockerfileError("The Dockerfile has no FROM line, so it has no place for packages.")
    end = froms[-1]["endline"]
    eol = _eol(lines)
    head = lines[: end + 1]
    if head and not head[-1].endswith("\n"):
        head[-1] += eol
    return [*head, eol, START_MARKER + eol], [], [END_MARKER + eol, *lines[end + 1 :]]


def apt_item(packages: list[str], user: str) -> Item:
    run = APT_RUN.format(packages=" ".join(packages))
    lines = [run] if user in ("", "root", "0", "0:0") else ["USER root", run, f"USER {user}"]
    return Item(lines, key="apt", apt=list(packages))


def apply(text: str, pip_lines: list[tuple[str, str]], apt: list[str] = (), user: str = "") -> str:
    """The Dockerfile with these pip lines ({name: RUN line}) and apt packages recorded."""
    head, block, tail = split(text)
    eol = _eol(head + block + tail)
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
        out += item.raw if item.raw is not None else [ln + eol for ln in item.lines]
    return "".join(head + out + tail)


def _lock_path(dockerfile: Path) -> Path:
    folder = dockerfile.parent / ".gpulab"
    try:
        folder.mkdir(exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder / "dockerfile.lock"
    except OSError:
        pass
    return dockerfile.parent / f".{dockerfile.name}.lock"


def write_atomic(path: Path, data: bytes, like: os.stat_result | None) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, (like.st_mode & 0o7777) if like else 0o644)
        if like and os.geteuid() == 0:
            os.chown(tmp, like.st_uid, like.st_gid)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def update(dockerfile: Path, pip_lines, apt=(), user: str = "") -> tuple[bytes, bytes]:
    """Record lines in the Dockerfile under its lock. Returns (old bytes, new bytes)."""
    from filelock import FileLock, Timeout

    dockerfile = Path(dockerfile)
    try:
        with FileLock(str(_lock_path(dockerfile)), timeout=LOCK_TIMEOUT):
            for _ in range(5):
                old = dockerfile.read_bytes()
                st = dockerfile.stat()
                new_text = apply(old.decode("utf-8", "surrogateescape"), pip_lines, apt, user)
                new = new_text.encode("utf-8", "surrogateescape")
                if new == old:
                    return old, new
                if dockerfile.read_bytes() == old:  # nobody saved it meanwhile
                    write_atomic(dockerfile, new, st)
                    return old, new
            raise DockerfileError("The Dockerfile kept changing while gpulab tried to update it.")
    except Timeout as e:
        raise DockerfileError(
            f"Another install held the Dockerfile's lock for {LOCK_TIMEOUT} s; try again."
        ) from e
    except FileNotFoundError as e:
        raise DockerfileError(f"There is no Dockerfile at {dockerfile}.") from e

"""The process that renders one public notebook to HTML (publicrender.py starts it).

Run as ``python -I nbrender.py MAX_IN MAX_OUT MEMORY_MIB CPU_S``: reads at most
MAX_IN bytes of notebook JSON from stdin, writes the sanitized HTML (nbconvert's
``basic`` template: cells and outputs, no page around it) to stdout. It limits
itself first (address space, CPU seconds, no core file), so a hostile notebook
costs at most that; the hub kills it when its time limit passes.

Standalone on purpose: it imports only the standard library, nbformat and
nbconvert (no gpulab package, no hub), so it starts as fast as nbconvert allows.

Exit status: 0 rendered; NOT_NOTEBOOK the input is not a notebook (or over MAX_IN);
TOO_BIG the HTML would be over MAX_OUT; anything else a failure (memory, a crash).
"""

from __future__ import annotations

import json
import resource
import sys

NOT_NOTEBOOK = 65
TOO_BIG = 66


def _limit(memory_mib: int, cpu_s: int) -> None:
    mem = memory_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def render(data: bytes) -> str:
    """The notebook as sanitized HTML; ValueError when it is not a notebook."""
    # Text that is not a JSON object is refused before nbconvert is even imported.
    if not isinstance(json.loads(data.decode("utf-8")), dict):
        raise ValueError("not a JSON object")
    import nbformat
    from nbconvert import HTMLExporter

    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except nbformat.ValidationError as e:
        raise ValueError(f"not a valid notebook: {e}") from e
    exporter = HTMLExporter(template_name="basic", sanitize_html=True)
    body, _ = exporter.from_notebook_node(nb)
    return body


def main(argv: list[str]) -> int:
    max_in, max_out, memory_mib, cpu_s = (int(x) for x in argv)
    _limit(memory_mib, cpu_s)
    data = sys.stdin.buffer.read(max_in + 1)
    if len(data) > max_in:
        return NOT_NOTEBOOK
    try:
        body = render(data)
    except ValueError:  # also UnicodeDecodeError and json's JSONDecodeError
        return NOT_NOTEBOOK
    except (KeyError, TypeError, AttributeError):  # a notebook of the wrong shape
        return NOT_NOTEBOOK
    out = body.encode("utf-8")
    if len(out) > max_out:
        return TOO_BIG
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

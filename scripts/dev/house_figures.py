"""The figures of the house (issue: the house, second pass), read from the source.

    python scripts/dev/house_figures.py [REPO] [--json]

Reads every module of gpulab's Python distributions (hub side, user side, contract) with
``ast`` and prints:

- the hub's package-level import graph: package cycles (strongly connected groups of
  subpackages) and arrows that run back up (an import from a lower layer to a higher
  one, by the layers in docs/architecture.md: LAYERS below);
- Docker call paths: the places that reach the Docker engine other than through the one
  client (``host.Docker``): Docker SDK clients built, ``docker`` command lines run;
- ways blocking work leaves the event loop: thread pools made, ``run_in_executor`` and
  ``asyncio.to_thread`` call sites outside the one module for it;
- NVML paths: modules that reach NVML, and through which library;
- settings readers: modules that read a ``GPULAB_*`` variable from the environment;
- atomic writers: functions that write a temporary file and rename it over another.

Function-level imports count (a cycle hidden in a function body is still two modules
that need each other); imports under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from pathlib import Path


def _enforced(name: str):
    """tests/test_imports.py's table ``name`` (the layers the tests enforce), read as a
    literal, so that a tree of another revision is measured by today's layers."""
    source = Path(__file__).resolve().parents[2] / "tests" / "test_imports.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(f"tests/test_imports.py has no {name}")


# Layers of the hub package, lowest first; modules JupyterHub loads by the dotted name an
# admin writes are entry points, in the surfaces layer whichever folder holds them. A
# module may import its own layer and those below; one not named counts as a capability.
LAYERS: dict[str, set[str]] = _enforced("LAYERS")
ENTRY_POINTS = tuple(e.removeprefix("gpulab_hub.") for e in _enforced("ENTRY_POINTS"))
ORDER = list(LAYERS)
SOURCES = {
    "gpulab_hub": "spawner/gpulab_hub",
    "gpulab_jupyter": "extensions/gpulab_jupyter",
    "gpulab_contract": "contract/gpulab_contract",
}
HELPER_POOL_MODULES = {"gpulab_hub.blocking"}


def layer_of(package: str) -> int:
    if package in ENTRY_POINTS:
        return ORDER.index("surfaces")
    for n, name in enumerate(ORDER):
        if package in LAYERS[name]:
            return n
    return ORDER.index("capabilities")


def modules(repo: Path) -> dict[str, Path]:
    found = {}
    for top, rel in SOURCES.items():
        root = repo / rel
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            if "node_modules" in path.parts or "__pycache__" in path.parts:
                continue
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def walk(tree: ast.AST):
    """ast.walk without the bodies of `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not _type_checking(child):
                todo.append(child)


def imports(name: str, path: Path, tree: ast.AST) -> set[str]:
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def node_of(parts: list[str]) -> str:
    """The graph's node of a hub module: its entry point, else its subpackage."""
    for entry in ENTRY_POINTS:
        if ".".join(parts[1:]) == entry or ".".join(parts[1:]).startswith(entry + "."):
            return entry
    return parts[1]


def package_graph(mods: dict[str, Path], trees: dict[str, ast.AST]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        parts = name.split(".")
        if parts[0] != "gpulab_hub" or len(parts) < 2:
            continue
        src = node_of(parts)
        graph[src]
        for target in imports(name, path, trees[name]):
            t = target.split(".")
            if t[0] == "gpulab_hub" and len(t) > 1 and f"gpulab_hub.{t[1]}" in mods:
                dst = node_of(t)
                if dst != src:
                    graph[src].add(dst)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [g for g in out if len(g) > 1]


def calls(tree: ast.AST) -> list[tuple[ast.Call, str]]:
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                found.append((node, f.attr))
            elif isinstance(f, ast.Name):
                found.append((node, f.id))
    return found


def _strings(node: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def figures(repo: Path) -> dict:
    mods = modules(repo)
    trees = {n: ast.parse(p.read_text(), str(p)) for n, p in mods.items()}
    graph = package_graph(mods, trees)
    cycles = strongly_connected(graph)
    back = sorted(
        f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a)
    )
    docker, pools, nvml, readers, writers = [], [], [], [], []
    hub_imports_user = []
    for name, tree in trees.items():
        imported = imports(name, mods[name], tree)
        if name.startswith("gpulab_hub") and any(i.startswith("gpulab_jupyter") for i in imported):
            hub_imports_user.append(name)
        libs = set()
        if any(i.split(".")[0] in ("pynvml", "nvitop") for i in imported):
            libs.add(
                "nvidia-ml-py (pynvml)"
                if any(i.startswith("pynvml") for i in imported)
                else "nvitop"
            )
        for node, fn in calls(tree):
            words = _strings(node)
            target = ast.unparse(node.func)
            made = target in ("DockerClient", "APIClient") or (
                target.startswith("docker.") and fn in ("DockerClient", "from_env", "APIClient")
            )
            if made and name != "gpulab_hub.host":
                docker.append(f"{name}: {target}()")
            if fn in (
                "run",
                "Popen",
                "check_output",
                "check_call",
                "call",
                "create_subprocess_exec",
            ) and words[:1] == ["docker"]:
                docker.append(f"{name}: `docker` command line")
            if name not in HELPER_POOL_MODULES and fn in (
                "ThreadPoolExecutor",
                "run_in_executor",
                "to_thread",
            ):
                pools.append(f"{name}: {fn}")
        source = mods[name].read_text()
        if "CDLL" in source and "libnvidia-ml" in source:
            libs.add("own ctypes binding")
        if 'which("nvidia-smi")' in source or '["nvidia-smi"' in source:
            libs.add("nvidia-smi command line")
        for node in walk(tree):
            key = None
            if isinstance(node, ast.Call):
                f = node.func
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr in ("get", "getenv", "pop")
                    and node.args
                ):
                    key = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                key = node.slice
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and key.value.startswith("GPULAB_")
            ):
                readers.append(f"{name}: {key.value}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.unparse(node)
                renames = (
                    "os.replace(" in text
                    or "os.rename(" in text
                    or ".replace(tmp" in text
                    or ".rename(" in text
                    and "tmp" in text
                )
                temp = any(w in text for w in ("tmp", "temp", "partial", ".part", "mkstemp"))
                if (
                    renames
                    and temp
                    and not any(
                        isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and inner is not node
                        for inner in ast.walk(node)
                    )
                ):
                    writers.append(f"{name}.{node.name}")
        if libs:
            nvml.append(f"{name}: {', '.join(sorted(libs))}")
    nvml_libs = sorted({lib for row in nvml for lib in row.split(": ", 1)[1].split(", ")})
    reader_modules = sorted({r.split(":")[0] for r in readers})
    return {
        "package_cycles": [" <-> ".join(c) for c in cycles],
        "back_arrows": back,
        "hub_imports_of_user_side": sorted(hub_imports_user),
        "docker_paths_outside_the_client": sorted(set(docker)),
        "thread_pool_entry_points": sorted(pools),
        "nvml_paths": sorted(nvml),
        "nvml_libraries": nvml_libs,
        "settings_reader_modules": reader_modules,
        "settings_reads": sorted(readers),
        "atomic_writers": sorted(writers),
    }


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    repo = Path(args[0]) if args else Path(__file__).resolve().parents[2]
    found = figures(repo)
    if "--json" in argv:
        print(json.dumps(found, indent=2))
        return 0
    for key, rows in found.items():
        print(f"{key}: {len(rows)}")
        for row in rows:
            print(f"    {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

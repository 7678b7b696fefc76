"""Every module of gpulab's distributions imports on its own, no two import each other,
and the hub's packages keep the layers of docs/architecture.md.

The import graph is read from the source (every ``import``, at the top, inside a
function or under ``if TYPE_CHECKING:``), so a cycle hidden in a function body or in
type hints counts too: it is still two modules that need each other (a module's
helpers that need its caller name a protocol of a module below both, as ssh/peer.py).
A module reading its own package (``from . import __version__``) is no edge: Python has
always imported the package first.

The hub's layers, lowest first (docs/architecture.md, "Layers"): a package may import
its own layer and those below, never one above, and no two packages need each other.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

PACKAGES = ("gpulab_hub", "gpulab_jupyter", "gpulab_contract")

# The hub's packages (a subpackage or a top-level module of gpulab_hub) by layer, lowest
# first. A new package must be named here: the test says so.
LAYERS = {
    "foundation": {
        "gpulab_hub", "jsonfile", "pidfile", "hubsettings", "settings", "settingvalues",
        "layout", "hubfiles", "firewall", "egress", "buildruntime", "blocking", "records",
        "projects", "stateversion", "db",
    },
    "capabilities": {
        "images", "gpus", "cluster", "sharing", "secrets", "ssh", "tls", "accounts", "host",
        "culling", "serverready",
    },
    "workflows": {"workflows", "backup"},
    "surfaces": {
        "spawner", "spawnerimage", "home", "usagepage", "doctor", "cli", "admin", "hubconfig",
    },
}  # fmt: skip
# Modules JupyterHub loads by the dotted name an admin writes in jupyterhub_config.py
# (README, docs/reference.md): entry points, in the surfaces layer whichever folder
# holds them (their names are public, so they stay beside the capability they serve).
ENTRY_POINTS = {
    "gpulab_hub.cluster.spawner": "c.JupyterHub.spawner_class (ProjectSlurmSpawner)",
    "gpulab_hub.accounts.auth": "c.JupyterHub.authenticator_class (GpulabAuthenticator)",
}


def modules() -> dict[str, Path]:
    """name -> source file of every module and package of gpulab_hub and gpulab_jupyter."""
    found = {}
    for top in PACKAGES:
        package = importlib.import_module(top)
        found[top] = Path(package.__file__)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            spec = importlib.util.find_spec(info.name)
            if spec and spec.origin and spec.origin.endswith(".py"):
                found[info.name] = Path(spec.origin)
    return found


def _imports(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        yield from _imports_of(node)


def _imports_of(node: ast.AST):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def imported_by(name: str, path: Path, known: set[str]) -> set[str]:
    """The gpulab modules that module ``name`` imports."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
            continue
        base = node.module or ""
        if node.level:
            parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
            base = f"{parent}.{base}" if base else parent
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in known:
                out.add(sub)  # from package import module
            elif base in known:
                out.add(base)
    return {m for m in out if m != name and not name.startswith(m + ".")}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


MODULES = modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_imports(name):
    importlib.import_module(name)


def test_no_import_cycles():
    known = set(MODULES)
    graph = {name: imported_by(name, path, known) for name, path in MODULES.items()}
    assert graph["gpulab_hub.doctor.cuda"] >= {"gpulab_hub.doctor.gpu"}  # the reader reads
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# --- the hub-project contract (gpulab_contract) ------------------------------------
_ROOT = Path(__file__).resolve().parent.parent


def _imported_names(path: Path) -> set[str]:
    """Every module an ``import`` anywhere in ``path`` names (top-level or in a function,
    TYPE_CHECKING blocks included), and every literal ``importlib.import_module`` /
    ``__import__`` argument."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if called in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                names.add(str(arg.value))
    return names


def test_the_hub_never_imports_the_user_side(tmp_path):
    """The hub reads what it shares with projects from gpulab_contract; gpulab_jupyter
    (with jupyter_server and ipywidgets behind it) is the project's, not the hub's."""
    files = sorted((_ROOT / "spawner" / "gpulab_hub").rglob("*.py"))
    assert len(files) > 100
    offenders = {
        str(path.relative_to(_ROOT)): sorted(
            n for n in _imported_names(path) if n.split(".")[0] == "gpulab_jupyter"
        )
        for path in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # and the scan does see such imports, wherever they hide
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import gpulab_jupyter.arch\n"
        "def f():\n"
        "    from gpulab_jupyter.magics import dockerfile\n"
        "    return importlib.import_module('gpulab_jupyter.jobs.model')\n"
    )
    assert _imported_names(planted) == {
        "gpulab_jupyter.arch",
        "gpulab_jupyter.magics",
        "gpulab_jupyter.jobs.model",
    }


def test_the_contract_needs_only_the_standard_library():
    """Both sides install gpulab_contract: it imports Python's standard library and
    itself only, so the hub never pulls the user side in through it, nor the reverse."""
    import sys

    files = sorted((_ROOT / "contract" / "gpulab_contract").rglob("*.py"))
    assert files
    outside = {
        str(path.relative_to(_ROOT)): sorted(
            n
            for n in _imported_names(path)
            if n.split(".")[0] not in sys.stdlib_module_names | {"gpulab_contract", "__future__"}
        )
        for path in files
    }
    assert {k: v for k, v in outside.items() if v} == {}


# --- the hub's layers ------------------------------------------------------------------
def node_of(module: str) -> str | None:
    """The hub package (or entry point) ``module`` belongs to; None outside the hub."""
    parts = module.split(".")
    if parts[0] != "gpulab_hub":
        return None
    for entry in ENTRY_POINTS:
        if module == entry or module.startswith(entry + "."):
            return entry.removeprefix("gpulab_hub.")
    return parts[1] if len(parts) > 1 else "gpulab_hub"


def layer_of(node: str) -> int | None:
    if node in {e.removeprefix("gpulab_hub.") for e in ENTRY_POINTS}:
        return list(LAYERS).index("surfaces")
    for n, members in enumerate(LAYERS.values()):
        if node in members:
            return n
    return None


def package_graph() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) hub package -> the module imports that make the arrow."""
    known = set(MODULES)
    arrows: dict[tuple[str, str], set[str]] = {}
    for name, path in MODULES.items():
        here = node_of(name)
        if here is None:
            continue
        for target in imported_by(name, path, known):
            there = node_of(target)
            if there is not None and there != here:
                arrows.setdefault((here, there), set()).add(f"{name} -> {target}")
    return arrows


def back_arrows(arrows) -> list[str]:
    """Imports from a lower layer to a higher one, with the modules that make them."""
    names = list(LAYERS)
    return [
        f"{a} ({names[layer_of(a)]}) -> {b} ({names[layer_of(b)]}): {', '.join(sorted(why))}"
        for (a, b), why in sorted(arrows.items())
        if layer_of(a) < layer_of(b)
    ]


def package_cycles(arrows) -> list[list[str]]:
    """The groups of hub packages that need each other (strongly connected, >1)."""
    graph: dict[str, set[str]] = {}
    for a, b in arrows:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_every_hub_package_has_a_layer():
    nodes = {node_of(m) for m in MODULES} - {None}
    missing = sorted(n for n in nodes if layer_of(n) is None)
    assert not missing, f"name the layer of {missing} in LAYERS (and docs/architecture.md)"
    for entry in ENTRY_POINTS:
        assert entry in MODULES, f"{entry} is no module: its public name is gone"


def test_no_package_cycles():
    arrows = package_graph()
    groups = package_cycles(arrows)
    said = [
        " <-> ".join(g)
        + ": "
        + "; ".join(
            f"{a} -> {b} ({', '.join(sorted(why))})"
            for (a, b), why in sorted(arrows.items())
            if a in g and b in g
        )
        for g in groups
    ]
    assert not groups, "hub packages that need each other:\n" + "\n".join(said)


def test_no_arrow_runs_back_up():
    wrong = back_arrows(package_graph())
    assert not wrong, "imports from a lower layer to a higher one:\n" + "\n".join(wrong)


def test_the_layer_checks_find_what_they_look_for():
    lower, upper = "projects", "workflows"
    arrows = {(lower, upper): {"gpulab_hub.projects.x -> gpulab_hub.workflows.y"}}
    assert back_arrows(arrows) == [
        "projects (foundation) -> workflows (workflows): "
        "gpulab_hub.projects.x -> gpulab_hub.workflows.y"
    ]
    assert back_arrows({(upper, lower): {"w -> p"}}) == []
    cyc = {("a", "b"): set(), ("b", "c"): set(), ("c", "a"): set(), ("c", "d"): set()}
    assert package_cycles(cyc) == [["a", "b", "c"]]
    assert node_of("gpulab_hub.cluster.spawner") == "cluster.spawner"
    assert node_of("gpulab_hub.cluster.jobs") == "cluster"
    assert layer_of("cluster.spawner") == layer_of("spawner") == 3

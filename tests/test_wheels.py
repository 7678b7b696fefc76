"""The three distributions install as wheels, not only editable: what
images/hub.Dockerfile (``pip install ./contract ./spawner``) and the base images
(the contract's wheel and the user side's) do.

The wheels are built as pip builds them there (``pip wheel --no-deps``, each in its own
build environment) and installed with ``--no-deps --no-index`` into a fresh virtual
environment that sees the test environment's packages only as a plain folder at the end
of ``sys.path`` (so the test environment's editable gpulab installs are not loaded).
Then every module of the three distributions must import *from the wheel*, every source
file and page template must be in it, and every template the code names must be there.
The hub's wheel with the contract's alone (no user side) imports every hub module too:
the hub does not need gpulab_jupyter.
"""

from __future__ import annotations

import ast
import json
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "gpulab_contract": ROOT / "contract" / "gpulab_contract",
    "gpulab_hub": ROOT / "spawner" / "gpulab_hub",
    "gpulab_jupyter": ROOT / "extensions" / "gpulab_jupyter",
}
SKIP_DIRS = {"__pycache__", "labextension", "node_modules"}


def _pip_wheel(src: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("wheels")
    # setuptools writes build/ and *.egg-info next to the sources: build from a copy
    spawner = tmp / "spawner-src"
    shutil.copytree(
        ROOT / "spawner",
        spawner,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc"),
    )
    with ThreadPoolExecutor(3) as pool:
        hub = pool.submit(_pip_wheel, spawner, tmp / "hub")
        lab = pool.submit(_pip_wheel, ROOT / "extensions", tmp / "lab")
        contract = pool.submit(_pip_wheel, ROOT / "contract", tmp / "contract")
        return {
            "gpulab_contract": contract.result(),
            "gpulab_hub": hub.result(),
            "gpulab_jupyter": lab.result(),
        }


def _venv_with(wheels: list[Path], where: Path) -> Path:
    """A fresh virtual environment with these wheels: its python."""
    env = where / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The dependencies (jupyterhub, docker, ...) from this test environment, as a plain
    # path entry: appended after the new environment's own site-packages, and its .pth
    # files (the editable gpulab installs) are not run.
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "zz-test-deps.pth").write_text("\n".join(deps) + "\n")
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    cmd += ["--no-deps", "--no-index", *map(str, wheels)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.fixture(scope="module")
def installed(wheels, tmp_path_factory) -> Path:
    """A fresh virtual environment with the three wheels: its python."""
    return _venv_with(list(wheels.values()), tmp_path_factory.mktemp("venv"))


def _source_files(top: str) -> set[str]:
    """Package-relative paths of every .py file and page template in the source tree."""
    src = SOURCES[top]
    out = set()
    for path in src.rglob("*"):
        if set(path.relative_to(src).parts) & SKIP_DIRS or not path.is_file():
            continue
        if path.suffix == ".py" or path.parent.name == "templates":
            out.add(f"{top}/{path.relative_to(src).as_posix()}")
    return out


# Alembic's scripts (gpulab_hub/db/migrations/): in the wheel, but loaded by Alembic from
# their files, never imported as modules of the package.
SCRIPTS = ("gpulab_hub/db/migrations/",)


def _module_count(top: str) -> int:
    """How many modules of ``top`` an import walk finds: its .py files save Alembic's."""
    return sum(1 for f in _source_files(top) if f.endswith(".py") and not f.startswith(SCRIPTS))


def _wheel_files(wheel: Path, top: str) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    return {n for n in names if n.startswith(top + "/") and "/labextension/" not in n}


@pytest.mark.parametrize("top", sorted(SOURCES))
def test_every_source_file_and_template_is_in_the_wheel(wheels, top):
    in_wheel = _wheel_files(wheels[top], top)
    missing = sorted(_source_files(top) - in_wheel)
    assert not missing, f"left out of the {top} wheel: {missing}"
    assert f"{top}/__init__.py" in in_wheel


def _named_templates(top: str) -> set[str]:
    """Every ``*.html`` file name the code of package ``top`` names as a string."""
    names = set()
    for path in SOURCES[top].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value
                if value.endswith(".html") and "/" not in value and " " not in value:
                    names.add(value)
    return names


INSTALLED_CHECK = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    from importlib import metadata
    from pathlib import Path

    prefix = Path(sys.prefix).resolve()
    report = {"modules": {}, "failed": {}, "templates": {}, "scripts": {}}
    for top in sys.argv[1].split(","):
        pkg = importlib.import_module(top)
        names = [top] + [m.name for m in pkgutil.walk_packages(pkg.__path__, top + ".")]
        for name in names:
            try:
                mod = importlib.import_module(name)
            except Exception as e:  # reported whole, so a failure names its module
                report["failed"][name] = f"{type(e).__name__}: {e}"
                continue
            report["modules"][name] = str(Path(mod.__file__).resolve())
            folder = getattr(mod, "TEMPLATES", None)
            if isinstance(folder, Path):
                report["templates"][name] = sorted(p.name for p in folder.glob("*.html"))
    for dist in sys.argv[2].split(","):
        for ep in metadata.distribution(dist).entry_points:
            if ep.group == "console_scripts":
                report["scripts"][ep.name] = [ep.value, (prefix / "bin" / ep.name).is_file()]
                try:
                    ep.load()
                except Exception as e:
                    report["failed"][ep.name] = f"{type(e).__name__}: {e}"
    report["prefix"] = str(prefix)
    lab = prefix / "share/jupyter/labextensions/gpulab-jupyter"
    report["labextension"] = (lab / "package.json").is_file()
    print(json.dumps(report))
    """
)


def _report(python: Path, tops, dists) -> dict:
    done = subprocess.run(
        [str(python), "-c", INSTALLED_CHECK, ",".join(tops), ",".join(dists)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=python.parent,  # not the checkout: nothing imported from the sources
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def report(installed) -> dict:
    dists = ("gpulab-contract", "gpulab-hub", "gpulab-jupyter")
    return _report(installed, sorted(SOURCES), dists)


def test_the_hub_and_the_contract_alone_import_without_the_user_side(wheels, tmp_path):
    """What the hub image installs (``./contract ./spawner``): every hub module imports
    from those two wheels, and the user side is nowhere to be found."""
    hub_only = [wheels["gpulab_contract"], wheels["gpulab_hub"]]
    python = _venv_with(hub_only, tmp_path)
    report = _report(python, ["gpulab_contract", "gpulab_hub"], ["gpulab-hub"])
    assert report["failed"] == {}
    assert all(path.startswith(report["prefix"]) for path in report["modules"].values())
    for top in ("gpulab_contract", "gpulab_hub"):
        count = sum(1 for n in report["modules"] if n == top or n.startswith(top + "."))
        assert count == _module_count(top), top
    absent = subprocess.run(
        [str(python), "-c", "import gpulab_jupyter"], capture_output=True, text=True
    )
    assert "No module named 'gpulab_jupyter'" in absent.stderr


def test_every_module_imports_from_the_installed_wheels(report):
    assert report["failed"] == {}
    prefix = report["prefix"]
    outside = {n: path for n, path in report["modules"].items() if not path.startswith(prefix)}
    assert outside == {}, "imported from outside the wheels' environment"
    # as many modules as the source tree has .py files (packages and modules)
    for top in SOURCES:
        count = sum(1 for n in report["modules"] if n == top or n.startswith(top + "."))
        assert count == _module_count(top), top
    assert "gpulab_hub.home.web" in report["modules"]  # the one the package list once left out


def test_every_template_the_code_names_is_installed(report):
    installed = {name for names in report["templates"].values() for name in names}
    # pages the hub takes from JupyterHub itself (gpulab overrides only some)
    jupyterhub = Path(sysconfig.get_paths()["data"], "share", "jupyterhub", "templates")
    theirs = {p.name for p in jupyterhub.glob("*.html")}
    for top in SOURCES:
        missing = sorted(_named_templates(top) - installed - theirs)
        assert not missing, f"{top} names templates its wheel does not install: {missing}"
    assert "home.html" in report["templates"]["gpulab_hub.home"]
    assert "gpulab-share.html" in report["templates"]["gpulab_hub.sharing"]


def test_console_scripts_and_lab_extension_are_installed(report):
    scripts = report["scripts"]
    assert set(scripts) >= {"gpulab", "gpulab-build-runtime", "gpulab-job"}
    assert all(present for _, present in scripts.values()), scripts
    assert report["labextension"]

"""Helpers of the magics tests: tiny packages, a local wheelhouse, a throwaway
environment, and a real IPython kernel running in it.

Test packages are built by a PEP 517 backend of their own (below), so pip
builds them offline, in build isolation, with nothing to download.
"""

from __future__ import annotations

import io
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import time
from pathlib import Path

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "images" / "project.Dockerfile.j2"

BACKEND = textwrap.dedent(
    '''
    """A minimal PEP 517 backend for gpulab's tests: pkg.json says what to build."""
    import base64, hashlib, json, os, shutil, subprocess, sys, tarfile, zipfile

    HERE = os.path.dirname(os.path.abspath(__file__))
    CFG = json.load(open(os.path.join(HERE, "pkg.json")))

    def _hash(data):
        d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"sha256={d},{len(data)}"

    def get_requires_for_build_wheel(config_settings=None):
        return []

    def get_requires_for_build_sdist(config_settings=None):
        return []

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        for line in CFG.get("say", []):  # what a build prints (colours, progress)
            print(line, flush=True)
        if CFG.get("fail"):
            sys.exit(1)
        if CFG.get("compile"):
            src = os.path.join(HERE, CFG["compile"])
            cmd = ["cc", "-c", src, "-o", os.path.join(wheel_directory, "x.o")]
            print("compiling", CFG["compile"], flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            sys.stdout.write(done.stdout + done.stderr)
            if done.returncode != 0:
                sys.exit(done.returncode)
        name, version = CFG["name"], CFG["version"]
        dist = name.replace("-", "_")
        info = f"{dist}-{version}.dist-info"
        files = {k: v.encode() for k, v in CFG.get("files", {}).items()}
        for target, source in CFG.get("copy", {}).items():
            files[target] = open(os.path.join(HERE, source), "rb").read()
        meta = f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n"
        meta += "".join(f"Requires-Dist: {r}\\n" for r in CFG.get("requires", []))
        files[f"{info}/METADATA"] = meta.encode()
        tag = CFG.get("tag", "py3-none-any")
        files[f"{info}/WHEEL"] = (
            f"Wheel-Version: 1.0\\nGenerator: gpulab-tests\\n"
            f"Root-Is-Purelib: {'true' if tag == 'py3-none-any' else 'false'}\\nTag: {tag}\\n"
        ).encode()
        record = [f"{path},{_hash(data)}" for path, data in files.items()]
        files[f"{info}/RECORD"] = ("\\n".join(record + [f"{info}/RECORD,,"]) + "\\n").encode()
        wheel = f"{dist}-{version}-{tag}.whl"
        with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
            for path, data in files.items():
                z.writestr(path, data)
        return wheel
    '''
)


def make_package(root: Path, name: str, version: str, files: dict[str, str], **cfg) -> Path:
    """A source tree of a package built by BACKEND (cfg: requires, compile, copy, tag,
    say: lines its build prints, fail: the build fails after saying them)."""
    src = root / f"{name}-{version}"
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "gpulab_test_backend"\n'
        'backend-path = ["."]\n'
    )
    (src / "gpulab_test_backend.py").write_text(BACKEND)
    (src / "pkg.json").write_text(json.dumps({"name": name, "version": version,
                                               "files": files, **cfg}))  # fmt: skip
    (src / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return src


def pip_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # not this machine's indexes and constraints
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def build_wheels(sources: list[Path], wheelhouse: Path) -> None:
    """``pip wheel`` of test packages into the wheelhouse (one pip run per version of a name)."""
    batches: list[dict[str, Path]] = []
    for src in sources:
        name = json.loads((src / "pkg.json").read_text())["name"]
        batch = next((b for b in batches if name not in b), None)
        if batch is None:
            batches.append(batch := {})
        batch[name] = src
    for batch in batches:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "-q", "-w"]
        cmd += [str(wheelhouse), *map(str, batch.values())]
        done = subprocess.run(cmd, env=pip_env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def backend_wheels(sources: list[Path], wheelhouse: Path) -> None:
    """The wheels build_wheels makes, made by calling each package's own backend here
    (BACKEND's build_wheel, as pip calls it), without a pip run and build environment
    per package: for tests where installing them is the point, not building them."""
    import importlib.util

    for n, src in enumerate(sources):
        spec = importlib.util.spec_from_file_location(
            f"gpulab_test_backend_{n}", src / "gpulab_test_backend.py"
        )
        backend = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(backend)
        backend.build_wheel(str(wheelhouse))


def build_wheel(src: Path, wheelhouse: Path) -> Path:
    build_wheels([src], wheelhouse)
    cfg = json.loads((src / "pkg.json").read_text())
    name, version = cfg["name"].replace("-", "_"), cfg["version"]
    return next(wheelhouse.glob(f"{name}-{version}-*.whl"))


def build_sdist(src: Path, wheelhouse: Path) -> Path:
    """An sdist (name-version.tar.gz holding the source tree) in the wheelhouse."""
    out = wheelhouse / f"{src.name.replace('-', '_', src.name.count('-') - 1)}.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src, arcname=out.name.removesuffix(".tar.gz"))
    out.write_bytes(buf.getvalue())
    return out


def make_venv(path: Path) -> Path:
    """A throwaway environment (its own pip) that also sees the test runner's packages
    (IPython, ipykernel, gpulab_jupyter) after its own. Returns its python."""
    made = subprocess.run([sys.executable, "-m", "venv", str(path)], capture_output=True)
    if made.returncode != 0:  # no ensurepip (Debian without python3-venv): the runner's pip
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site_dir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    parents = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    parents += site.getsitepackages() + [site.getusersitepackages()]
    parents = [p for n, p in enumerate(parents) if p not in parents[:n] and os.path.isdir(p)]
    Path(site_dir, "_gpulab_test_parent.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in parents) + "\n"
    )
    spec = path / "share" / "jupyter" / "kernels" / "gpulabtest"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gpulab test", "language": "python",
    }))  # fmt: skip
    return python


def autoload_like_the_image(venv: Path) -> str:
    """Write the IPython config that the base image template writes (so kernels of
    this environment load the magics by themselves); returns its content."""
    template = (REPO / "images" / "_base.Dockerfile.j2").read_text()
    m = re.search(r'echo "(c\.InteractiveShellApp[^"]+)" \\\s*> (\S+)', template)
    assert m, "the base template no longer enables the magics"
    content, target = m.group(1), Path(m.group(2))
    assert target.as_posix() == "/opt/gpulab/venv/etc/ipython/ipython_kernel_config.py"
    path = venv / target.relative_to("/opt/gpulab/venv")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content + "\n")
    return content


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def new_dockerfile(project: Path) -> bytes:
    from gpulab_hub import images  # the template as the spawner renders it

    text = images.render(
        TEMPLATE.parent, TEMPLATE.name, display_name="test", base_image="gpulab/base:latest"
    )
    text += "RUN echo 'a user line' \\\n    && true\n# a user comment\n"
    (project / "Dockerfile").write_text(text)
    return text.encode()


class Kernel:
    """A real IPython kernel (ipykernel, its own process) in a throwaway environment."""

    def __init__(self, venv: Path, env: dict):
        ksm = KernelSpecManager(kernel_dirs=[str(venv / "share" / "jupyter" / "kernels")])
        self.km = KernelManager(kernel_name="gpulabtest", kernel_spec_manager=ksm)
        self.km.start_kernel(env=env, cwd=env.get("GPULAB_PROJECT_DIR"))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 300) -> dict:
        """Execute; return {"stdout", "stderr", "status", "error", "seconds", "displays"}."""
        out = {"stdout": "", "stderr": "", "error": None, "displays": 0}

        def hook(msg):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
            elif kind == "error":
                out["error"] = f"{content['ename']}: {content['evalue']}"
            elif kind == "display_data":
                out["displays"] += 1

        start = time.monotonic()
        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        out["seconds"] = time.monotonic() - start
        out["status"] = reply["content"]["status"]
        return out

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def run_notebook(venv: Path, env: dict, cells: list[str], timeout: float = 300):
    """A new notebook of these code cells, run by nbclient in a fresh kernel of ``venv``:
    its outputs are built from the kernel's messages as a notebook frontend builds them
    (display updates replace the output they name). Returns the notebook (nbformat)."""
    import nbformat
    from jupyter_client import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code) for code in cells]
    ksm = KernelSpecManager(kernel_dirs=[str(venv / "share" / "jupyter" / "kernels")])
    km = AsyncKernelManager(kernel_name="gpulabtest", kernel_spec_manager=ksm)
    client = NotebookClient(nb, km=km, timeout=timeout, allow_errors=True)
    try:
        client.execute(env=env, cwd=env.get("GPULAB_PROJECT_DIR"))
    finally:
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)
    return nb

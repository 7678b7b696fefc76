"""%gpu_install against %pip install of the same pure-Python package, side by side.

Both run in one real IPython kernel (a throwaway environment, a local wheelhouse
built here, no network), alternating, each followed by an uninstall. The time is
the magic's own, measured inside the kernel. Goal: %gpu_install (install + fresh
interpreter import check + Dockerfile write) within 1.5x of %pip install.

    .venv/bin/python benchmarks/install.py [--rounds N]

The last line is ``install_ratio=<median %gpu_install / median %pip install>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from magics_kit import (  # noqa: E402
    Kernel,
    autoload_like_the_image,
    build_wheels,
    make_package,
    make_venv,
    new_dockerfile,
    pip_env,
)

PACKAGE = "bench-pure"
MODULES = {f"bench_pure/mod{i}.py": f"def f{i}(x):\n    return x + {i}\n" for i in range(20)}
MODULES["bench_pure/__init__.py"] = "from .mod0 import f0\n"


def timed(kernel: Kernel, magic: str, line: str) -> float:
    code = (
        "import time as _t\n"
        "_s = _t.perf_counter()\n"
        f"get_ipython().run_line_magic({magic!r}, {line!r})\n"
        "print('@@seconds', _t.perf_counter() - _s)\n"
    )
    out = kernel.run(code, timeout=600)
    if out["status"] != "ok":
        raise SystemExit(f"%{magic} {line} failed:\n{out['stdout']}\n{out['stderr']}")
    return float(out["stdout"].rsplit("@@seconds", 1)[1].split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-install-") as tmp:
        root = Path(tmp)
        wheelhouse = root / "wheelhouse"
        wheelhouse.mkdir()
        build_wheels([make_package(root / "src", PACKAGE, "1.0", MODULES)], wheelhouse)
        venv = root / "venv"
        make_venv(venv)
        autoload_like_the_image(venv)
        project = root / "project"
        project.mkdir()
        env = pip_env()
        env.update(GPULAB_PROJECT_DIR=str(project), GPULAB_PROGRESS="text")
        kernel = Kernel(venv, env)
        source = f"--no-index --find-links {wheelhouse} {PACKAGE}==1.0"
        times: dict[str, list[float]] = {"pip": [], "gpu_install": []}
        try:
            timed(kernel, "pip", f"install -q {source}")  # warm caches, not counted
            timed(kernel, "pip", f"uninstall -q -y {PACKAGE}")
            for n in range(args.rounds):
                order = ["pip", "gpu_install"] if n % 2 == 0 else ["gpu_install", "pip"]
                for magic in order:
                    new_dockerfile(project)
                    line = f"install -q {source}" if magic == "pip" else source
                    times[magic].append(timed(kernel, magic, line))
                    timed(kernel, "pip", f"uninstall -q -y {PACKAGE}")
                print(
                    f"round {n + 1}: %pip install {times['pip'][-1]:.2f} s, "
                    f"%gpu_install {times['gpu_install'][-1]:.2f} s",
                    flush=True,
                )
        finally:
            kernel.close()
    pip_s = statistics.median(times["pip"])
    gpu_s = statistics.median(times["gpu_install"])
    print(f"median of {args.rounds}: %pip install {pip_s:.2f} s, %gpu_install {gpu_s:.2f} s")
    print(f"install_ratio={gpu_s / pip_s:.2f}")


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"(benchmark took {time.monotonic() - t0:.0f} s)", file=sys.stderr)

"""Build hook: ask for JupyterLab (its jlpm builds the front end) only when needed.

The wheel that gpulab's base image installs is built with
``pip wheel --no-deps extensions/``; once the front end is built (by the
README's set-up, ``pip install -e ./extensions``), that build needs no Node.js
and no JupyterLab, so it stays fast. A fresh clone has no built front end:
then JupyterLab is added to the build environment and hatch-jupyter-builder
runs ``jlpm install`` and the build. An editable install (the set-up's) also
rebuilds when the sources are newer than the build; a wheel build never does
(``skip-if-exists``): run ``jlpm build:prod`` here after changing the front end.
"""

import sys
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BUILT = Path("gpulab_jupyter/labextension/static/style.js")
SOURCES = ("src", "style", "schema", "package.json")


def front_end_stale(root: Path) -> bool:
    built = root / BUILT
    if not built.exists():
        return True
    paths = [root / s for s in SOURCES]
    paths += [p for d in paths if d.is_dir() for p in d.rglob("*")]
    newest = max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)
    return newest > built.stat().st_mtime


class FrontEndHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def dependencies(self):
        # hatchling asks for build dependencies without saying which build is coming;
        # the PEP 517 hook runner names it in its arguments (get_requires_for_build_*).
        editable = any("editable" in arg for arg in sys.argv[1:2])
        root = Path(self.root)
        needed = front_end_stale(root) if editable else not (root / BUILT).exists()
        return ["jupyterlab>=4.0.0,<5"] if needed else []

    def finalize(self, version, build_data, artifact_path):
        if self.target_name == "wheel" and not (Path(self.root) / BUILT).exists():
            raise RuntimeError(
                f"The JupyterLab extension was not built ({BUILT} is missing): "
                "run `jlpm install && jlpm build:prod` in extensions/ and look at its errors."
            )

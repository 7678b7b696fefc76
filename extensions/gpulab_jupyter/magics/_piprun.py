"""Run pip in this interpreter, keeping what it uninstalls so gpulab can put it back.

``python -m gpulab_jupyter.magics._piprun MANIFEST PIP-ARGS...``

pip replaces a distribution by first moving its files aside (its "stash") and
deleting them once the new version is in place. Here that deletion is
deferred: each stash is written to MANIFEST (one JSON line: the moves
``[original, stashed]`` and the stash folders), and gpulab either moves the
files back (install failed verification) or deletes the stash (success).
"""

from __future__ import annotations

import json
import os
import sys


def keep_uninstalled(manifest: str) -> bool:
    try:
        from pip._internal.req import req_uninstall

    except ImportError:
        return False
    stash_class = getattr(req_uninstall, "StashedUninstallPathSet", None)
    if stash_class is None or not hasattr(stash_class, "commit"):
        return False

    def commit(self) -> None:
        moves = [[a, b] for a, b in getattr(self, "_moves", []) if os.path.lexists(b)]
        dirs = [d.path for d in getattr(self, "_save_dirs", {}).values()]
        with open(manifest, "a") as f:
            f.write(json.dumps({"moves": moves, "dirs": dirs}) + "\n")
        self._moves = []
        self._save_dirs = {}

    stash_class.commit = commit
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    manifest, pip_args = argv[0], argv[1:]
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # as pip's own __main__ does
    if not keep_uninstalled(manifest):
        print("gpulab: this pip cannot defer uninstalls; a failed install may not be fully undone")
    from pip._internal.cli.main import main as pip_main

    return pip_main(pip_args)


if __name__ == "__main__":
    sys.exit(main())

"""%gpu_info and %gpu_install in a real project's kernel where torch imports (CPU torch,
no GPU).

The test hubs' base image carries the CPU torch wheel from this machine's disk
(tests/torch_wheel.py), as a project made from a torch template would: a user who
imports torch and asks %gpu_info sees the torch section and is told plainly that
there is no GPU, not a traceback; %gpu_install keeps the image's own torch: a package
that needs another torch is refused, naming the image's torch, and one that only needs
torch installs beside it.
"""

from __future__ import annotations

import pytest
from hubclient import HubUser

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

PASSWORD = "tori-Passw0rd-long"


@pytest.fixture(scope="module")
def tori(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    admin.new_token()
    user = HubUser(hub.url, "tori", PASSWORD)
    assert user.signup().status_code == 200
    assert admin.authorize("tori").status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    user.start_project("torchinfo")
    yield user
    user.stop_project("torchinfo")


def test_gpu_info_with_torch_imported_shows_torch_and_says_there_is_no_gpu(tori):
    version = tori.execute(
        "torchinfo", "import torch\nprint(torch.__version__, torch.cuda.is_available())"
    )
    assert version.split() == [version.split()[0], "False"] and "+cpu" in version, version

    # Same kernel state as a user's: torch imported, then the magic (execute raises on
    # any error the kernel reports, with its traceback).
    out = tori.execute("torchinfo", "import torch\n%gpu_info", timeout=180)
    assert "Traceback" not in out and "Error" not in out, out
    lines = out.splitlines()
    assert lines[0].startswith("No NVIDIA GPU is visible here: "), out
    torch_version = version.split()[0]
    assert f"torch {torch_version} (CPU only), built for: none" in lines, out
    assert not any(ln.startswith("  runs on GPU") for ln in lines), out


# Tiny wheels, written in the project's kernel: one needs a torch the image does not
# have, one only needs torch, one needs nothing.
WHEELS = """
import pathlib, zipfile
wh = pathlib.Path("/tmp/gpulabfst-wheels")
wh.mkdir(exist_ok=True)
def wheel(name, requires):
    mod = name.replace("-", "_")
    with zipfile.ZipFile(wh / f"{mod}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{mod}.py", "import torch\\n")
        needs = "".join(f"Requires-Dist: {r}\\n" for r in requires)
        z.writestr(f"{mod}-1.0.dist-info/METADATA",
                   f"Metadata-Version: 2.1\\nName: {name}\\nVersion: 1.0\\n" + needs)
        z.writestr(f"{mod}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\\nGenerator: gpulab-tests\\n"
                   "Root-Is-Purelib: true\\nTag: py3-none-any\\n")
        z.writestr(f"{mod}-1.0.dist-info/RECORD", "")
wheel("wants-newer-torch", ["torch>=99"])
wheel("uses-torch", ["torch"])
wheel("plain-extra", [])
print(*sorted(p.name for p in wh.iterdir()))
"""


def install(tori, line: str) -> str:
    """%gpu_install in the project's kernel; what it printed, and how it ended."""
    code = (
        "try:\n"
        f"    get_ipython().run_line_magic('gpu_install', {line!r})\n"
        "    print('ENDED: ok')\n"
        "except BaseException as e:\n"
        "    print('ENDED:', type(e).__name__)\n"
    )
    return tori.execute("torchinfo", code, timeout=300)


def test_gpu_install_keeps_the_images_real_torch_and_says_what_would_replace_it(tori):
    version = tori.execute("torchinfo", "import torch\nprint(torch.__version__)").strip()
    assert version.endswith("+cpu"), version
    assert "wants_newer_torch-1.0-py3-none-any.whl" in tori.execute("torchinfo", WHEELS)
    dockerfile = tori.execute("torchinfo", "print(open('/workspace/Dockerfile').read())")

    out = install(tori, "--no-index --find-links /tmp/gpulabfst-wheels wants-newer-torch")
    assert f"Refused: this install would replace the image's torch stack (torch=={version})" in (
        out
    ), out
    assert "wants-newer-torch 1.0 depends on torch>=99" in out, out
    assert "--allow-torch-change" in out, out
    assert "ENDED: ok" not in out, out
    after = tori.execute(
        "torchinfo",
        "import importlib.metadata as m\nprint(m.version('torch'))\n"
        "print(open('/workspace/Dockerfile').read())",
    )
    assert after.startswith(version + "\n"), after  # torch untouched
    assert after.removeprefix(version + "\n") == dockerfile  # nothing recorded

    # a package that only needs torch installs beside the image's torch, which stays
    out = install(tori, "--no-index --find-links /tmp/gpulabfst-wheels uses-torch")
    assert "ENDED: ok" in out and "Refused" not in out, out
    assert (
        tori.execute("torchinfo", "import uses_torch, torch\nprint(torch.__version__)").strip()
        == version
    )


def test_gpu_diff_in_the_container_tells_the_images_torch_from_what_was_added(tori):
    tori.execute("torchinfo", WHEELS)
    tori.execute(
        "torchinfo", "%pip install -q --no-index --find-links /tmp/gpulabfst-wheels plain-extra"
    )
    out = tori.execute("torchinfo", "%gpu_diff")
    added, _, record = out.partition("Record them with:")
    # "since" the container started (read from its first process), not since the epoch
    assert "Installed in this environment since " in added, out
    names = [ln.split()[0] for ln in added.splitlines() if ln.startswith("    ")]
    assert "plain-extra" in names, out
    assert "torch" not in names, out  # the image's own, from its build
    assert "plain-extra==1.0" in record and "torch==" not in record, out


JOB = (
    "import os, torch\n"
    "x = torch.ones(64, 64)\n"
    "print('precision', os.environ.get('GPULAB_PRECISION'), 'torch', torch.__version__,\n"
    "      'sum', float((x @ x).sum()))\n"
)


def test_gpu_job_runs_a_torch_script_at_auto_precision_on_the_cpu(tori):
    version = tori.execute("torchinfo", "import torch\nprint(torch.__version__)").strip()
    tori.execute("torchinfo", f"open('/workspace/torchjob.py', 'w').write({JOB!r})")
    out = tori.execute(
        "torchinfo", "%gpu_job run --follow --precision auto torchjob.py", timeout=300
    )
    assert f"precision fp32 torch {version} sum {64.0 * 64 * 64}" in out, out
    assert "succeeded" in out, out

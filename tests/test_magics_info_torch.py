"""%gpu_info in a real project's kernel where torch imports (CPU torch, no GPU).

The test hubs' base image carries the CPU torch wheel from this machine's disk
(tests/torch_wheel.py), as a project made from a torch template would: a user who
imports torch and asks %gpu_info sees the torch section and is told plainly that
there is no GPU, not a traceback.
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

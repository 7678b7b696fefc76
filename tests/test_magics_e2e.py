"""End to end: %gpu_install in a spawned project container writes the project's
Dockerfile on the host, and the image rebuilt at the next start has the package.

The package comes from PyPI (project containers and image builds reach it); it is
a tiny pure-Python one, pinned.
"""

from __future__ import annotations

import pytest
from hubclient import HubUser

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

PACKAGE, VERSION, MODULE = "iniconfig", "2.0.0", "iniconfig"
LINE = (
    f"RUN python -m pip install --no-cache-dir {PACKAGE}=={VERSION} && python -c 'import {MODULE}'"
)


@pytest.fixture(scope="module")
def mona(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    admin.new_token()
    user = HubUser(hub.url, "mona", "mona-Passw0rd-long")
    assert user.signup().status_code == 200
    assert admin.authorize("mona").status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def container_id(docker_engine, name: str) -> str:
    found = docker_engine.call("containers", filters={"name": name})
    assert len(found) == 1, found
    return found[0]["Id"]


def test_gpu_install_in_a_container_is_rebuilt_into_the_image(hub, mona, docker_engine):
    from conftest import PREFIX

    project = hub.home / "projects" / "mona" / "magic"
    mona.start_project("magic")
    first = container_id(docker_engine, f"{PREFIX}-mona--magic")
    before = (project / "Dockerfile").read_text()

    # The magics are loaded by the image's IPython config: no %load_ext here.
    absent = mona.execute(
        "magic", f"import importlib.util; print(importlib.util.find_spec('{MODULE}'))"
    )
    assert absent.strip() == "None"
    out = mona.execute("magic", f"%gpu_install {PACKAGE}=={VERSION}", timeout=300)
    assert f"✔ {PACKAGE} {VERSION}: installed, verified and written to the Dockerfile" in out, out

    after = (project / "Dockerfile").read_text()
    assert [ln for ln in after.splitlines() if ln not in before.splitlines()] == [LINE]
    logs = list((project / ".gpulab" / "logs").glob(f"gpu_install-*-{PACKAGE}.log"))
    assert logs, "the install log is kept in the project"

    diff = mona.execute("magic", "%gpu_diff")
    assert "Everything installed here is in the Dockerfile." in diff, diff
    info = mona.execute("magic", "%gpu_info")
    assert "No NVIDIA GPU is visible here" in info or "compute capability" in info

    mona.stop_project("magic")
    mona.start_project("magic")  # a new Dockerfile: the image is rebuilt
    assert container_id(docker_engine, f"{PREFIX}-mona--magic") != first
    out = mona.execute(
        "magic",
        f"import {MODULE}, importlib.metadata as m; print(m.version('{PACKAGE}'), "
        f"{MODULE}.__file__)",
    )
    version, path = out.split()
    assert version == VERSION
    assert path.startswith("/opt/gpulab/venv/")
    # Installed by the image build (before this container started): nothing to record.
    assert "Everything installed here is in the Dockerfile." in mona.execute("magic", "%gpu_diff")
    mona.stop_project("magic")

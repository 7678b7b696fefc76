"""The hub shows the last `gpulab doctor` report to admins at /hub/gpulab/doctor."""

from __future__ import annotations

import json
import subprocess

import pytest
import requests
from conftest import GPULAB
from hubclient import HubUser

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]


@pytest.fixture(scope="module")
def admin(hub):
    a = HubUser(hub.url, "admin", hub.admin_password)
    assert a.login().status_code == 302
    return a


@pytest.fixture(scope="module")
def carol(hub, admin):
    """A signed-up, approved user who is not an admin."""
    user = HubUser(hub.url, "carol", "carol-Passw0rd-long")
    assert user.signup().status_code == 200
    assert admin.authorize("carol").status_code == 200
    assert user.login().status_code == 302
    return user


def page(user: HubUser) -> requests.Response:
    return user.http.get(f"{user.base}/hub/gpulab/doctor", allow_redirects=False, timeout=10)


def test_before_any_report_the_page_says_how_to_make_one(hub, admin):
    (hub.home / "hub" / "doctor-last.json").unlink(missing_ok=True)
    r = page(admin)
    assert r.status_code == 200
    assert "No report yet" in r.text and "gpulab doctor" in r.text


def test_admin_sees_the_last_report(hub, admin):
    done = subprocess.run(
        [GPULAB, "doctor", "--json"], env=hub.env, capture_output=True, text=True, timeout=120
    )
    items = json.loads(done.stdout)
    r = page(admin)
    assert r.status_code == 200
    for item in items:
        assert f'data-id="{item["id"]}"' in r.text
    driver = next(i for i in items if "driver" in i["id"])
    assert f'finding-{driver["status"]}" data-id="{driver["id"]}"' in r.text
    assert f"exit code {done.returncode}" in r.text
    # Linked from the hub's navigation bar, next to Admin.
    home = admin.http.get(f"{hub.url}/hub/home", timeout=10)
    assert 'href="/hub/gpulab/doctor">Doctor</a>' in home.text


def test_others_are_refused(hub, carol):
    r = page(carol)
    assert r.status_code == 403
    assert "host.driver" not in r.text
    assert "/hub/gpulab/doctor" not in carol.http.get(f"{hub.url}/hub/home", timeout=10).text
    anonymous = requests.get(f"{hub.url}/hub/gpulab/doctor", allow_redirects=False, timeout=10)
    assert anonymous.status_code == 302 and "/hub/login" in anonymous.headers["Location"]

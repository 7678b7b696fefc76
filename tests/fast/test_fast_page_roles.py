"""Who may open each of gpulab's hub pages, and what each refused person reads, on the
hub in-process (pagehub.py): anonymous, another user, a viewer and a collaborator of
alice's project, alice (its owner) and an admin without a share. The same table as
tests/security/test_hub_route_matrix.py asks of a running hub, in a second."""

from __future__ import annotations

import pytest
from pages_fixtures import OWNER, PEOPLE, PROJECT

pytest_plugins = ("pages_fixtures",)  # the in-process hub's fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROLES = tuple(PEOPLE)
P = f"{OWNER}/{PROJECT}"
NOT_SHARED = f"No project {P} is shared with you."
ADMINS_USAGE = "Only admins may see the GPU usage of everyone."
ADMINS_DOCTOR = "Only admins may see the doctor's report."

# path: the status each role gets, in ROLES' order, and what a refused person reads
# (by status).
PAGES = {
    "/hub/home": ("302 200 200 200 200 200", {}),
    f"/hub/gpulab/share/{P}": (
        "302 404 404 403 200 404",
        {404: NOT_SHARED, 403: f"{OWNER} has not allowed sharing {PROJECT} on."},
    ),
    f"/hub/gpulab/runtime/{P}": ("302 404 404 200 200 404", {404: NOT_SHARED}),
    f"/hub/gpulab/build-log/{P}": ("302 404 404 200 200 404", {404: NOT_SHARED}),
    f"/hub/gpulab/rename/{PROJECT}": (
        "302 404 404 404 200 404",
        {404: f"You have no project named '{PROJECT}'."},
    ),
    f"/hub/spawn/{P}": ("302 404 404 404 200 200", {}),
    "/hub/gpulab/shared": ("302 200 200 200 200 200", {}),
    "/hub/gpulab/ssh": ("302 200 200 200 200 200", {}),
    "/hub/gpulab/secrets": ("302 200 200 200 200 200", {}),
    "/hub/gpulab/usage": ("302 403 403 403 403 200", {403: ADMINS_USAGE}),
    "/hub/gpulab/usage.csv": ("302 403 403 403 403 200", {403: ADMINS_USAGE}),
    "/hub/gpulab/doctor": ("302 403 403 403 403 200", {403: ADMINS_DOCTOR}),
    "/hub/gpulab/admin": ("302 403 403 403 403 200", {403: "Only admins may see the admin"}),
}


@pytest.mark.parametrize("path", PAGES)
async def test_each_role_gets_what_the_route_table_says(shared_pages, path):
    expected, refused_words = PAGES[path]
    got = {}
    for role in ROLES:
        page = await shared_pages.get(path, PEOPLE[role])
        got[role] = page.code
        if page.code == 302:
            assert page.location.startswith("/hub/login?next="), (role, page.location)
        if page.code in refused_words:
            assert refused_words[page.code] in page.text, (role, page.text[:400])
        if page.code == 200 and path != "/hub/gpulab/usage.csv":
            # the nav bar of a logged-in page names the person and, for admins only,
            # the admin pages
            assert PEOPLE[role] in page.text
            assert ("GPU usage" in page.text and "Doctor" in page.text) == (role == "admin")
    assert " ".join(str(got[r]) for r in ROLES) == expected, got


async def test_the_usage_export_is_a_csv_for_admins(shared_pages):
    page = await shared_pages.get("/hub/gpulab/usage.csv", "admin")
    assert page.code == 200
    assert page.headers["Content-Type"].startswith("text/csv")
    assert page.body.splitlines()[0] == ("user,project,gpu,gpu_uuid,from,to,gpu_hours,avg_util")

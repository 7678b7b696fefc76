"""What a person reads on each of gpulab's hub pages, by who they are, on the hub
in-process (pagehub.py): the home page, the Share page, the runtime page, the usage
page, the doctor page, the build log and rename pages (the SSH keys and secrets pages:
test_fast_page_forms.py). A template change shows here in seconds."""

from __future__ import annotations

import pytest
from pages_fixtures import OWNER, PEOPLE, PROJECT, TITLE

pytest_plugins = ("pages_fixtures",)  # the in-process hub's fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

VIEWER, COLLAB, OTHER = PEOPLE["viewer"], PEOPLE["collaborator"], PEOPLE["other"]


async def test_the_home_page_lists_the_owners_project_and_what_others_share(shared_pages):
    mine = (await shared_pages.get("/hub/home", OWNER)).text
    assert "You have 1 of at most 10 projects." in mine
    row = f"{TITLE} {PROJECT} stopped none not built yet Start Change runtime Share Rename Delete"
    assert row in mine
    assert "Stop a project to rename or delete it." in mine
    assert "Nothing yet. When someone shares a project with you, it appears here." in mine

    viewer = (await shared_pages.get("/hub/home", VIEWER)).text
    assert "You have no project yet: name one above to create it." in viewer
    assert f"{PROJECT} {OWNER} viewer stopped not running: ask {OWNER} to start it" in viewer

    collab = (await shared_pages.get("/hub/home", COLLAB)).text
    assert f"{PROJECT} {OWNER} collaborator stopped" in collab

    other = (await shared_pages.get("/hub/home", OTHER)).text
    assert TITLE not in other and f" {OWNER} " not in other
    assert "Nothing yet. When someone shares a project with you, it appears here." in other


async def test_the_home_page_says_only_its_own_words_from_the_address(shared_pages):
    said = (await shared_pages.get("/hub/home?notice=no-default", OWNER)).text
    assert "That address is for a default project, which gpulab does not have" in said
    said = (await shared_pages.get("/hub/home?missing=ghost", OWNER)).text
    assert "You have no project named \u201cghost\u201d (was it renamed or deleted?)." in said
    # words of the address that are not gpulab's keys or names are never shown
    said = await shared_pages.get("/hub/home?notice=%3Cb%3Ehi&missing=%3Cb%3Ehi", OWNER)
    assert "<b>hi" not in said.body and "hi" not in said.text.split()
    said = (await shared_pages.get(f"/hub/home?deleted={PROJECT}", OWNER)).text
    assert "Deleted the project" not in said  # it exists: nothing was deleted


async def test_the_default_servers_addresses_lead_home_with_a_word(shared_pages):
    for path in ("/hub/spawn", f"/hub/spawn/{OWNER}", f"/hub/user/{OWNER}/"):
        page = await shared_pages.get(path, OWNER)
        assert page.code in (302, 303), (path, page.code)
        assert page.location == "/hub/home?notice=no-default", path
    page = await shared_pages.get(f"/hub/user/{OWNER}/ghost/lab", OWNER)
    assert page.location == "/hub/home?missing=ghost"


async def test_the_share_page_tells_the_owner_who_has_access_and_in_which_role(shared_pages):
    page = await shared_pages.get(f"/hub/gpulab/share/{OWNER}/{PROJECT}", OWNER)
    assert page.code == 200
    text = page.text
    assert f"Share {TITLE}" in text
    assert f"{OWNER} (owner) owner" in text
    assert f"user {VIEWER} viewer since" in text and f"user {COLLAB} collaborator since" in text
    assert text.count("Revoke") >= 2
    assert "Viewers may open and read notebooks and files" in text
    assert "cannot run code, open terminals or change anything" in text


async def test_the_runtime_page_offers_cpu_only_on_a_machine_without_gpus(shared_pages):
    text = (await shared_pages.get(f"/hub/gpulab/runtime/{OWNER}/{PROJECT}", OWNER)).text
    assert f"Change runtime type {TITLE}" in text
    assert "Runs on: CPU only (stopped; its next start)" in text
    assert "Only CPU is offered: this computer has no GPU." in text
    assert "Save" in text
    # a collaborator the owner has not let start the project reads why they cannot
    text = (await shared_pages.get(f"/hub/gpulab/runtime/{OWNER}/{PROJECT}", COLLAB)).text
    assert f"Change runtime type {TITLE} ({OWNER}'s project)" in text
    assert "Runs on: CPU only (stopped; its next start)" in text
    assert (
        f"Only {OWNER} may change this project's runtime (they have not allowed "
        "collaborators to start it)." in text
    )
    assert "Save" not in text


async def test_the_usage_page_shows_the_admin_each_ended_holding(shared_pages):
    text = (await shared_pages.get("/hub/gpulab/usage", "admin")).text
    assert "No GPU was held over the last 7 days." in text
    assert "0.0 h in all" in text


async def test_the_doctor_page_says_how_to_get_a_report_then_shows_it(shared_pages):
    text = (await shared_pages.get("/hub/gpulab/doctor", "admin")).text
    assert "No report yet. Run gpulab doctor on the hub's machine" in text


async def test_the_build_log_and_rename_pages_speak_of_the_project(shared_pages):
    for who in (OWNER, COLLAB):
        text = (await shared_pages.get(f"/hub/gpulab/build-log/{OWNER}/{PROJECT}", who)).text
        assert f"Project {PROJECT} has no build log yet" in text
    text = (await shared_pages.get(f"/hub/gpulab/rename/{PROJECT}", OWNER)).text
    assert f"Rename {PROJECT}" in text
    assert f"Left empty: it stays \u201c{TITLE}\u201d" in text

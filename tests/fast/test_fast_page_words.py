"""What a person reads on each of gpulab's hub pages, by who they are, on the hub
in-process (pagehub.py): the home page, the Share page, the runtime page, the SSH keys
page, the secrets page, the usage page, the doctor page, the build log and rename pages.
A template change shows here in seconds."""

from __future__ import annotations

from conftest import OWNER, PEOPLE, PROJECT, TITLE

VIEWER, COLLAB, OTHER = PEOPLE["viewer"], PEOPLE["collaborator"], PEOPLE["other"]


async def _project(pages):
    await pages.project(OWNER, PROJECT, TITLE)
    await pages.share(OWNER, PROJECT, VIEWER, "viewer")
    await pages.share(OWNER, PROJECT, COLLAB, "collaborator")


async def test_the_home_page_lists_the_owners_project_and_what_others_share(pages):
    await _project(pages)
    mine = (await pages.get("/hub/home", OWNER)).text
    assert "You have 1 of at most 10 projects." in mine
    row = f"{TITLE} {PROJECT} stopped none not built yet Start Change runtime Share Rename Delete"
    assert row in mine
    assert "Stop a project to rename or delete it." in mine
    assert "Nothing yet. When someone shares a project with you, it appears here." in mine

    viewer = (await pages.get("/hub/home", VIEWER)).text
    assert "You have no project yet: name one above to create it." in viewer
    assert f"{PROJECT} {OWNER} viewer stopped not running: ask {OWNER} to start it" in viewer

    collab = (await pages.get("/hub/home", COLLAB)).text
    assert f"{PROJECT} {OWNER} collaborator stopped" in collab

    other = (await pages.get("/hub/home", OTHER)).text
    assert TITLE not in other and f" {OWNER} " not in other
    assert "Nothing yet. When someone shares a project with you, it appears here." in other


async def test_the_home_page_says_only_its_own_words_from_the_address(pages):
    await _project(pages)
    said = (await pages.get("/hub/home?notice=no-default", OWNER)).text
    assert "That address is for a default project, which gpulab does not have" in said
    said = (await pages.get("/hub/home?missing=ghost", OWNER)).text
    assert "You have no project named \u201cghost\u201d (was it renamed or deleted?)." in said
    # words of the address that are not gpulab's keys or names are never shown
    said = await pages.get("/hub/home?notice=%3Cb%3Ehi&missing=%3Cb%3Ehi", OWNER)
    assert "<b>hi" not in said.body and "hi" not in said.text.split()
    said = (await pages.get(f"/hub/home?deleted={PROJECT}", OWNER)).text
    assert "Deleted the project" not in said  # it exists: nothing was deleted


async def test_the_default_servers_addresses_lead_home_with_a_word(pages):
    for path in ("/hub/spawn", f"/hub/spawn/{OWNER}", f"/hub/user/{OWNER}/"):
        page = await pages.get(path, OWNER)
        assert page.code in (302, 303), (path, page.code)
        assert page.location == "/hub/home?notice=no-default", path
    page = await pages.get(f"/hub/user/{OWNER}/ghost/lab", OWNER)
    assert page.location == "/hub/home?missing=ghost"


async def test_the_share_page_tells_the_owner_who_has_access_and_in_which_role(pages):
    await _project(pages)
    page = await pages.get(f"/hub/gpulab/share/{OWNER}/{PROJECT}", OWNER)
    assert page.code == 200
    text = page.text
    assert f"Share {TITLE}" in text
    assert f"{OWNER} (owner) owner" in text
    assert f"user {VIEWER} viewer since" in text and f"user {COLLAB} collaborator since" in text
    assert text.count("Revoke") >= 2
    assert "Viewers may open and read notebooks and files" in text
    assert "cannot run code, open terminals or change anything" in text


async def test_the_runtime_page_offers_cpu_only_on_a_machine_without_gpus(pages):
    await _project(pages)
    text = (await pages.get(f"/hub/gpulab/runtime/{OWNER}/{PROJECT}", OWNER)).text
    assert f"Change runtime type {TITLE}" in text
    assert "Runs on: CPU only (stopped; its next start)" in text
    assert "Only CPU is offered: this computer has no GPU." in text
    assert "Save" in text
    # a collaborator the owner has not let start the project reads why they cannot
    text = (await pages.get(f"/hub/gpulab/runtime/{OWNER}/{PROJECT}", COLLAB)).text
    assert f"Change runtime type {TITLE} ({OWNER}'s project)" in text
    assert "Runs on: CPU only (stopped; its next start)" in text
    assert (
        f"Only {OWNER} may change this project's runtime (they have not allowed "
        "collaborators to start it)." in text
    )
    assert "Save" not in text


async def test_the_ssh_page_adds_a_users_key_that_no_one_else_sees(pages):
    text = (await pages.get("/hub/gpulab/ssh", OWNER)).text
    assert "SSH is off on this gpulab: the administrator turned the SSH gateway off" in text
    assert "You have no SSH key here yet" in text
    key = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
        " alice@laptop"
    )
    added = await pages.post_form("/hub/gpulab/ssh", OWNER, {"action": "add", "key": key})
    assert added.code == 200, added.text[:500]
    assert "Added your ssh-ed25519 key (alice@laptop): SHA256:" in added.text
    assert "alice@laptop" in (await pages.get("/hub/gpulab/ssh", OWNER)).text
    theirs = (await pages.get("/hub/gpulab/ssh", OTHER)).text
    assert "alice@laptop" not in theirs and "You have no SSH key here yet" in theirs
    # a private key pasted by mistake is refused in words, and not kept
    private = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
    refused = await pages.post_form("/hub/gpulab/ssh", OTHER, {"action": "add", "key": private})
    assert refused.code == 400
    assert "private" in refused.text.lower()
    assert "You have no SSH key here yet" in (await pages.get("/hub/gpulab/ssh", OTHER)).text


async def test_the_secrets_page_keeps_a_name_and_never_shows_the_value(pages):
    await _project(pages)
    text = (await pages.get("/hub/gpulab/secrets", OWNER)).text
    assert "You have no secrets yet." in text
    assert "Add a secret first, then choose which projects get it." in text
    value = "hf_fastlane_value_never_shown"
    added = await pages.post_form(
        "/hub/gpulab/secrets", OWNER, {"action": "add", "name": "FASTLANE_KEY", "value": value}
    )
    assert added.code == 200, added.text[:500]
    assert "FASTLANE_KEY" in added.text and value not in added.body
    again = await pages.get("/hub/gpulab/secrets", OWNER)
    assert "FASTLANE_KEY" in again.text and value not in again.body
    assert TITLE in again.text or PROJECT in again.text  # choose which projects get it
    theirs = await pages.get("/hub/gpulab/secrets", COLLAB)
    assert "FASTLANE_KEY" not in theirs.text and "You have no secrets yet." in theirs.text
    bad = await pages.post_form(
        "/hub/gpulab/secrets", OWNER, {"action": "add", "name": "not a name", "value": "x"}
    )
    assert bad.code == 400
    assert "Names are capital letters, digits and underscores" in bad.text


async def test_the_usage_page_shows_the_admin_each_ended_holding(pages):
    text = (await pages.get("/hub/gpulab/usage", "admin")).text
    assert "No GPU was held over the last 7 days." in text
    assert "0.0 h in all" in text


async def test_the_doctor_page_says_how_to_get_a_report_then_shows_it(pages):
    text = (await pages.get("/hub/gpulab/doctor", "admin")).text
    assert "No report yet. Run gpulab doctor on the hub's machine" in text


async def test_the_build_log_and_rename_pages_speak_of_the_project(pages):
    await _project(pages)
    for who in (OWNER, COLLAB):
        text = (await pages.get(f"/hub/gpulab/build-log/{OWNER}/{PROJECT}", who)).text
        assert f"Project {PROJECT} has no build log yet" in text
    text = (await pages.get(f"/hub/gpulab/rename/{PROJECT}", OWNER)).text
    assert f"Rename {PROJECT}" in text
    assert f"Left empty: it stays \u201c{TITLE}\u201d" in text

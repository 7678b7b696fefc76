"""The forms of gpulab's hub pages that change a person's own records (their SSH keys,
their secrets), on the hub in-process (pagehub.py): what they read after, and that
nobody else sees it. Each test has a hub of its own."""

from __future__ import annotations

from pages_fixtures import OWNER, PEOPLE, PROJECT, TITLE

pytest_plugins = ("pages_fixtures",)  # the in-process hub's fixtures

COLLAB, OTHER = PEOPLE["collaborator"], PEOPLE["other"]


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
    await pages.project(OWNER, PROJECT, TITLE)
    await pages.share(OWNER, PROJECT, COLLAB, "collaborator")
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

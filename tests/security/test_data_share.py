"""Data follows the share (issue 23, item 4): a collaborator on one project reaches that
project's data, never the owner's other projects' data, cache or login token.

On one real hub with real containers: the owner has project A (not shared) and project
B (shared with a collaborator). In A the owner writes results, fills the Hugging Face
cache and logs in to Hugging Face as huggingface_hub would (the token to HF_TOKEN_PATH,
or $HF_HOME/token where that is not set). The collaborator, running code in B, looks
for all of it everywhere B's container can read, and plants code where A would import
it (the cache's modules folder, the data folders, a sitecustomize); A sees none of it.
"""

from __future__ import annotations

import json
import re

import pytest
from people import execute, log_in_admin, make_user, page_post

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, COLLAB = "dsowner", "dscollab"
A, B = "dsalpha", "dsbeta"
TOKEN = "hf_ownersLoginTokenNeverShared0123456789"
RESULT = "the owner's weeks of training"

OWNER_WRITES_IN_A = f"""
import json, os
open('/data/outputs/result.txt', 'w').write({RESULT!r})
open('/data/models/weights.bin', 'w').write({RESULT!r})
blob = os.path.join(os.environ['HF_HOME'], 'hub', 'models--owner--private', 'blobs')
os.makedirs(blob, exist_ok=True)
open(os.path.join(blob, 'abc'), 'w').write({RESULT!r})
# huggingface-cli login: huggingface_hub writes the token to HF_TOKEN_PATH (else
# $HF_HOME/token) and every stored token to stored_tokens beside it.
path = os.environ.get('HF_TOKEN_PATH') or os.path.join(os.environ['HF_HOME'], 'token')
os.makedirs(os.path.dirname(path), exist_ok=True)
open(path, 'w').write({TOKEN!r})
stored = os.path.join(os.path.dirname(path), 'stored_tokens')
open(stored, 'w').write('[main]\\nhf_token = ' + {TOKEN!r})
mounts = [line.split()[4] for line in open('/proc/self/mountinfo')]
print(json.dumps({{"token_path": path, "hf_home": os.environ['HF_HOME'], "mounts": mounts}}))
"""

# Everything B's container can read where data lives, searched for A's files by name
# and content.
COLLAB_LOOKS_IN_B = f"""
import json, os
found = []
for top in ('/data', '/cache', '/workspace', os.environ['HF_HOME'], '/tmp'):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                text = open(path, errors='replace').read(1 << 20)
            except OSError:
                continue
            if {RESULT!r} in text or {TOKEN!r} in text or name in ('token', 'stored_tokens'):
                found.append(path)
print(json.dumps({{"found": found, "data": sorted(os.listdir('/data'))}}))
"""

PLANTS = (
    "/data/models/sitecustomize.py",
    "/data/outputs/planted.py",
    "/cache/huggingface/modules/transformers_modules/planted.py",
    "/cache/huggingface/hub/models--owner--private/blobs/planted",
)
COLLAB_PLANTS_IN_B = f"""
import json, os
done = []
for path in {list(PLANTS)!r}:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, 'w').write('raise SystemExit("planted by the collaborator")')
    done.append(path)
print(json.dumps(done))
"""

OWNER_LOOKS_IN_A = f"""
import json, os
print(json.dumps({{p: os.path.exists(p) for p in {list(PLANTS)!r}}}))
"""


def last_json(out: str):
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {n: make_user(hub, admin, n) for n in (OWNER, COLLAB)}


@pytest.fixture(scope="module")
def projects(people):
    owner = people[OWNER]
    owner.start_project(A)
    owner.start_project(B)
    r = page_post(owner, B, action="user", name=COLLAB, role="collaborator")
    assert r.status_code == 200 and "as collaborator" in r.text, r.text
    people[COLLAB].new_token()  # a token made after the share carries its scopes
    yield
    owner.stop_project(A)
    owner.stop_project(B)


def in_b(hub, collab, code: str):
    return last_json(execute(hub.url, f"/user/{OWNER}/{B}", collab.token, code, timeout=120))


def test_a_collaborator_on_one_project_reaches_none_of_the_owners_other_projects_data(
    hub, people, projects
):
    owner, collab = people[OWNER], people[COLLAB]
    wrote = last_json(owner.execute(A, OWNER_WRITES_IN_A, timeout=120))
    # The token went to the container's own files: not the cache, no mounted folder.
    token_dir = wrote["token_path"].rsplit("/", 1)[0]
    assert not wrote["token_path"].startswith(wrote["hf_home"] + "/"), wrote
    assert not any(
        token_dir == m or token_dir.startswith(m.rstrip("/") + "/")
        for m in wrote["mounts"]
        if m != "/"
    ), wrote
    # On the host, A's results and cache are A's own folders.
    mine = hub.home / "data" / "projects" / OWNER / A
    assert (mine / "outputs" / "result.txt").read_text() == RESULT
    assert (mine / "huggingface" / "hub" / "models--owner--private" / "blobs" / "abc").exists()

    seen = in_b(hub, collab, COLLAB_LOOKS_IN_B)
    assert seen["found"] == [], seen  # not A's outputs, models, cache, token
    assert seen["data"] == ["datasets", "models", "outputs"]  # no other folder of the owner's


def test_a_collaborator_cannot_plant_code_that_the_owners_other_project_runs(hub, people, projects):
    owner, collab = people[OWNER], people[COLLAB]
    assert in_b(hub, collab, COLLAB_PLANTS_IN_B) == list(PLANTS)  # B's own folders: allowed
    assert last_json(owner.execute(A, OWNER_LOOKS_IN_A)) == {p: False for p in PLANTS}
    theirs = hub.home / "data" / "projects" / OWNER / B
    assert (theirs / "models" / "sitecustomize.py").exists()  # it went to B's folder only
    assert not (hub.home / "data" / "projects" / OWNER / A / "models" / "sitecustomize.py").exists()


def test_the_share_page_says_what_a_collaborator_reaches(people, projects):
    page = people[OWNER].http.get(f"{people[OWNER].base}/hub/gpulab/share/{B}", timeout=30)
    assert page.status_code == 200
    block = page.text.split('id="share-reach"', 1)[1].split("</p>", 1)[0]
    words = " ".join(re.sub(r"<[^>]+>", " ", block).split())
    for said in (
        "the project folder ( /workspace )",
        "this project's own /data/models , /data/outputs and Hugging Face cache",
        "read-only, /data/datasets",
        "They cannot reach your other projects or their data",
        "nor your secrets, unless you choose them for this project",
    ):
        assert said in words, words

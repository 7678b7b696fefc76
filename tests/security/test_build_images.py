"""A build names only images it may use (docs/security.md), on a real Docker engine.

A project user writes the Dockerfile. With Docker's classic builder, FROM and
COPY --from= take any image the engine holds, by tag, by ID or by a few characters
of its ID (another tenant's project image included), and ADD of a URL is fetched by
the engine itself, on the host's network, so a service listening on the host's
loopback only can be read into an image. Each test performs such an attack through
the check every build goes through (images/policy.py, called as the build path
calls it: the hub's allowed bases, IDs from the engine) and shows it is refused
with the line named and nothing reaches the engine; the same text unchecked shows
the attack is real on this engine. Allowed forms build, pinned to the base's ID.
"""

from __future__ import annotations

import io
import secrets
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import docker.errors
import pytest
from conftest import PREFIX

from gpulab_hub import host, images
from gpulab_hub.images import policy
from gpulab_hub.projects import ProjectError

pytestmark = pytest.mark.docker

REPO = f"{PREFIX}/policy"  # every image of this module, removed at its end
BASE = f"{REPO}/base:latest"  # the hub's allowed base in these tests
VICTIM = f"{REPO}/victim:latest"  # another tenant's image
VICTIM_SECRET = secrets.token_hex(16)


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def import_image(dk: host.Docker, ref: str, files: dict[str, bytes]) -> str:
    repo, _, tag = ref.rpartition(":")
    dk.call("import_image_from_data", tar_of(files), repository=repo, tag=tag)
    return dk.call("inspect_image", ref)["Id"]


def checked(dk: host.Docker, text: str) -> str:
    """The Dockerfile text a build sends to Docker, as gpulab's build path makes it."""
    return policy.check(text, (BASE,), lambda ref: images.image_id(dk.call, ref))


def build(dk: host.Docker, text: str, tag: str) -> str:
    """A classic build of ``text`` (no context files), as gpulab's builder makes one."""
    stream = dk.call(
        "build",
        fileobj=images.tar_context({"Dockerfile": text.encode()}),
        custom_context=True,
        tag=tag,
        rm=True,
        forcerm=True,
        decode=True,
    )
    for chunk in stream:
        assert "error" not in chunk, chunk["error"]
    return dk.call("inspect_image", tag)["Id"]


def file_in(dk: host.Docker, image: str, path: str) -> bytes | None:
    """The content of ``path`` in ``image`` (None when it has none), read without running it."""
    name = f"{PREFIX}-policy-{secrets.token_hex(4)}"
    cid = dk.call("create_container", image, command=["/none"], name=name)["Id"]
    try:
        stream, _ = dk.call("get_archive", cid, path)
    except docker.errors.NotFound:
        return None
    else:
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.getmembers()[0]
            return tar.extractfile(member).read()
    finally:
        dk.call("remove_container", cid, force=True)


@pytest.fixture(scope="module")
def engine(docker_engine):
    """The allowed base and a victim image, both tiny; every image of the module removed after."""
    base_id = import_image(docker_engine, BASE, {"base.txt": b"base\n"})
    victim_id = import_image(docker_engine, VICTIM, {"victim.txt": VICTIM_SECRET.encode()})
    yield docker_engine, base_id, victim_id
    host.remove_image_trees(docker_engine, REPO)


def refused(dk: host.Docker, text: str, line: int) -> str:
    with pytest.raises(ProjectError) as e:
        checked(dk, text)
    message = str(e.value)
    assert message.startswith(f"Line {line} of the Dockerfile: "), message
    return message


def test_another_image_by_tag_id_or_prefix_is_refused_naming_the_line(engine):
    dk, base_id, victim_id = engine
    forms = [
        VICTIM,
        VICTIM.removesuffix(":latest"),
        victim_id,  # sha256:<64 hex>
        victim_id.removeprefix("sha256:"),
        victim_id[7:19],  # 12 characters, as `docker images` shows
        victim_id[7:11],  # 4 characters
    ]
    for form in forms:
        try:
            resolved = dk.call("inspect_image", form)["Id"]
        except docker.errors.APIError:  # a 4-character prefix another image shares
            resolved = None
        assert resolved in (victim_id, None) and (resolved or form == forms[-1]), form
        msg = refused(dk, f"FROM {BASE} AS mine\nRUN true\nFROM {form}\n", 3)
        assert form in msg and BASE in msg
        msg = refused(dk, f"FROM {BASE}\nCOPY --from={form} /victim.txt /stolen.txt\n", 2)
        assert f"--from={form}" in msg
    # The same COPY, unchecked: the engine takes the 12-character prefix and copies the
    # victim's file. The refusal above is what stops it.
    leak = build(
        dk, f"FROM {BASE}\nCOPY --from={victim_id[7:19]} /victim.txt /x\n", f"{REPO}/leak:1"
    )
    assert file_in(dk, leak, "/x") == VICTIM_SECRET.encode()


class _Secret(BaseHTTPRequestHandler):
    secret = b""
    requests: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.secret)))
        self.end_headers()
        self.wfile.write(self.secret)

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback_secret():
    """An HTTP server on the host's loopback only, answering every GET with a secret."""
    secret = secrets.token_hex(16)
    handler = type("Handler", (_Secret,), {"secret": secret.encode(), "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield secret, server.server_address[1], handler.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_add_from_the_hosts_loopback_is_refused_and_never_fetched(engine, loopback_secret):
    dk, _, _ = engine
    secret, port, requests = loopback_secret
    url = f"http://127.0.0.1:{port}/secret"
    attacks = {
        f"FROM {BASE}\nADD {url} /secret\n": 2,
        f'FROM {BASE}\n\nADD ["{url}", "/secret"]\n': 3,
        f"FROM {BASE}\nADD --chown=1000:100 \\\n  '{url}' /secret\n": 2,
        f"ARG U={url}\nFROM {BASE}\nADD $U /secret\n": 3,
    }
    for text, line in attacks.items():
        msg = refused(dk, text, line)
        assert "RUN" in msg and "ADD" in msg
    assert requests == [], "the engine fetched from the host's loopback"
    with pytest.raises(docker.errors.ImageNotFound):
        dk.call("inspect_image", f"{REPO}/add:1")
    # The first text, unchecked: the engine fetches the secret from the host's loopback
    # into the image. The refusal above is what stops it.
    leak = build(dk, f"FROM {BASE}\nADD {url} /secret\n", f"{REPO}/add:1")
    assert requests == ["/secret"]
    assert file_in(dk, leak, "/secret") == secret.encode()
    dk.call("remove_image", f"{REPO}/add:1", force=True)


def test_allowed_forms_build_on_the_pinned_base_even_when_its_tag_moves(engine):
    dk, base_id, victim_id = engine
    text = (
        f"FROM {BASE.removesuffix(':latest')} AS first\n"
        f"FROM {BASE}\n"
        "COPY --from=first /base.txt /from-stage.txt\n"
        f"COPY --from={BASE} /base.txt /from-base.txt\n"
    )
    pinned = checked(dk, text)
    assert pinned.count(base_id) == 3 and VICTIM not in pinned
    repo, _, tag = BASE.rpartition(":")
    dk.call("tag", victim_id, repo, tag)  # the base's tag moves after the check
    try:
        built = build(dk, pinned, f"{REPO}/pinned:1")
    finally:
        dk.call("tag", base_id, repo, tag, force=True)
    for path in ("/base.txt", "/from-stage.txt", "/from-base.txt"):
        assert file_in(dk, built, path) == b"base\n", path
    assert file_in(dk, built, "/victim.txt") is None

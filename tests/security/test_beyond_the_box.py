"""Projects and builds reach nothing beyond the box that the admin did not allow
(docs/security.md, "Beyond the box"; egress.py).

The cloud around the box is a stand-in the test makes: a network namespace reached
from this machine over a veth pair, holding the metadata address 169.254.169.254 and
a LAN machine's address, each serving the "instance's credentials" over HTTP. This
machine reaches both (the stand-in works); a container on gpulab's projects network
(with the rules `gpulab up` sets) and a build step through gpulab's build path try
to read them as an attacker would, and are refused; with the admin's settings
allowing the metadata service and the LAN machine, the container reads both.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import time
import urllib.request

import pytest
from conftest import PREFIX, free_port

from gpulab_hub import firewall, host
from gpulab_hub.images import confine
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project

pytestmark = pytest.mark.docker

NETWORK = f"{PREFIX}-net"
REPO = f"{PREFIX}/project"
CREDENTIALS = "stand-in-instance-credentials-5150"
TAG = hashlib.sha256(PREFIX.encode()).hexdigest()[:6]
LAN = f"10.226.{int(TAG, 16) % 200 + 20}.2"  # a machine on the LAN
METADATA = "169.254.169.254"

# What the attacker runs, in a project or a RUN line: read the credentials.
PROBE = f"""
import json, socket, urllib.request
def get(ip):
    try:
        with urllib.request.urlopen(f"http://{{ip}}/credentials", timeout=4) as r:
            return "open: " + r.read().decode()
    except OSError as e:
        return f"refused: {{e}}"
try:
    names = socket.getaddrinfo("pypi.org", 443)[0][4][0]
except OSError as e:
    names = f"no names: {{e}}"
print("PROBE " + json.dumps({{"metadata": get("{METADATA}"), "lan": get("{LAN}"), "dns": names}}))
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def get(ip: str) -> str:
    with urllib.request.urlopen(f"http://{ip}/credentials", timeout=4) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    """The stand-in metadata service and LAN machine, in a namespace of their own."""
    ns, host_if, ns_if = f"{PREFIX}cloud", f"gm{TAG}h", f"gm{TAG}n"
    assert METADATA not in _ip("route").stdout, "this machine routes 169.254.169.254 already"
    served = tmp_path_factory.mktemp("metadata")
    (served / "credentials").write_text(CREDENTIALS)

    def remove() -> None:
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", host_if, check=False)

    remove()
    _ip("netns", "add", ns)
    _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    _ip("link", "set", ns_if, "netns", ns)
    lan_host = LAN.rsplit(".", 1)[0] + ".1"
    for mine, theirs in (("169.254.169.1", METADATA), (lan_host, LAN)):
        _ip("addr", "add", mine, "peer", f"{theirs}/32", "dev", host_if)
        _ip("netns", "exec", ns, "ip", "addr", "add", theirs, "peer", f"{mine}/32", "dev", ns_if)
    _ip("link", "set", host_if, "up")
    _ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
    _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns, "python3", "-m", "http.server", "80",
         "--bind", "0.0.0.0", "--directory", str(served)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(50):
            try:
                get(METADATA)
                break
            except OSError:
                time.sleep(0.1)
        yield
    finally:
        server.terminate()
        server.wait(timeout=10)
        remove()


@pytest.fixture(scope="module")
def projects_network(docker_engine):
    """gpulab's projects network with the rules `gpulab up` sets (host.ensure_firewall)."""
    port = free_port()
    made = not any(n["Name"] == NETWORK for n in docker_engine.call("networks"))
    host.ensure_network(docker_engine, NETWORK)
    host.ensure_firewall(docker_engine, NETWORK, port)
    bridge = firewall.bridge_of(docker_engine.call("inspect_network", NETWORK))
    yield bridge
    host.forget_firewall(docker_engine, NETWORK, port)
    if made:  # a network of this test's own (not the session hub's): its jumps go too
        from gpulab_hub import egress

        egress.forget(bridge)


def probe_result(lines: list[str]) -> dict:
    found = [line for line in lines if line.startswith("PROBE ")]
    assert found, "\n".join(lines[-30:])
    return json.loads(found[-1][len("PROBE ") :])


def in_a_project(dk, image: str) -> dict:
    """The attack from a container on the projects network."""
    c = dk.call(
        "create_container",
        image,
        ["python3", "-c", PROBE],
        name=f"{PREFIX}-cloudprobe",
        host_config=dk.call("create_host_config", network_mode=NETWORK),
    )
    try:
        dk.call("start", c["Id"])
        dk.call("wait", c["Id"], timeout=60)
        return probe_result(dk.call("logs", c["Id"]).decode().splitlines())
    finally:
        dk.call("remove_container", c["Id"], force=True)


def test_the_stand_in_answers_this_machine(cloud):
    assert get(METADATA) == CREDENTIALS
    assert get(LAN) == CREDENTIALS


def test_a_project_reads_no_metadata_and_no_lan_machine(
    cloud, docker_engine, local_debian, projects_network
):
    seen = in_a_project(docker_engine, local_debian)
    assert seen["metadata"].startswith("refused"), seen
    assert seen["lan"].startswith("refused"), seen
    assert CREDENTIALS not in json.dumps(seen)
    # names still resolve: the host's DNS server (a private address on many hosts) answers
    assert seen["dns"] == socket.getaddrinfo("pypi.org", 443)[0][4][0], seen


def test_a_build_step_reads_no_metadata_and_no_lan_machine(
    cloud, docker_engine, local_debian, projects_network, tmp_path
):
    p = Project(tmp_path / "projects", "mallory", "cloud", tmp_path / "state")
    p.path.mkdir(parents=True)
    (p.path / "probe.py").write_text(PROBE)
    (p.path / "Dockerfile").write_text(
        f"FROM {local_debian}\nCOPY probe.py /\nRUN python3 /probe.py\n"
    )
    lines: list[str] = []
    limits = confine.BuildLimits(timeout=120)
    projectimage.ensure_image(
        docker_engine.call, p, p.root / ".locks", lines.append, limits.timeout, repo=REPO,
        network=NETWORK, limits=limits, allowed=(local_debian,),
    )  # fmt: skip
    seen = probe_result(lines)
    assert seen["metadata"].startswith("refused"), seen
    assert seen["lan"].startswith("refused"), seen
    assert CREDENTIALS not in "\n".join(lines)


def test_what_the_admin_allows_is_reached(cloud, docker_engine, local_debian, projects_network):
    from gpulab_hub import egress, settings

    allowing = settings.parse({"GPULAB_ALLOW_METADATA": "1", "GPULAB_ALLOWED_NETWORKS": LAN})
    # The chain is the host's: a hub starting meanwhile (another test worker's) would
    # write the default policy back before the probe, so the lock is held across.
    with egress.writing():
        try:
            egress.ensure(egress.policy_of(allowing), projects_network)
            seen = in_a_project(docker_engine, local_debian)
        finally:
            egress.ensure(egress.default_policy(), projects_network)
    assert seen["metadata"] == f"open: {CREDENTIALS}", seen
    assert seen["lan"] == f"open: {CREDENTIALS}", seen


def test_ipv6_metadata_is_refused_too(projects_network):
    from gpulab_hub import egress

    listed = subprocess.run(["ip6tables", "-S"], capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"no IPv6 tables on this machine: {listed.stderr.strip()}")
    assert f"-A {egress.CHAIN} -d fd00:ec2::254/128 -j REJECT" in listed.stdout
    assert f"-i {projects_network} -j {egress.CHAIN}" in listed.stdout
    assert f"-i gpb+ -j {egress.CHAIN}" in listed.stdout

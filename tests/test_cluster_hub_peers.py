"""Other projects on a Slurm cluster cannot use a project's published port (issue 23),
performed on the session's test cluster (conftest's shared_cluster) with real
containers on the nodes' engines:

- a container on node 2 connects to a project's server (a real Jupyter server with
  gpulab's extension, told the hub's address in GPULAB_HUB_PEERS) and gets 403 for
  everything, its token and X-Forwarded-For naming the hub included, while the hub's
  address gets the server's answer;
- a build step on the hub's machine (a container on a ``gpb…`` build bridge, NATed
  out with the hub's address) reaches a port published on node 1 until the hub has
  set its rule for that node (cluster.nodefirewall), and never after.
"""

from __future__ import annotations

import http.client
import secrets
import subprocess
import time

import pytest
from cluster_images import http_answer, tiny_image_tar
from cluster_kit import wait_for
from conftest import PREFIX
from test_hub_peers import TOKEN, running

from gpulab_hub import egress, settings
from gpulab_hub.cluster import nodefirewall
from gpulab_jupyter import hubpeers

pytestmark = pytest.mark.docker
NAME = f"{PREFIX}-peers"


def node_docker(kit, node: str, *args: str, check: bool = True, timeout: int = 120):
    argv = ["docker", "-H", kit.node_docker_host(node), "--config", kit.node_docker_config,
            *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} on {node} failed: {done.stderr}")
    return done


def probe(address: str, port: int, headers: str = "") -> list[str]:
    """A container command: one HTTP GET with the server's token, its answer printed
    (or "no connection: <why>")."""
    request = f"GET /api/status HTTP/1.0\\r\\nAuthorization: token {TOKEN}\\r\\n{headers}\\r\\n"
    return [
        "perl", "-MIO::Socket::INET", "-e",
        f'my $s = IO::Socket::INET->new(PeerAddr => "{address}:{int(port)}", Timeout => 5)'
        ' or do { print "no connection: $!\\n"; exit 0 };'
        f' print $s "{request}"; print while <$s>',
    ]  # fmt: skip


@pytest.fixture(scope="module")
def probe_image(shared_cluster, docker_engine, tmp_path_factory):
    """The kit's tiny image (perl) on this machine's engine and on both nodes."""
    kit = shared_cluster
    work = tmp_path_factory.mktemp("peers")
    name = f"{PREFIX}/peers-probe"
    docker_engine.call("import_image", src=str(tiny_image_tar(work / "rootfs.tar")),
                       repository=name, tag="latest")  # fmt: skip
    ref, _ = kit.push(f"{name}:latest")
    for n in kit.nodes:
        node_docker(kit, n.name, "pull", ref, timeout=300)
    yield ref, f"{name}:latest"
    for n in kit.nodes:
        node_docker(kit, n.name, "rm", "-f", NAME, check=False)
    subprocess.run(["docker", "rm", "-f", NAME], capture_output=True)
    subprocess.run(["docker", "rmi", f"{name}:latest"], capture_output=True)


def test_a_container_on_another_node_is_refused_and_the_hub_is_answered(
    shared_cluster, probe_image, tmp_path
):
    kit = shared_cluster
    ref, _ = probe_image
    node = kit.nodes[-1].name
    hub = kit.host_address
    with running(tmp_path, hub) as port:  # the project's server, the hub at kit.host_address

        def attack(headers: str = "") -> str:
            done = node_docker(kit, node, "run", "--rm", "--name", NAME, "--cap-drop", "ALL",
                               ref, *probe(hub, port, headers))  # fmt: skip
            return done.stdout

        answer = attack()
        assert answer.startswith("HTTP/1.1 403") and hubpeers.REFUSED.strip() in answer, answer
        spoofed = attack(f"X-Forwarded-For: {hub}\\r\\nX-Real-Ip: {hub}\\r\\n")
        assert spoofed.startswith("HTTP/1.1 403"), spoofed
        conn = http.client.HTTPConnection(hub, port, timeout=10, source_address=(hub, 0))
        conn.request("GET", "/api/status", headers={"Authorization": f"token {TOKEN}"})
        r = conn.getresponse()
        assert r.status == 200 and b'"started"' in r.read(), "the hub was refused"
        conn.close()


def test_a_build_step_cannot_reach_a_node_as_the_hub(shared_cluster, probe_image, docker_engine):
    kit = shared_cluster
    ref, local = probe_image
    node = kit.nodes[0].name
    address = kit.node_address(node)
    node_docker(kit, node, "run", "-d", "--name", NAME, "-p", f"{address}::8080", ref,
                *http_answer(8080, "project answer"))  # fmt: skip

    def published():
        out = node_docker(kit, node, "port", NAME, "8080/tcp", check=False).stdout
        return next((line.rsplit(":", 1)[1] for line in out.split() if address in line), None)

    port = int(wait_for("node 1 to publish the port", published, timeout=30))
    bridge = f"{nodefirewall.firewall.BUILD_IFACE_PREFIX}{secrets.token_hex(4)}"
    net = docker_engine.call(
        "create_network", f"{PREFIX}-peers-build", driver="bridge",
        options={"com.docker.network.bridge.name": bridge}, labels={"gpulab.test": PREFIX},
    )  # fmt: skip

    def step() -> str:
        done = subprocess.run(
            ["docker", "run", "--rm", "--network", f"{PREFIX}-peers-build", "--cap-drop",
             "ALL", local, *probe(address, port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return done.stdout

    # The nodes sit on the LAN, which builds reach only where the admin allows it
    # (egress.py): allowed here, so that the node's own rule is what keeps them off.
    allowing = settings.parse({"GPULAB_ALLOWED_NETWORKS": f"{address}/32"})
    try:
        egress.ensure(egress.policy_of(allowing), bridge)
        nodefirewall.remove([address])
        before = step()
        assert "project answer" in before, before  # the hole, as it was
        started = time.monotonic()
        nodefirewall.keep_builds_off([address])
        after = step()
        assert "project answer" not in after and after.startswith("no connection"), after
        print(f"rule set in {time.monotonic() - started:.2f} s; the step saw: {after.strip()}")
    finally:
        egress.ensure(egress.default_policy(), bridge)
        egress.forget(bridge)
        nodefirewall.remove([address])
        docker_engine.call("remove_network", net["Id"])
        node_docker(kit, node, "rm", "-f", NAME, check=False)

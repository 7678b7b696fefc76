"""A project user holds no power over the host or other tenants (docs/security.md).

Each test is an attack as a hostile project user makes it, from inside their own
container (through a kernel, as the notebook user) or through a Dockerfile that
asks for root, against a real hub and real containers; each asserts the attack
fails and that nothing on the host or of another tenant changed.
"""

from __future__ import annotations

import json
import os
import pwd

import pytest
from conftest import PREFIX
from people import log_in_admin, make_user

from gpulab_hub import host

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

# What the attacker appends to their project's Dockerfile: become root, leave a
# setuid-root copy of Python, and probe the network from inside the build.
ATTACK_DOCKERFILE = """
USER root
RUN cp "$(readlink -f "$(command -v python3)")" /usr/local/bin/rootpy \\
 && chmod 4755 /usr/local/bin/rootpy
RUN python3 -c "import json, os, socket; s = socket.socket(); s.settimeout(3); \\
probe = {{'loopback': s.connect_ex(('127.0.0.1', {proxy_port})), 'uid': os.getuid(), \\
'interfaces': sorted(os.listdir('/sys/class/net'))}}; \\
open('/build-probe.json', 'w').write(json.dumps(probe))"
"""


def run_json(user, project: str, code: str):
    """Run ``code`` (which prints one JSON line last) in the user's project."""
    out = user.execute(project, code, timeout=120).strip().splitlines()
    return json.loads(out[-1])


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {name: make_user(hub, admin, name) for name in ("mallory", "victim")}


@pytest.fixture(scope="module")
def attack_project(hub, people):
    """mallory's project, rebuilt from a Dockerfile that asks for root."""
    mallory = people["mallory"]
    mallory.start_project("attack")
    extra = ATTACK_DOCKERFILE.format(proxy_port=int(hub.env["GPULAB_PROXY_API_PORT"]))
    mallory.execute("attack", f"open('Dockerfile', 'a').write({extra!r})")
    mallory.stop_project("attack")
    mallory.start_project("attack")
    yield "attack"
    mallory.stop_project("attack")


@pytest.fixture(scope="module")
def victim_project(people):
    victim = people["victim"]
    victim.start_project("work")
    victim.execute("work", "open('/data/outputs/result.txt', 'w').write('weeks of training')")
    yield "work"
    victim.stop_project("work")


def inspect(docker_engine, owner: str, project: str) -> dict:
    return docker_engine.call("inspect_container", f"{PREFIX}-{owner}--{project}")


def test_a_dockerfile_with_user_root_and_a_setuid_binary_gains_nothing(people, attack_project):
    code = """
import json, os, subprocess
lines = open("/proc/self/status").read().splitlines()
status = dict(line.split(":\\t", 1) for line in lines if ":\\t" in line)
setuid = subprocess.run(["/usr/local/bin/rootpy", "-c", "import os; print(os.geteuid())"],
                        capture_output=True, text=True)
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "setuid_euid": setuid.stdout.strip(),
                  "setuid_mode": oct(os.stat("/usr/local/bin/rootpy").st_mode),
                  "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
                  "no_new_privs": status["NoNewPrivs"].strip()}))
"""
    seen = run_json(people["mallory"], attack_project, code)
    assert seen["setuid_mode"].endswith("4755")  # the setuid-root binary is there...
    assert seen["setuid_euid"] == "1000"  # ...and running it gives no root
    assert (seen["uid"], seen["euid"]) == (1000, 1000)  # USER root in the Dockerfile: ignored
    assert int(seen["cap_eff"], 16) == 0 and int(seen["cap_bnd"], 16) == 0
    assert seen["no_new_privs"] == "1"


def test_container_root_is_not_host_root_and_files_belong_to_no_account(
    hub, people, attack_project
):
    seen = run_json(
        people["mallory"],
        attack_project,
        "import json, os; open('mine.txt', 'w').write('x');"
        "print(json.dumps(open('/proc/self/uid_map').read().split()))",
    )
    inside, outside, count = (int(x) for x in seen[:3])
    assert inside == 0 and outside > 0 and count <= 65536  # root inside is not root outside
    st = os.stat(hub.home / "projects" / "mallory" / attack_project / "mine.txt")
    assert st.st_uid == outside + 1000
    with pytest.raises(KeyError):
        pwd.getpwuid(st.st_uid)  # no account on the host owns the notebook user's files


def test_no_raw_sockets_and_no_view_of_the_hosts_network(hub, people, attack_project):
    code = f"""
import json, os, socket
def attempt(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close(); return "opened"
    except PermissionError:
        return "refused"
s = socket.socket(); s.settimeout(3)
print(json.dumps({{"packet": attempt(socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
                  "icmp": attempt(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                  "proxy_api": s.connect_ex(("127.0.0.1", {int(hub.env["GPULAB_PROXY_API_PORT"])})),
                  "interfaces": sorted(os.listdir("/sys/class/net"))}}))
"""
    seen = run_json(people["mallory"], attack_project, code)
    assert seen["packet"] == "refused" and seen["icmp"] == "refused"
    assert seen["proxy_api"] != 0  # the proxy's API (and its auth token) on the host loopback
    assert set(seen["interfaces"]) <= {"lo", "eth0"}
    assert set(seen["interfaces"]) != set(os.listdir("/sys/class/net"))


def test_builds_do_not_run_on_the_hosts_network(hub, people, attack_project):
    probe = people["mallory"].execute(attack_project, "print(open('/build-probe.json').read())")
    seen = json.loads(probe)
    assert seen["uid"] == 0  # the build ran as root (in the build container)...
    assert seen["loopback"] != 0  # ...without the host's loopback
    assert set(seen["interfaces"]) <= {"lo", "eth0"}


def test_one_tenant_cannot_reach_anothers_container(
    docker_engine, people, attack_project, victim_project
):
    victim_ip = next(
        iter(
            inspect(docker_engine, "victim", victim_project)["NetworkSettings"]["Networks"].values()
        )
    )["IPAddress"]
    code = f"""
import json, socket
s = socket.socket(); s.settimeout(3)
print(json.dumps(s.connect_ex(({victim_ip!r}, 8888))))
"""
    # The hub reaches the victim's server at that address (it is ready); mallory cannot.
    assert run_json(people["mallory"], attack_project, code) != 0


def test_each_container_carries_the_protections_and_limits(docker_engine, people, attack_project):
    c = inspect(docker_engine, "mallory", attack_project)
    hc = c["HostConfig"]
    assert hc["NetworkMode"] == f"{PREFIX}-net"
    assert hc["CapDrop"] == ["ALL"] and hc["SecurityOpt"] == ["no-new-privileges"]
    assert not hc["Privileged"] and c["Config"]["User"] == "1000:100"
    assert hc["PidsLimit"] == 4096
    assert hc["Memory"] == host.default_mem_limit()
    assert hc["NanoCpus"] or hc["CpuQuota"] == int(host.default_cpu_limit() * 100_000)
    net = docker_engine.call("inspect_network", f"{PREFIX}-net")
    assert net["Driver"] == "bridge"
    assert net["Options"]["com.docker.network.bridge.enable_icc"] == "false"


def test_a_fork_bomb_stops_at_the_process_limit(people, attack_project):
    code = """
import json, threading
stop = threading.Event(); n = 0
try:
    while n < 6000:
        threading.Thread(target=stop.wait, daemon=True).start(); n += 1
except RuntimeError:
    pass
stop.set()
print(json.dumps(n))
"""
    started = run_json(people["mallory"], attack_project, code)
    assert 100 < started < 4096  # the kernel refused the rest; the host never saw them


def test_shared_data_is_per_project(hub, people, attack_project, victim_project):
    data = hub.home / "data" / "projects"
    victims_result = data / "victim" / "work" / "outputs" / "result.txt"
    assert victims_result.read_text() == "weeks of training"
    code = """
import json, os, shutil, subprocess
for d in ("/data/outputs", "/data/models"):
    for name in os.listdir(d):
        p = os.path.join(d, name)
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
found = subprocess.run(["find", "/data", "-name", "result.txt"], capture_output=True, text=True)
try:
    open("/data/datasets/planted", "w"); datasets = "written"
except OSError:
    datasets = "refused"
open("/data/outputs/mine.txt", "w").write("mallory's")
print(json.dumps({"found": found.stdout, "datasets": datasets}))
"""
    seen = run_json(people["mallory"], attack_project, code)
    assert seen["found"] == ""  # the victim's outputs are not even visible
    assert seen["datasets"] == "refused"
    assert victims_result.read_text() == "weeks of training"
    assert (data / "mallory" / "attack" / "outputs" / "mine.txt").read_text() == "mallory's"


def test_spawn_options_cannot_choose_the_network_or_host_settings(docker_engine, people):
    mallory = people["mallory"]
    for options in (
        {"network_mode": "host"},
        {"extra_host_config": {"privileged": True}},
        {"gpus": "1; rm -rf /"},
    ):
        r = mallory.api("POST", f"/hub/api/users/{mallory.name}/servers/opts", json=options)
        assert r.status_code >= 400, r.text  # refused before anything is built or started
        assert "Unknown spawn option" in r.text or "must be" in r.text, r.text
    assert not docker_engine.call(
        "containers", all=True, filters={"name": f"{PREFIX}-mallory--opts"}
    )

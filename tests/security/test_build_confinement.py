"""A project's build steps attack, as a hostile Dockerfile's RUN lines would.

Each build goes through gpulab's real build path (images/project.py, a real engine
started with gpulab's runtime) with a probe the project copies in: raw sockets and
ARP, privilege gain, another tenant's container, the host's own services, a fork
bomb, a disk fill, a step that never ends. Each attack must fail or be stopped
within its limit, and nothing of the build may be left behind.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from conftest import PREFIX
from hostservice import SECRET, HostService, host_address

from gpulab_hub import host, images
from gpulab_hub.images import confine
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project

pytestmark = pytest.mark.docker
REPO = f"{PREFIX}/project"
NETWORK = f"{PREFIX}-net"
PROBE = Path(__file__).with_name("build_probe.py")


def project(tmp_path: Path, name: str, dockerfile: str, probe_args: dict | None = None) -> Project:
    p = Project(tmp_path / "projects", "mallory", name, tmp_path / "state")
    p.path.mkdir(parents=True)
    (p.path / "Dockerfile").write_text(dockerfile)
    (p.path / "probe.py").write_text(PROBE.read_text())
    (p.path / "probe.json").write_text(json.dumps(probe_args or {}))
    return p


def build(dk, p: Project, limits: confine.BuildLimits, lines: list[str]) -> str:
    host.ensure_network(dk, NETWORK)
    return projectimage.ensure_image(
        dk.call, p, p.root / ".locks", lines.append, limits.timeout, repo=REPO,
        network=NETWORK, limits=limits, allowed=(f"{PREFIX}/debian:bookworm",),
    )  # fmt: skip


def probe_result(lines: list[str]) -> dict:
    found = [line for line in lines if line.startswith("PROBE ")]
    assert found, "\n".join(lines[-30:])
    return json.loads(found[-1][len("PROBE ") :])


def build_networks(dk) -> list[str]:
    return [n["Name"] for n in dk.call("networks") if n["Name"].startswith(f"{NETWORK}-build-")]


@pytest.fixture
def host_service():
    s = HostService()
    yield s
    s.close()


@pytest.fixture
def victim(docker_engine, local_debian):
    """Another tenant's running container on the projects' network, answering HTTP."""
    host.ensure_network(docker_engine, NETWORK)
    name = f"{PREFIX}-buildvictim"
    c = docker_engine.call(
        "create_container",
        local_debian,
        ["python3", "-m", "http.server", "8000"],
        name=name,
        host_config=docker_engine.call("create_host_config", network_mode=NETWORK),
    )
    docker_engine.call("start", c["Id"])
    ip = docker_engine.call("inspect_container", c["Id"])["NetworkSettings"]["Networks"][NETWORK][
        "IPAddress"
    ]
    yield ip
    docker_engine.call("remove_container", c["Id"], force=True)


def test_a_build_step_holds_no_raw_socket_and_reaches_no_one(
    docker_engine, local_debian, tmp_path, victim, host_service
):
    """Raw sockets and ARP refused, no privilege gain, no capability beyond apt's; another
    tenant's container, the build's gateway and the host's own address answer nothing."""
    p = project(
        tmp_path,
        "net",
        f"FROM {local_debian}\nCOPY probe.py probe.json /\nRUN python3 /probe.py net\n",
        {"victim": victim, "host": host_address(), "port": host_service.port},
    )
    lines: list[str] = []
    before = set(build_networks(docker_engine))
    build(docker_engine, p, confine.BuildLimits(timeout=120, cpus=0.5), lines)
    r = probe_result(lines)
    assert r["cpu_quota"].split()[0] == "50000", r["cpu_quota"]  # half a CPU
    assert r["raw_packet"].startswith("refused") and r["raw_inet"].startswith("refused")
    assert r["arp_spoof"].startswith("refused")
    assert r["no_new_privs"] == 1
    net_raw, mknod = 1 << 13, 1 << 27
    assert r["cap_eff"] & net_raw == 0 and r["cap_eff"] & mknod == 0
    assert r["pids_max"] == "1024"
    # the other tenant is on another segment: not reachable, never in this step's ARP table
    assert not r["victim"].startswith("open"), r
    assert victim not in r["arp_table"]
    assert r["own_subnet"] != ".".join(victim.split(".")[:3])
    for where in ("gateway", "host"):
        assert not r[where].startswith("open"), (where, r)
    assert SECRET not in "\n".join(lines)
    # control: the same service answers the host itself
    with socket.create_connection(("127.0.0.1", host_service.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        assert SECRET.encode() in answer
    assert set(build_networks(docker_engine)) <= before  # the build's network went with it


def test_a_fork_bomb_stops_at_the_process_limit(docker_engine, local_debian, tmp_path):
    p = project(
        tmp_path, "forks", f"FROM {local_debian}\nCOPY probe.py /\nRUN python3 /probe.py forks\n"
    )
    lines: list[str] = []
    started = time.monotonic()
    build(docker_engine, p, confine.BuildLimits(timeout=120, pids=64), lines)
    r = probe_result(lines)
    assert r["fork_refused"] and r["forked"] < 64, r  # the probe itself counts too
    assert time.monotonic() - started < 60


def test_a_disk_fill_is_stopped_at_the_disk_limit(docker_engine, local_debian, tmp_path):
    p = project(
        tmp_path, "disk", f"FROM {local_debian}\nCOPY probe.py /\nRUN python3 /probe.py disk\n"
    )
    lines: list[str] = []
    before = set(build_networks(docker_engine))
    started = time.monotonic()
    with pytest.raises(images.BuildError, match="wrote more than 100 MiB to disk"):
        build(docker_engine, p, confine.BuildLimits(timeout=300, disk=100 << 20), lines)
    assert time.monotonic() - started < 60  # the probe would write 4 GiB over 40 s
    wrote = [int(line.split()[1]) for line in lines if line.startswith("WROTE ")]
    assert wrote and max(wrote) < 400, wrote  # MiB: stopped near the limit
    assert projectimage.last_good(p) is None and projectimage.last_build_failed(p)
    assert set(build_networks(docker_engine)) <= before
    steps = docker_engine.call("containers", all=True, filters={"ancestor": local_debian})
    assert [c for c in steps if not c["Names"][0].startswith(f"/{PREFIX}")] == []  # step gone


def test_a_build_that_never_ends_is_stopped_at_its_time_limit(
    docker_engine, local_debian, tmp_path
):
    p = project(
        tmp_path, "endless", f"FROM {local_debian}\nRUN while :; do echo tick; sleep 1; done\n"
    )
    lines: list[str] = []
    before = set(build_networks(docker_engine))
    started = time.monotonic()
    with pytest.raises(images.BuildError, match="took longer than 4 s and was stopped"):
        build(docker_engine, p, confine.BuildLimits(timeout=4), lines)
    assert time.monotonic() - started < 15
    assert set(build_networks(docker_engine)) <= before


def test_a_flood_of_output_keeps_the_head_and_the_tail(docker_engine, local_debian, tmp_path):
    p = project(
        tmp_path,
        "flood",
        f"FROM {local_debian}\nRUN yes 'flood flood flood flood' | head -c 20000000; "
        "echo LAST-LINE-OF-THE-STEP\n",
    )
    build(docker_engine, p, confine.BuildLimits(timeout=120, log_bytes=1 << 20), [])
    log = projectimage.latest_log(p)
    size = log.stat().st_size
    assert size < (1 << 20) + 4096, size  # 20 MB printed, about 1 MiB kept
    text = log.read_text()
    assert text.startswith("Step 1/2 : FROM")
    assert "LAST-LINE-OF-THE-STEP" in text and "lines (" in text and "left out here" in text


def test_build_logs_rotate(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    for day in range(1, 16):
        (folder / f"build-202601{day:02d}-000000.log").write_text("x")
    (folder / "notes.txt").write_text("kept")
    confine.rotate_logs(folder, projectimage.LOG_NAME, 10)
    names = sorted(p.name for p in folder.iterdir())
    assert names[0] == "build-20260106-000000.log" and len(names) == 11
    assert "notes.txt" in names


def test_an_engine_without_gpulabs_runtime_is_refused():
    with pytest.raises(confine.BuildRefused, match="does not confine image builds"):
        confine.check_engine({"DefaultRuntime": "runc", "Runtimes": {"runc": {}}}, "gpulab")
    confine.check_engine({"DefaultRuntime": "gpulab", "Runtimes": {"gpulab": {}}}, "gpulab")

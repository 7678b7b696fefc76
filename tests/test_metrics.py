"""gpulab's GPU figures on /hub/metrics: what the records say, in Prometheus' format, and
Debian's Prometheus scraping the hub and answering a query for them."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests
from hubclient import HubUser
from prometheus_client import CollectorRegistry, generate_latest

from gpulab_hub.gpus import Device, Inventory, allocator, metrics, queue, usage

H100 = [Device(str(i), f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 << 30, "9.0") for i in range(3)]
NOW = 1_800_000_000.0


def sources(tmp_path: Path, inv: Inventory) -> metrics.Sources:
    from gpulab_hub.db import migrate

    url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    migrate.upgrade(url)  # the hub's database, as a start leaves it
    return metrics.Sources(
        tmp_path / "gpu-allocations.json",
        tmp_path / "gpu-queue.json",
        url,
        inventory=lambda: inv,
    )


def test_the_figures_are_what_the_records_say(tmp_path):
    src = sources(tmp_path, Inventory(devices=H100))
    store = allocator.AllocationStore(src.allocations_file, clock=lambda: NOW - 1800)
    store.allocate(H100, allocator.Request("alice", "train", 1), allocator.Policy())
    store.allocate(H100, allocator.Request("bob", "sweep", 1), allocator.Policy())
    waiting = queue.QueueStore(src.queue_file, clock=lambda: NOW - 300)
    waiting.enqueue(allocator.Request("carol", "eval", 1))
    usage.UsageLedger(src.db_url, clock=lambda: NOW).append(
        [usage.Record("alice", "old", "GPU-2", "GPU 2 (NVIDIA H100)", NOW - 7200, NOW - 3600, 80.0)]
    )

    snap = metrics.read(src, now=NOW)
    assert (snap.free, snap.held, snap.holdings) == (1, 2, 2)
    assert (snap.queue_length, snap.longest_wait) == (1, 300.0)
    assert snap.hours == {"alice": 1.5, "bob": 0.5}  # 1 h recorded + 0.5 h under way

    clock = [NOW]
    collector = metrics.GpuCollector(lambda: src, clock=lambda: clock[0])
    collector.refresh()
    clock[0] = NOW + 4  # scraped 4 s after the figures were read
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    for line in (
        'gpulab_gpus{state="free"} 1.0',
        'gpulab_gpus{state="held"} 2.0',
        "gpulab_gpu_holdings 2.0",
        "gpulab_gpu_queue_length 1.0",
        "gpulab_gpu_queue_longest_wait_seconds 300.0",
        'gpulab_gpu_hours{user="alice"} 1.5',
        'gpulab_gpu_hours{user="bob"} 0.5',
        "gpulab_metrics_snapshot_age_seconds 4.0",
    ):
        assert line in text.splitlines(), (line, text)


def test_a_record_it_cannot_read_keeps_the_last_figures_and_says_so(tmp_path, caplog):
    src = sources(tmp_path, Inventory(devices=H100))
    collector = metrics.GpuCollector(lambda: src, clock=lambda: NOW)
    collector.refresh()
    src.queue_file.mkdir()  # a folder where the queue file should be: unreadable
    collector.refresh()
    assert "gpulab's GPU figures not read" in caplog.text
    registry = CollectorRegistry()
    registry.register(collector)
    assert 'gpulab_gpus{state="free"} 3.0' in generate_latest(registry).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path, hub):
    """Debian's Prometheus scraping the hub's /hub/metrics every second with an admin's
    token; its address."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus is not installed (scripts/setup.sh test installs it)"
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    token = admin.new_token()
    hostport = hub.url.split("://", 1)[1].rstrip("/")
    (tmp_path / "token").write_text(token)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpulab\n"
        "    metrics_path: /hub/metrics\n"
        f"    authorization: {{credentials_file: {tmp_path / 'token'}}}\n"
        f"    static_configs: [{{targets: ['{hostport}']}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def query(base: str, promql: str, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = requests.get(f"{base}/api/v1/query", params={"query": promql}, timeout=5)
            result = r.json()["data"]["result"] if r.ok else []
        except (requests.RequestException, ValueError, KeyError):
            result = []
        if result:
            return result
        time.sleep(1)
    return []


def test_the_sources_follow_the_hubs_configuration(tmp_path):
    from traitlets.config import Config

    c = Config()
    c.ProjectSpawner.queue_file = str(tmp_path / "q.json")
    resolve = metrics.Sources.of_config(c)
    c.JupyterHub.db_url = f"sqlite:///{tmp_path / 'h.sqlite'}"  # a line the admin added later
    c.ProjectSpawner.gpu_usage_retention_days = 365.0
    src = resolve()
    assert (src.queue_file, src.db_url) == (
        tmp_path / "q.json",
        f"sqlite:///{tmp_path / 'h.sqlite'}",
    )
    assert src.retention == 365 * 24 * 3600.0
    assert src.allocations_file == Path("/srv/gpulab/hub/gpu-allocations.json")  # the default
    assert src.window == 7 * 24 * 3600.0


def test_prometheus_scrapes_gpulabs_figures_from_the_hub(hub, prometheus):
    up = query(prometheus, 'up{job="gpulab"} == 1')
    assert up, "Prometheus never scraped /hub/metrics with the admin's token"
    # JupyterHub's own figures and gpulab's, side by side, from the same scrape
    assert query(prometheus, "jupyterhub_total_users")
    queued = query(prometheus, "gpulab_gpu_queue_length")
    assert queued and queued[0]["value"][1] == "0"  # nobody waits on this host
    states = {r["metric"]["state"]: r["value"][1] for r in query(prometheus, "gpulab_gpus")}
    assert states == {"free": "0", "held": "0"}  # a host without GPUs, as CI's is
    # A holding recorded in the hub's usage ledger shows as that user's GPU-hours.
    ledger = usage.UsageLedger(f"sqlite:///{hub.home / 'hub' / 'jupyterhub.sqlite'}")
    now = time.time()
    ledger.append([usage.Record("metricsuser", "p", "GPU-x", "GPU 0 (test)", now - 5400, now)])
    hours = query(prometheus, 'gpulab_gpu_hours{user="metricsuser"}', timeout=60)
    assert hours and abs(float(hours[0]["value"][1]) - 1.5) < 0.01

"""GPU status on a real GPU (H100/H200 host): run with `pytest -m gpu`.

Straight against a local `jupyter server` with gpulab-jupyter (no Docker): a
kernel doing torch matmuls must show in the process list with its kernel and
notebook, the memory figures must agree with torch.cuda.mem_get_info, and the
numbers must be real. Skips with its reason where there is no NVIDIA driver.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.gpu
MIB = 1 << 20


def nvml_or_skip() -> None:
    try:
        import pynvml
    except ImportError:
        pytest.skip("nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"no usable NVIDIA driver here: {e}")
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("the NVIDIA driver lists no GPU")


@pytest.fixture(scope="module", autouse=True)
def gpu_host():
    nvml_or_skip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, url: str, token: str, runtime: Path, proc: subprocess.Popen):
        self.url, self.token, self.runtime, self.proc = url, token, runtime, proc

    def get(self, path: str, **params):
        r = requests.get(
            f"{self.url}/{path}", params=params, timeout=10,
            headers={"Authorization": f"token {self.token}"},
        )  # fmt: skip
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict):
        r = requests.post(
            f"{self.url}/{path}", data=json.dumps(body), timeout=60,
            headers={"Authorization": f"token {self.token}"},
        )  # fmt: skip
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("gpu-server")
    port, token = free_port(), secrets.token_hex(16)
    runtime = home / "runtime"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime))
    cmd = [
        str(Path(sys.executable).parent / "jupyter"), "server", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={home}", "--allow-root",
        "--GPUSampler.interval=0.5", "--GPUSampler.process_interval=1",
    ]  # fmt: skip
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    srv = Server(f"http://127.0.0.1:{port}", token, runtime, proc)
    deadline = time.monotonic() + 60
    while True:
        try:
            if srv.get("api/gpulab/v1/gpu")["reason"] != "starting":
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError((home / "server.log").read_text()[-3000:])
        time.sleep(0.3)
    yield srv
    proc.terminate()
    proc.wait(20)
    log.close()


def test_real_numbers(server):
    s = server.get("api/gpulab/v1/gpu")
    assert s["available"] is True, s["message"]
    assert s["reason"] is None and s["driver_version"]
    assert s["gpus"], s
    for g in s["gpus"]:
        assert g["uuid"].startswith(("GPU-", "MIG-")) and g["name"]
        assert g["memory_total"] > 4 << 30
        assert 0 < g["memory_used"] <= g["memory_total"]
        assert g["memory_free"] == pytest.approx(g["memory_total"] - g["memory_used"], abs=MIB)
        if not g["mig"]:
            assert 0 <= g["utilization"] <= 100
            assert 10 <= g["temperature"] <= 110
            assert 10 < g["power_draw"] < g["power_limit"] * 1.5
    assert s["summary"]["count"] == len(s["gpus"])
    assert s["sampler"]["ticks"] > 0
    print("sampler:", s["sampler"])


def test_history_is_filled(server):
    time.sleep(1.5)
    h = server.get("api/gpulab/v1/gpu/history")
    assert len(h["timestamps"]) >= 3
    for series in h["gpus"].values():
        assert any(v is not None for v in series["memory_used"])


KERNEL_CODE = """
import threading, torch
x = torch.randn(8192, 8192, device="cuda")
y = x @ x
torch.cuda.synchronize()
_stop = threading.Event()
def _burn():
    while not _stop.is_set():
        torch.matmul(x, x, out=y)
        torch.cuda.synchronize()
threading.Thread(target=_burn, daemon=True).start()
free, total = torch.cuda.mem_get_info()
uuid = getattr(torch.cuda.get_device_properties(0), "uuid", "")
print("MEM", free, total, uuid, flush=True)
"""


@pytest.fixture(scope="module")
def matmul_kernel(server):
    """A notebook session whose kernel keeps a torch matmul running on GPU 0."""
    pytest.importorskip("torch")
    from jupyter_client import BlockingKernelClient

    session = server.post(
        "api/sessions",
        {"path": "matmul.ipynb", "type": "notebook", "kernel": {"name": "python3"}},
    )
    kid = session["kernel"]["id"]
    kc = BlockingKernelClient(connection_file=str(server.runtime / f"kernel-{kid}.json"))
    kc.load_connection_file()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(KERNEL_CODE, timeout=180, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(out)
    measured_at = time.time()
    line = next(x for x in "".join(out).splitlines() if x.startswith("MEM "))
    _, free, total, *uuid = line.split()
    yield {"id": kid, "free": int(free), "total": int(total), "uuid": "".join(uuid),
           "at": measured_at}  # fmt: skip
    kc.execute_interactive("_stop.set()", timeout=30)
    kc.stop_channels()


def gpu_of(status: dict, uuid: str) -> dict:
    for g in status["gpus"]:
        if uuid and (g["uuid"] == uuid or g["uuid"] == f"GPU-{uuid}"):
            return g
    return status["gpus"][0]


def test_matmul_kernel_is_listed_by_kernel_and_notebook(server, matmul_kernel):
    deadline = time.monotonic() + 30
    while True:
        procs = server.get("api/gpulab/v1/gpu/processes")
        kid = matmul_kernel["id"]
        ours = [p for p in procs["processes"] if (p["kernel"] or {}).get("id") == kid]
        fresh = procs["timestamp"] and procs["timestamp"] > matmul_kernel["at"]
        if fresh and ours and all(g["memory_used"] for g in ours[0]["gpus"]):
            break  # a process list read after the tensors were allocated
        assert time.monotonic() < deadline, procs
        time.sleep(0.5)
    row = ours[0]
    assert row["kernel"]["path"] == "matmul.ipynb"
    assert row["kernel"]["name"] == "python3"
    assert row["gpus"][0]["match"] == "pid"
    assert row["gpus"][0]["memory_used"] >= 256 * MIB  # two 8192² float32 tensors at least
    # The sampler (in the server's own process) is never a GPU process.
    assert server.proc.pid not in {p["pid"] for p in procs["processes"]}


def test_memory_agrees_with_torch(server, matmul_kernel):
    deadline = time.monotonic() + 10
    while True:
        s = server.get("api/gpulab/v1/gpu")
        if s["timestamp"] > matmul_kernel["at"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    g = gpu_of(s, matmul_kernel["uuid"])
    total = matmul_kernel["total"]
    tolerance = max(512 * MIB, total // 100)
    assert abs(g["memory_free"] - matmul_kernel["free"]) <= tolerance, (g, matmul_kernel)
    assert abs(g["memory_total"] - total) <= total * 0.03, (g, matmul_kernel)


def test_utilization_rises_under_matmul(server, matmul_kernel):
    seen = []
    for _ in range(12):
        seen.append(gpu_of(server.get("api/gpulab/v1/gpu"), matmul_kernel["uuid"])["utilization"])
        time.sleep(0.5)
    assert max(v for v in seen if v is not None) >= 50, seen


def test_only_the_gpus_given_to_the_container():
    from gpulab_jupyter.sampler import GPUSampler

    probe = GPUSampler(environ={})
    probe._setup()
    assert probe._devices, probe._state
    first = probe._devices[0]
    only = GPUSampler(environ={"NVIDIA_VISIBLE_DEVICES": first.uuid})
    only._setup()
    assert [d.uuid for d in only._devices] == [first.uuid]
    nothing = GPUSampler(environ={"NVIDIA_VISIBLE_DEVICES": "GPU-00000000-dead"})
    nothing._setup()
    assert nothing._devices == [] and nothing._state["reason"] == "none_allocated"
    cuda = GPUSampler(environ={"CUDA_VISIBLE_DEVICES": first.uuid})
    cuda._setup()
    assert [d.uuid for d in cuda._devices] == [first.uuid]
    for s in (probe, only, nothing, cuda):
        s.stop()


def test_sampler_tick_cost_per_gpu():
    from gpulab_jupyter.sampler import GPUSampler

    s = GPUSampler(environ={})
    s._setup()
    for _ in range(200):
        s._tick(do_procs=False, do_slow=False)
    per_gpu_us = s.stats["tick_seconds"] / s.stats["ticks"] / len(s._devices) * 1e6
    print(f"sampler tick: {per_gpu_us:.1f} µs per GPU")
    s.stop()
    assert per_gpu_us < 1000


def test_lean_nvml_binding_agrees_with_pynvml():
    """The sampler's own ctypes NVML calls read what nvidia-ml-py reads, field by field."""
    import pynvml

    from gpulab_jupyter import devices
    from gpulab_jupyter.nvml import Nvml

    lean = Nvml.load()
    pynvml.nvmlInit()
    try:
        ours, theirs = devices.enumerate_devices(lean), devices.enumerate_devices(pynvml)
        keys = ("nvml_index", "uuid", "name", "minor", "mig_enabled")
        assert [[getattr(d, k) for k in keys] for d in ours] == [
            [getattr(d, k) for k in keys] for d in theirs
        ]
        assert lean.nvmlSystemGetDriverVersion() == pynvml.nvmlSystemGetDriverVersion()
        for a, b in zip(ours, theirs, strict=True):
            devices.describe(lean, a)
            devices.describe(pynvml, b)
            assert (a.memory_total, a.power_limit) == (b.memory_total, b.power_limit)
            fa, fb = devices.read_fast(lean, a), devices.read_fast(pynvml, b)
            assert fa.keys() == fb.keys()
            assert fa["memory_total"] == fb["memory_total"] > 0
            assert abs(fa["memory_used"] - fb["memory_used"]) < 256 * MIB
            assert abs(fa["temperature"] - fb["temperature"]) <= 3
            assert sorted(p for p, _ in devices.gpu_processes(lean, a)) == sorted(
                p for p, _ in devices.gpu_processes(pynvml, b)
            )
    finally:
        pynvml.nvmlShutdown()
        lean.nvmlShutdown()

"""Slurm on a real GPU host: slurmd with GRES on the real ``/dev/nvidia*``, project
containers started by gpulab's own batch script (the hardened spec, the GPUs Slurm
gave the job), and a 2-GPU DDP job.

Run on a GPU host with Docker (../shared/gpu-host/README.md) and Slurm 22.05 installed
(docs/cluster.md, "Trying it on one GPU machine"):
    pytest --noconftest -m gpu tests/test_cluster_gpu.py -s

The node's GRES list names the GPUs in the reverse of their minor numbers
(``nvidia1`` then ``nvidia0``), so Slurm's index 0 is the GPU of minor 1: a script that
took Slurm's index for the minor would give the wrong GPU, and the UUIDs would show it.
The image's userland is the host's own (images/hostimage: /usr and the torch venv
bind-mounted read-only, added by a thin wrapper of the Docker CLI); every protection
of the container comes from the batch script.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpulab_hub import host
from gpulab_hub.cluster.batch import (
    BatchJob,
    JobRequest,
    NodeEngine,
    SlurmGpus,
    render_epilog,
    render_script,
    sbatch_args,
)
from gpulab_hub.images import hostimage
from gpulab_hub.projects import objects

pytestmark = pytest.mark.gpu
PREFIX = os.environ.get("GPULAB_TEST_PREFIX", "gpulabgpu")
IMAGE = f"{PREFIX}/host-userland:latest"
NETWORK = f"{PREFIX}-net"
PYTHON = os.environ.get("GPULAB_GPU_PYTHON", "/opt/torch/.venv/bin/python3")
NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
DDP = Path(__file__).with_name("fixtures") / "jobs" / "train_ddp.py"
PROBE = """
import json, os, subprocess, time, torch
out = {"count": torch.cuda.device_count(), "uid": os.getuid(),
       "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
       "devs": sorted(d for d in os.listdir("/dev") if d[len("nvidia"):].isdigit()
                      and d.startswith("nvidia"))}
if out["count"]:
    out["uuid"] = str(torch.cuda.get_device_properties(0).uuid)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
    out["tflops"] = round(20 * 2 * 8192**3 / (time.perf_counter() - t) / 1e12, 1)
    out["matmul"] = float(b.float().abs().mean())
smi = subprocess.run(["/usr/local/nvidia/bin/nvidia-smi", "-L"], capture_output=True, text=True)
out["smi"] = [line for line in smi.stdout.splitlines() if line.startswith("GPU ")]
open("/workspace/result.json", "w").write(json.dumps(out))
time.sleep(float(os.environ.get("HOLD_S", "0")))
"""


def _kit_module():
    import cluster_kit

    return cluster_kit


def gpu_minors() -> list[int]:
    minors = []
    for info in sorted(NVIDIA_PROC.glob("*/information")):
        for line in info.read_text().splitlines():
            if line.startswith("Device Minor:"):
                minors.append(int(line.split(":", 1)[1]))
    return sorted(minors)


def uuid_of(minor: int) -> str:
    for info in NVIDIA_PROC.glob("*/information"):
        lines = dict(
            (k.strip(), v.strip())
            for k, v in (ln.split(":", 1) for ln in info.read_text().splitlines() if ":" in ln)
        )
        if lines.get("Device Minor") == str(minor):
            return lines["GPU UUID"]
    raise AssertionError(f"no GPU with minor {minor}")


@pytest.fixture(scope="module")
def dk():
    d = host.Docker()
    if not d.reachable():
        pytest.skip("no Docker engine here: start one (../shared/gpu-host/start-docker.sh)")
    hostimage.ensure_image(d.call, IMAGE)
    host.ensure_network(d, NETWORK)
    yield d
    for c in d.call("containers", all=True, filters={"name": PREFIX}):
        d.call("remove_container", c["Id"], force=True)
    d.call("remove_network", NETWORK)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    minors = gpu_minors()
    if len(minors) < 2:
        pytest.skip(f"needs two GPUs, this host has {len(minors)}")
    if shutil.which("slurmd") is None:
        pytest.skip("Slurm is not installed here (docs/cluster.md)")
    ck = _kit_module()

    class RealGpuKit(ck.SlurmKit):
        """The test cluster with the host's real GPUs as GRES (no dummy devices)."""

        @property
        def nvidia_proc(self) -> Path:
            return NVIDIA_PROC

        def _make_devices(self) -> None:
            for n in self.nodes:
                n.files = tuple(f"/dev/nvidia{m}" for m in n.minors)
                n.uuids = {m: uuid_of(m) for m in n.minors}

        def _write_config(self) -> None:
            super()._write_config()
            # cgroup v2 hosts without systemd (slurmd makes its own scope folder)
            (self.root / "etc" / "cgroup.conf").write_text(
                "CgroupPlugin=autodetect\nIgnoreSystemd=yes\nIgnoreSystemdOnFailure=yes\n"
                "ConstrainDevices=no\n"
            )

    cg = Path("/sys/fs/cgroup")
    if (cg / "cgroup.subtree_control").exists():
        (cg / "system.slice").mkdir(exist_ok=True)
        for f in (cg / "cgroup.subtree_control", cg / "system.slice" / "cgroup.subtree_control"):
            f.write_text("+cpuset +cpu +memory")
    epilog = render_epilog(PREFIX, shutil.which("docker"))
    rev = tuple(reversed(minors[:2]))  # GRES order nvidia1, nvidia0: index != minor
    t0 = time.monotonic()
    with RealGpuKit(
        PREFIX, gpu_minors=(rev,), epilog=epilog, cpus=8, mem_mb=65536, engines=False
    ) as k:
        print(f"\nSlurm cluster with the host's GPUs up in {time.monotonic() - t0:.2f} s")
        print(subprocess.run(["sinfo", "-N", "-o", "%N %T %G"], env=k.env(),
                             capture_output=True, text=True).stdout)  # fmt: skip
        yield k


def docker_wrapper(folder: Path) -> str:
    """The Docker CLI with the host's userland added to ``docker run`` (the image has
    none of its own); everything else passes through unchanged."""
    real = shutil.which("docker")
    binds = " ".join(
        f"-v {src}:{b['bind']}:{b['mode']}"
        for src, b in hostimage.binds(str(Path(PYTHON).parents[2])).items()
    )
    path = folder / "docker-hostuserland"
    path.write_text(
        "#!/bin/bash\n"
        f'if [ "${{1:-}}" = run ]; then shift; exec {real} run {binds} "$@"; fi\n'
        f'exec {real} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


def project_job(kit, tmp: Path, name: str, command: list[str], gpus: int, env=None):
    project = tmp / name
    project.mkdir(parents=True, exist_ok=True)
    project.chmod(0o777)  # the notebook user writes there (no user-namespace shift here)
    (tmp / "data" / "datasets").mkdir(parents=True, exist_ok=True)
    settings = objects.ContainerInputs(
        name=f"{PREFIX}-alice--{name}",
        image=IMAGE,
        command=command,
        env={"HOME": "/tmp", **(env or {})},
        project_dir=str(project),
        data_root=str(tmp / "data"),
        hf_cache_volume=f"{PREFIX}-hf-alice",
        network=NETWORK,
        port=8888,
        owner="alice",
        pids_limit=4096,
        mem_limit=16 * 2**30,
        labels={"gpulab.instance": PREFIX, "gpulab.owner": "alice", "gpulab.project": name},
    )
    for folder in objects.data_folders(settings):  # the project's own, as the hub makes them
        Path(folder).mkdir(parents=True, exist_ok=True)
        Path(folder).chmod(0o777)
    job = BatchJob(
        cluster=PREFIX,
        container=settings,
        gpus=SlurmGpus(
            count=gpus,
            type="h200",
            nodes=kit.gres(),
            isolation=objects.DEVICES,
            nvidia_proc=str(NVIDIA_PROC),
        ),
        docker=docker_wrapper(tmp),
        engine=NodeEngine(network=True),  # the node checks (or makes) the project network
    )
    log = tmp / f"{name}.log"
    req = JobRequest(name=f"{PREFIX}-{name}", mem_mb=20000, cpus=4, gpus=gpus,
                     gpu_type="h200", output=str(log), chdir=str(tmp))  # fmt: skip
    job_id = kit.slurm().submit(render_script(job), sbatch_args(req))
    return job_id, log


def wait_ended(kit, job_id: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = kit.slurm().status(job_id)
        if st is None or st.ended:
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still running after {timeout} s")


def result(log: Path) -> dict:
    """What the probe wrote into its project folder (the container's own output never
    reaches the job's log: only the batch script's lines do)."""
    out = log.with_suffix("") / "result.json"
    assert out.exists(), log.read_text(errors="replace")
    return json.loads(out.read_text())


def test_two_projects_each_get_their_own_gpu_and_a_third_waits(dk, kit, tmp_path):
    cmd = [PYTHON, "-c", PROBE]
    t0 = time.monotonic()
    a_id, a_log = project_job(kit, tmp_path, "a", cmd, 1, {"HOLD_S": "8"})
    b_id, b_log = project_job(kit, tmp_path, "b", cmd, 1, {"HOLD_S": "8"})
    c_id, c_log = project_job(kit, tmp_path, "c", cmd, 1)
    waiting = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = kit.slurm().status(c_id)
        both = all(kit.slurm().status(j).state == "RUNNING" for j in (a_id, b_id))
        if both and st.state == "PENDING" and "waiting for a GPU" in st.words:
            waiting = st.words
            break
        time.sleep(0.3)
    print(f"third project while both GPUs are taken: {waiting!r}")
    assert waiting is not None, "the first two never ran side by side with the third queued"
    c_queued = time.monotonic()
    for j in (a_id, b_id, c_id):
        wait_ended(kit, j)
    print(f"queue to finished for the third: {time.monotonic() - c_queued:.1f} s "
          f"(total {time.monotonic() - t0:.1f} s)")  # fmt: skip
    a, b, c = result(a_log), result(b_log), result(c_log)
    for name, out in (("a", a), ("b", b), ("c", c)):
        print(f"project {name}: {json.dumps(out)}")
        assert out["count"] == 1 and out["matmul"] > 0 and out["uid"] == 1000
        assert len(out["smi"]) == 1 and out["uuid"] in out["smi"][0].replace("GPU-", "")
        assert out["visible"].startswith("GPU-") and "," not in out["visible"]
    assert a["visible"] != b["visible"]  # never the same GPU at once
    assert {a["visible"], b["visible"]} == {uuid_of(0), uuid_of(1)}
    left = dk.call("containers", all=True, filters={"label": f"gpulab.slurm.cluster={PREFIX}"})
    assert left == []


def test_two_gpu_ddp_job(dk, kit, tmp_path):
    project = tmp_path / "ddp"
    project.mkdir()
    shutil.copy(DDP, project / "train_ddp.py")
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "/workspace/train_ddp.py", "--steps", "400", "--out", "/workspace/ddp-out"]  # fmt: skip
    t0 = time.monotonic()
    job_id, log = project_job(kit, tmp_path, "ddp", cmd, 2, {"GPULAB_PRECISION": "bf16"})
    wait_ended(kit, job_id, timeout=500)
    text = log.read_text(errors="replace")
    print(f"\n2-GPU DDP job through Slurm: {time.monotonic() - t0:.1f} s\n{text[-3000:]}")
    ranks = [json.loads((project / "ddp-out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len({r["uuid"] for r in ranks}) == 2
    for r in ranks:
        assert r["last_loss"] < 0.5 * r["first_loss"], r
    print(f"ranks: {json.dumps(ranks)}")

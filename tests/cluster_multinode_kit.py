"""What the multi-node job test needs besides the cluster and its hub: torch for the
job's containers, a project that has it, and the hub settings of the job network.

Torch is the CPU wheel on this machine's disk (pip's find-links; its dependencies from
pip's configured file indexes: never a network index, so never a CUDA torch from
PyPI), unpacked once into a folder the project keeps (``site/``, on the storage every
node mounts) in a thread while the cluster and the hubs start; the project's
Dockerfile adds one line naming that folder to its Python's path (a ``.pth`` file,
after the image's own packages). Unpacking (about 20 s on this 2-core machine, and
about 40 s to compile its Python files) is faster than building and shipping an image
with torch in it (about 80 s of ``docker build`` for the same files, plus pushing
800 MB and pulling them on each node).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

from cluster_kit import wait_for

from gpulab_hub import hubsettings, images
from gpulab_hub.projects import objects, safe_owner

REPO = Path(__file__).resolve().parents[1]
PROJECT = "mn"
SITE = "site"
# The project's Dockerfile: its own line (below gpulab's managed block) puts the
# project's site/ on its Python's path, after the image's packages.
SITE_LINE = (
    "# torch for multi-node jobs, kept in the project folder (site/)\n"
    "RUN echo /workspace/site > \"$(python3 -c 'import sysconfig; "
    "print(sysconfig.get_path(\"purelib\"))')/project-site.pth\"\n"
)
TRAIN = """\
import os, socket, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
address = socket.gethostbyname(socket.gethostname())
print(f"gpulab-test rank={rank} world={world} WORLD_SIZE={os.environ['WORLD_SIZE']} "
      f"node_rank={os.environ['GROUP_RANK']} address={address} all_reduce={total.item():g} "
      f"args={' '.join(sys.argv[1:])}", flush=True)
dist.destroy_process_group()
"""
FOREVER = "import time\nprint('up', flush=True)\nwhile True:\n    time.sleep(1)\n"


def pip_sources() -> list[str]:
    """pip's own find-links and file indexes (``pip config``), as pip arguments;
    AssertionError if pip names a network index (torch must come from this disk)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    values: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        values.setdefault(name, []).extend(value.strip("'\"").split())
    links = list(dict.fromkeys(values.get("find-links", [])))
    indexes = values.get("index-url", []) + values.get("extra-index-url", [])
    indexes = list(dict.fromkeys(u.rstrip("/") + "/" for u in indexes))
    remote = [u for u in indexes if not u.startswith("file:")]
    assert links and not remote, (
        f"pip must find torch on this disk (find-links {links}, indexes {indexes}): "
        "`pip config list` shows where"
    )
    args = ["--index-url", indexes[0]] if indexes else ["--no-index"]
    for extra in indexes[1:]:
        args += ["--extra-index-url", extra]
    for link in links:
        args += ["--find-links", link]
    return args


def unpack_torch(dest: Path) -> list[str]:
    """torch (CPU) and its dependencies, as wheels unpacked into ``dest``."""
    wheels = dest.with_name(dest.name + "-wheels")
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
            "-d", str(wheels), *pip_sources(), "torch"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_INDEX")}
    subprocess.run(argv, check=True, capture_output=True, text=True, env=env, timeout=600)
    found = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("torch-") and "+cpu" in n for n in found), found
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
    # Compiled once here: the containers cannot write the folder's __pycache__ (it is
    # root's), and each of a node's two Pythons (torchrun, its worker) would compile
    # torch again (about 20 s each on this machine). A few files of the wheels are
    # not Python 3.11 (templates, other versions' code): compileall says 1 for them.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest)],
                   capture_output=True, timeout=900)  # fmt: skip
    return found


class TorchSite:
    """torch unpacked in a thread (started now; ``wait`` joins it)."""

    def __init__(self, dest: Path):
        self.dest = dest
        self.wheels: list[str] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="unpack-torch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.wheels = unpack_torch(self.dest)
        except BaseException as e:  # noqa: BLE001 (handed to the test that waits)
            self.error = e

    def finish(self) -> None:
        """Wait for the thread, whatever it did (a module's end)."""
        self._thread.join(900)

    def wait(self, timeout: float = 600) -> Path:
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        assert not self._thread.is_alive(), "unpacking torch took too long"
        return self.dest


def make_project(projects_root: Path, owner: str, name: str, base_image: str,
                 site: Path, docker_info: dict) -> Path:  # fmt: skip
    """A project folder as the hub makes it (the Dockerfile from gpulab's template, the
    notebook user's), with SITE_LINE in its Dockerfile, ``site`` moved into it, and the
    job scripts."""
    uid, gid = objects.userns_offset(docker_info)
    uid, gid = uid + 1000, gid + 100
    folder = projects_root / safe_owner(owner) / name
    folder.mkdir(parents=True)
    for f in (folder.parent, folder):
        os.chown(f, uid, gid)
    dockerfile = images.render(
        REPO / "images", "project.Dockerfile.j2", base_image=base_image, display_name=name
    )
    files = {
        "Dockerfile": dockerfile + SITE_LINE,
        "train.py": TRAIN,
        "forever.py": FOREVER,
    }
    for rel, text in files.items():
        (folder / rel).write_text(text)
        os.chown(folder / rel, uid, gid)
    os.rename(site, folder / SITE)
    return folder


def job_network(kit) -> dict:
    """The hub's settings of the job network on the kit's fabric: the nodes' eth0, the
    kit's /24, the upper quarter of it for job containers."""
    base = str(kit.net.network_address).rsplit(".", 1)[0]
    return {
        "job_network_parent": "eth0",
        "job_network_subnet": str(kit.net),
        "job_network_range": f"{base}.192/26",
        "job_max_nodes": 2,
    }


def job_boxes(cluster, job_id: str) -> dict[str, list[dict]]:
    """The containers of gpulab job ``job_id`` on each node's engine."""
    return {
        n.name: cluster.node_engine(n.name).call(
            "containers", all=True, filters={"label": [f"gpulab.job={job_id}"]}
        )
        for n in cluster.nodes
    }


def two_node_job(cluster, slurm_hub, user, docker_engine, torch_site: TorchSite) -> dict:
    """The user starts project PROJECT (with torch in its folder) on the cluster's hub,
    then, in a notebook, a 2-node torchrun job, a refused one and a stopped one; checks
    what they see. Returns how long each step took."""
    took: dict[str, float] = {}
    owner = user.name
    t0 = time.monotonic()
    site = torch_site.wait()
    took["torch unpacked (waited for)"] = time.monotonic() - t0
    projects = hubsettings.default_layout(slurm_hub.home).projects_root
    base = slurm_hub.env["GPULAB_BASE_IMAGE"]
    folder = make_project(projects, owner, PROJECT, base, site, docker_engine.call("info"))
    t0 = time.monotonic()
    r = user.api("POST", f"/hub/api/users/{owner}/servers/{PROJECT}", json={"gpus": 0})
    assert r.status_code in (201, 202), r.text
    user.wait_ready(PROJECT)
    took["project start"] = time.monotonic() - t0
    print(f"\nproject started in {took['project start']:.1f} s")

    # The user runs the job and follows it, in a notebook.
    t0 = time.monotonic()
    out = user.execute(
        PROJECT, "%gpu_job run --follow --nodes 2 --gpus-per-node 0 train.py --note hello",
        timeout=300,
    )  # fmt: skip
    took["%gpu_job run --follow (submit to end)"] = time.monotonic() - t0
    print("\n%gpu_job's output:\n" + out)
    ranks = dict(re.findall(r"gpulab-test rank=(\d) (.*)", out))
    assert sorted(ranks) == ["0", "1"], out
    for rank, line in ranks.items():
        assert f"world=2 WORLD_SIZE=2 node_rank={rank} " in line
        assert line.endswith("all_reduce=3 args=--note hello")  # 1 + 2, from both nodes
    (job_id,) = re.findall(r"----- node 1 \(jobs/([0-9a-z-]+)/output-node1.log\)", out)
    addresses = [re.search(r"address=(\S+)", ranks[r]).group(1) for r in ("0", "1")]
    net = job_network(cluster)["job_network_range"].rsplit(".", 1)[0]
    assert addresses == [f"{net}.192", f"{net}.193"]  # the hub's, by node index
    # Each node's output is in the project's jobs folder, written as the notebook user.
    logs = {p.name: p for p in (folder / "jobs" / job_id).glob("output*.log")}
    assert sorted(logs) == ["output-node1.log", "output.log"]
    assert len({p.stat().st_uid for p in logs.values()} | {folder.stat().st_uid}) == 1
    listed = user.execute(PROJECT, "!gpulab-job list")
    print("gpulab-job list:", listed)
    assert re.search(
        rf"{job_id}  succeeded .* train.py --note hello --nodes 2 --gpus-per-node 0 "
        r"\(finished on 2 nodes\)",
        listed,
    ), listed
    # Slurm ran it on both nodes (the hub's API, asked as its owner); nothing of it is
    # left on either.
    view = user.api("GET", f"/hub/api/gpulab/cluster/jobs/{owner}/{PROJECT}/{job_id}").json()
    assert (view["state"], view["nodelist"], view["addresses"]) == (
        "COMPLETED", f"{cluster.prefix}-n[1-2]", addresses,
    )  # fmt: skip
    assert job_boxes(cluster, job_id) == {n.name: [] for n in cluster.nodes}

    # More nodes than the administrator allows: refused, in words, before Slurm.
    refused = user.execute(
        PROJECT,
        "try:\n    get_ipython().run_line_magic('gpu_job', 'run --nodes 3 train.py')\n"
        "except Exception as e:\n    print('refused:', e)",
    )
    assert refused.strip() == (
        "refused: --nodes 3: a job on this cluster may use at most 2 nodes (the "
        "administrator's limit). Ask for fewer."
    )

    # A job that runs until stopped (from a terminal's words): stop ends it on every node.
    started = user.execute(PROJECT, "!gpulab-job run --nodes 2 forever.py")
    (forever,) = re.findall(r"Started job ([0-9a-z-]+)", started)
    t0 = time.monotonic()
    wait_for("the job's containers on both nodes",
             lambda: all(job_boxes(cluster, forever).values()), timeout=120)  # fmt: skip
    took["second job: submit to containers on both nodes"] = time.monotonic() - t0
    t0 = time.monotonic()
    stopped = user.execute(PROJECT, f"!gpulab-job stop {forever}")
    assert re.search(rf"{forever}  stopped .*\(stopped by its user\)", stopped), stopped
    wait_for("no container of the stopped job on any node",
             lambda: not any(job_boxes(cluster, forever).values()), timeout=30)  # fmt: skip
    took["stop to no container"] = time.monotonic() - t0
    user.stop_project(PROJECT)
    return took

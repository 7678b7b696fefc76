"""What the fault tests share: a recorded Docker engine (the few calls the GPU
reservation path makes, answered in the shapes Docker answers them) and a GPU
inventory made of plain data (gpus.Device), never a fake NVML."""

from __future__ import annotations

import itertools
import threading
import time

import docker.errors

from gpulab_hub import gpus
from gpulab_hub.projects import objects

PREFIX = "gpulabfault"
H100 = "NVIDIA H100 80GB HBM3"


def gpu(i: int) -> gpus.Device:
    return gpus.Device(
        index=str(i), uuid=f"GPU-{i:04d}-fault", name=H100, memory_total=80 << 30,
        capability="9.0", minor=i,
    )  # fmt: skip


def inventory(n: int) -> gpus.Inventory:
    return gpus.Inventory(devices=[gpu(i) for i in range(n)], driver="570.0", cuda="12.8")


class RecordedDocker:
    """``docker_call(method, *args, **kw)`` for containers / inspect_container / info.

    Containers are kept as Docker keeps them: created, then running, gone when
    removed (or when they vanish: a crash with --rm, an admin's ``docker rm -f``).
    """

    RUNTIMES = {"runc": {"path": "runc"}, "nvidia": {"path": "nvidia-container-runtime"}}

    def __init__(self, clock=time.time):
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._clock = clock
        self.boxes: dict[str, dict] = {}  # id -> container
        self.calls: list[str] = []

    def __call__(self, method: str, *args, **kw):
        with self._lock:
            self.calls.append(method)
            return getattr(self, "_" + method)(*args, **kw)

    # --- what the hub asks -------------------------------------------------------

    def _containers(self, all: bool = False, filters: dict | None = None, **_):
        wanted = (filters or {}).get("label", [])
        wanted = [wanted] if isinstance(wanted, str) else list(wanted)
        out = []
        for cid, c in self.boxes.items():
            if not all and c["state"] != "running":
                continue
            if any(c["labels"].get(k) != v for k, _, v in (w.partition("=") for w in wanted)):
                continue
            out.append(
                {
                    "Id": cid,
                    "Names": [f"/{c['name']}"],
                    "Image": c["image"],
                    "Created": int(c["created"]),
                    "State": c["state"],
                    "Status": "Up 2 seconds" if c["state"] == "running" else "Created",
                    "Labels": dict(c["labels"]),
                }
            )
        return out

    def _inspect_container(self, cid: str):
        c = self.boxes.get(cid) or next((b for b in self.boxes.values() if b["name"] == cid), None)
        if c is None:
            raise docker.errors.NotFound(f"No such container: {cid}")
        env = c["spec"]["environment"]
        requests = c["spec"]["host_config"].get("device_requests") or []
        return {
            "Id": c["id"],
            "Name": f"/{c['name']}",
            "Created": time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(c["created"])),
            "State": {"Status": c["state"], "Running": c["state"] == "running"},
            "Config": {
                "Env": [f"{k}={v}" for k, v in env.items()],
                "Labels": dict(c["labels"]),
            },
            "HostConfig": {
                "DeviceRequests": [
                    {
                        "Driver": r["driver"],
                        "Count": 0,
                        "DeviceIDs": list(r["device_ids"]),
                        "Capabilities": r["capabilities"],
                    }
                    for r in requests
                ]
                or None
            },
        }

    def _info(self):
        return {"Runtimes": self.RUNTIMES, "SecurityOptions": ["name=seccomp,profile=builtin"]}

    # --- what the spawner (or the world) does ------------------------------------

    def create(self, owner: str, project: str, assignment: objects.GpuAssignment) -> str:
        """A project container as the spawner creates it (objects.container_spec)."""
        spec = project_spec(owner, project, assignment)
        with self._lock:
            if any(b["name"] == spec["name"] for b in self.boxes.values()):
                raise docker.errors.APIError(f"Conflict: {spec['name']} is already in use")
            cid = f"{next(self._ids):064x}"
            self.boxes[cid] = {
                "id": cid,
                "name": spec["name"],
                "image": spec["image"],
                "labels": spec["labels"],
                "spec": spec,
                "state": "created",
                "created": self._clock(),
            }
        return cid

    def start(self, cid: str) -> None:
        with self._lock:
            self.boxes[cid]["state"] = "running"

    def remove(self, cid: str) -> None:
        with self._lock:
            self.boxes.pop(cid, None)


def project_spec(
    owner: str, project: str, assignment: objects.GpuAssignment, prefix: str = PREFIX, **kw
) -> dict:
    """The container spec ProjectSpawner builds (objects.container_spec) for a project."""
    settings = objects.ContainerInputs(
        **{
            "name": f"{prefix}-{owner}--{project}",
            "image": f"{prefix}/project:x",
            "command": ["jupyterhub-singleuser"],
            "env": {},
            "project_dir": f"/tmp/{prefix}/{owner}/{project}",
            "data_root": f"/tmp/{prefix}/data",
            "hf_cache_volume": f"{prefix}-hf-{owner}",
            "network": f"{prefix}-net",
            "port": 8888,
            "owner": owner,
            "labels": {
                "gpulab.instance": prefix,
                "gpulab.owner": owner,
                "gpulab.project": project,
            },
            "gpus": assignment,
            **kw,
        }
    )
    return objects.container_spec(settings)

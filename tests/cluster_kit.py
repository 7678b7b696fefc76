"""A real Slurm cluster on this machine, for tests: munged, slurmctld and two slurmd
nodes, each node in network and UTS namespaces the kit makes, with dummy GPU device
nodes listed as GRES ``gpu``.

Everything is named with the test prefix and lives under ``<tmp>/<prefix>-slurm/``:
the munge key and socket, slurm.conf/gres.conf/cgroup.conf (SLURM_CONF points
there), the controller's state, each node's spool, the logs, the namespaces (files
bind-mounted by ``unshare``), the device nodes and the fake NVIDIA /proc files.

Network: the nodes' veths and one veth from this host meet on a bridge inside a
"fabric" namespace of the kit's own (so this host's firewall, whose FORWARD policy
may drop bridged traffic, is never involved and never touched). This host gets one
interface with one address on a private /24 (its link route and nothing else);
slurmctld runs here and listens on it, each slurmd runs in its node's namespaces
(``nsenter --net --uts``, never ``ip netns exec``, which remounts /sys and breaks
slurmd's cgroup code) with the node name as its host name.

Process tracking is ``proctrack/linuxproc`` and ``task/none``: two slurmd on one
kernel would share cgroup paths. GRES index and device minor differ on purpose
(node 2 lists nvidia3 before nvidia2): Slurm's index is the position in the list.
The fake ``information`` files carry minors that are distinct across the nodes (they
share one /proc here), so a batch script reading them finds one GPU per minor.

``SlurmKit.start`` removes what an earlier crashed run of the same prefix left
(daemons whose command line names the kit's folder, processes in its namespaces,
the namespaces, the interface, the folder), starts everything and waits until sinfo
shows every node idle; ``stop`` ends every process it started (by the PID and start
time it recorded) and every process left in its node namespaces, then removes the
namespaces, the interface and the folder.

Docker (``engines=True``, the default; tests/cluster_engines.py has the details):
each node runs its own Docker engine (a containerd and a dockerd of the kit's own,
in the node's network and UTS namespaces, ``--userns-remap=default``, its data and
exec roots under ``<root>/<node>/``), and a registry (Debian's ``docker-registry``)
carries images from this machine's engine to the nodes. With engines, each node's
daemons (slurmd, containerd, dockerd) also run in a mount namespace of the node's own
(``<root>/ns/<node>-mnt``, private propagation) whose /dev is the node's: the
essentials, the node's GPUs at ``/dev/nvidia<minor>`` and the driver's control devices,
as a real GPU node has them. An engine that remaps users makes a container's device
from the path the container sees (``/dev/nvidia3``), never from the path it is given
(the kit's device files), so the node must have it there. The engines' overlay and
network-namespace mounts live in that namespace (``node_mounts``), and go with it.
The API other tests use:

- ``kit.node_docker_host(node)``: ``"unix://<root>/<node>/docker.sock"``, the node's
  engine; ``kit.node_docker_host_template`` is the same with ``{node}`` (the form of
  the spawner's ``node_docker_host`` setting); ``kit.node_engine(node)``: gpulab's
  Docker client for it.
- ``kit.registry``: ``127.0.0.1:<port>``, read-write, where this machine's engine
  pushes; ``kit.registry_for_nodes``: ``<host address>:<port>``, the same storage,
  read-only, password required (what the node engines pull from; they list it as an
  insecure registry).
- ``kit.node_docker_config``: a folder holding a Docker ``config.json`` with that
  password (``docker --config <folder> pull ...`` on a node).
- ``kit.node_docker_cli``: a script standing in for the Docker CLI in batch scripts
  and Epilogs: it runs ``docker`` against the engine of ``$SLURMD_NODENAME`` with
  that config (until the batch script sets DOCKER_HOST itself).
- ``kit.host_address``: this host's address on the fabric (the controller's, the
  registry's for nodes); ``kit.node_address(node)``: a node's.
- ``kit.push(image)``: tags ``<prefix>/...:tag`` of this machine's engine into
  ``kit.registry``, pushes it, and returns ``(reference for the nodes by digest,
  seconds)``: ``<registry_for_nodes>/<repo>@sha256:...``.
- ``kit.engine_seconds``: how long the node engines took to answer.
- ``tiny_image_tar(path)`` and ``http_answer(port, text)`` (cluster_images.py): an 11 MB
  root file system (sleep, perl) to import as an image, and a command that answers HTTP.
- ``wait_for(what, check)``: ``check()``'s first true value, polled (bounded).

Stop removes every container on the node engines, ends the dockerds, containerds and
registries, untags what ``push`` tagged on this machine's engine (never anything
else there: that engine is never stopped or cleaned), unmounts what the engines
mounted under the folder and removes it. A crashed run's engines, their containers
(children of their shims), shim sockets, mounts and registry tags are removed by
the next start of the same prefix.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cluster_engines
from cluster_engines import KitError, NodeEngines, free_port
from cluster_procs import is_nsfs, kill, with_descendants

from gpulab_hub import host, pidfile
from gpulab_hub.cluster import batch
from gpulab_hub.cluster.batch import NodeGpus
from gpulab_hub.cluster.slurm import DEFAULT_PATH, Slurm

GPU_MAJOR = 195  # the NVIDIA driver's character-device major; no driver here: ENXIO
GPU_TYPE = "h200"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "nsenter", "unshare", "ip")
ENGINE_PROGRAMS = ("containerd", "dockerd", "docker", "docker-registry")

# A node's /dev as a GPU node has it (run in the node's new mount namespace, the node's
# minors as arguments): the essentials a container's engine binds from its host's /dev,
# the GPUs at /dev/nvidia<minor>, the driver's control devices (the kit's GPUs are device
# files with no driver behind them).
NODE_DEV = f"""set -e
mount -t tmpfs -o mode=755,size=1m gpulab-node-dev /dev
for d in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=: read -r name major minor <<< "$d"; mknod -m 666 "/dev/$name" c "$major" "$minor"
done
mkdir /dev/pts /dev/shm && mount -t tmpfs -o mode=1777 gpulab-node-shm /dev/shm
ln -s /proc/self/fd /dev/fd
for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${{i%%:*}}" "/dev/${{i#*:}}"; done
for m in "$@"; do mknod -m 666 "/dev/nvidia$m" c {GPU_MAJOR} "$m"; done
mknod -m 666 /dev/nvidiactl c {GPU_MAJOR} 255
mknod -m 666 /dev/nvidia-uvm c {GPU_MAJOR} 254
mknod -m 666 /dev/nvidia-uvm-tools c {GPU_MAJOR} 253
"""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise KitError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"----- {path.name}: (none)"
    return f"----- {path.name} (last {lines} lines)\n" + "\n".join(text.splitlines()[-lines:])


@dataclass
class KitNode:
    name: str
    address: str
    minors: tuple[int, ...]
    files: tuple[str, ...] = ()
    uuids: dict[int, str] = field(default_factory=dict)  # minor -> fake UUID


class SlurmKit(NodeEngines):
    """One test cluster. Use as a context manager (start, yield, stop)."""

    def __init__(
        self,
        prefix: str,
        gpu_minors: tuple[tuple[int, ...], ...] = ((0,), (3, 2)),
        epilog: str | None = None,
        cpus: int = 2,
        mem_mb: int = 1024,
        def_mem_per_cpu_mb: int = 256,
        root: Path | None = None,
        idle_timeout: float = 30,
        engines: bool = True,
    ):
        if not re.fullmatch(r"gpulab[a-z0-9]{0,20}", prefix):
            raise KitError(f"test prefix {prefix!r}: 'gpulab' and up to 20 letters or digits")
        every = [m for minors in gpu_minors for m in minors]
        if len(every) != len(set(every)):
            raise KitError("GPU minors must be distinct across nodes (one fake /proc here)")
        self.prefix = prefix
        self.cluster = prefix
        self.root = root or Path(tempfile.gettempdir()) / f"{prefix}-slurm"
        digest = hashlib.sha1(prefix.encode()).hexdigest()
        self.host_if = f"sk{digest[:8]}"  # 10 characters (Linux allows 15)
        self.net = self._pick_subnet(int(digest[8:14], 16))
        hosts = list(self.net.hosts())
        self.controller_address = str(hosts[0])
        self.nodes = [
            KitNode(f"{prefix}-n{i + 1}", str(hosts[10 + i]), tuple(minors))
            for i, minors in enumerate(gpu_minors)
        ]
        self.epilog = epilog
        self.cpus, self.mem_mb, self.def_mem = cpus, mem_mb, def_mem_per_cpu_mb
        self.idle_timeout = idle_timeout
        self.ctld_port = self.slurmd_port = 0
        self._procs: dict[str, subprocess.Popen] = {}
        self.engines = engines
        self.registry_port = self.node_registry_port = 0
        self.engine_seconds = 0.0
        self.start_seconds = 0.0
        self._main: host.Docker | None = None
        # Checks that modules sharing this kit (``shared_kit``) run once it has stopped.
        self.after_stop: list[Callable[[], None]] = []

    # --- paths -----------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def nvidia_proc(self) -> Path:
        return self.root / "nvidia-proc"

    @property
    def epilog_path(self) -> Path:
        return self.root / "epilog.sh"

    def ns(self, name: str, kind: str) -> Path:
        return self.root / "ns" / f"{name}-{kind}"

    def slurm(self) -> Slurm:
        """gpulab's Slurm client for this cluster."""
        return Slurm(conf=str(self.conf), path=DEFAULT_PATH)

    def env(self) -> dict[str, str]:
        """Environment for Slurm's commands run by a test."""
        return {"PATH": DEFAULT_PATH, "SLURM_CONF": str(self.conf), "LC_ALL": "C.UTF-8"}

    def gres(self) -> tuple[NodeGpus, ...]:
        """Each node's GPU device files in GRES order (what batch.SlurmGpus needs)."""
        return tuple(NodeGpus(n.name, n.files) for n in self.nodes)

    # --- start and stop --------------------------------------------------------------

    def __enter__(self) -> SlurmKit:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        wanted = PROGRAMS + (ENGINE_PROGRAMS if self.engines else ())
        missing = [c for c in wanted if shutil.which(c, path=DEFAULT_PATH) is None]
        if missing:
            raise KitError(
                f"{', '.join(missing)} not installed: `scripts/setup.sh test` installs "
                "Debian's slurm-wlm, munge, docker.io and docker-registry"
            )
        started = time.monotonic()
        self.clean_leftovers()
        for sub in ("etc", "state", "log", "ns", "pids", "dev", "out"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        try:
            self._make_devices()
            self._write_config()
            self._start_munge()
            self._make_network()
            if self.engines:
                self._make_node_dev()
                self._start_engines()
            self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            for n in self.nodes:
                self._start(n.name, [*self._in_node(n), "slurmd", "-D", "-f", str(self.conf)])
            self.wait_idle()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Everything the kit started ends; its namespaces, interface and folder go."""
        for n in self.nodes:
            self._stop_started(n.name)
        self._stop_engines()
        self._kill_in_namespaces()
        for name in ("registry-ro", "registry-rw", "slurmctld", "munged"):
            self._stop_started(name)
        self.clean_leftovers()

    def _stop_started(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        me = pidfile.read(self.root / "pids" / f"{name}.pid")
        if isinstance(me, pidfile.Identity) and me.pid == proc.pid:
            host.stop_pid(proc.pid, timeout=10, expect=me)
        proc.wait(timeout=15)

    # --- leftovers -------------------------------------------------------------------

    def _ours(self) -> list[int]:
        """PIDs whose command line names the kit's folder or that run in its namespaces,
        and their descendants (a node engine's containers are its shims' children)."""
        wanted = str(self.root).encode()
        namespaces = set()
        for f in (self.root / "ns").glob("*-net") if (self.root / "ns").is_dir() else ():
            st = os.stat(f)
            if st.st_size == 0 and is_nsfs(f):
                namespaces.add((st.st_dev, st.st_ino))
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if wanted in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
                    continue
                st = os.stat(entry / "ns" / "net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in namespaces:
                found.append(int(entry.name))
        return with_descendants(found)

    def _kill_in_namespaces(self) -> None:
        seen: dict[int, pidfile.Identity] = {}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            # Found afresh each round, and kept from the round before: a container's
            # first process ignores TERM and is no shim's child once its shim is gone.
            for pid in self._ours():
                ident = pidfile.identity(pid)
                if ident is not None:
                    seen.setdefault(pid, ident)
            live = [p for p, ident in seen.items() if pidfile.identity(p) == ident]
            if not live:
                return
            for pid in live:
                kill(pid, sig)
            # TERM lets a job's script run its trap; slurmstepd waits for KILL.
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and any(
                pidfile.identity(p) == seen[p] for p in live
            ):
                time.sleep(0.1)

    def clean_leftovers(self) -> None:
        """Remove what a run of this prefix left: processes, namespaces, interface, folder."""
        if self.root.exists():
            self._kill_in_namespaces()
            for sock in cluster_engines.shim_sockets(self.root):
                cluster_engines.remove_file(sock)
            # Overlays under the engines' data roots, their network namespaces, ours.
            cluster_engines.unmount_under(self.root)
        if self.engines:
            cluster_engines.remove_registry_tags(self.main_engine, self.prefix)
        # The interface goes with the fabric namespace (its veth peer), a moment later.
        _run("ip", "link", "del", self.host_if, check=False)
        deadline = time.monotonic() + 5
        while _run("ip", "link", "show", self.host_if, check=False).returncode == 0:
            if time.monotonic() > deadline:
                raise KitError(f"interface {self.host_if} is still there")
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- pieces ----------------------------------------------------------------------

    @staticmethod
    def _pick_subnet(seed: int) -> ipaddress.IPv4Network:
        used = []
        for line in _run("ip", "-o", "-4", "route", "show", "table", "all").stdout.splitlines():
            dest = line.split()[0]
            if dest[0].isdigit():
                used.append(ipaddress.ip_network(dest, strict=False))
        for i in range(256):
            s = (seed + i * 7919) % 65536
            net = ipaddress.ip_network(f"10.{200 + s % 50}.{s // 50 % 256}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
        raise KitError("no free private /24 for the test cluster")

    def _make_devices(self) -> None:
        for n in self.nodes:
            folder = self.root / "dev" / n.name
            folder.mkdir(parents=True)
            files = []
            for minor in n.minors:
                path = folder / f"nvidia{minor}"
                os.mknod(path, 0o600 | 0o020000, os.makedev(GPU_MAJOR, minor))
                files.append(str(path))
                n.uuids[minor] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{n.name}.{minor}"))
                info = self.nvidia_proc / f"{n.name}-{minor}" / "information"
                info.parent.mkdir(parents=True)
                info.write_text(
                    f"Model: \t\t NVIDIA H200 (test kit)\nGPU UUID: \t {n.uuids[minor]}\n"
                    f"Device Minor: \t {minor}\n"
                )
            n.files = tuple(files)

    def _write_config(self) -> None:
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        r = self.root
        lines = [
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.controller_address})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/state/slurmctld.pid",
            f"SlurmdPidFile={r}/spool/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
            f"DefMemPerCPU={self.def_mem}",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=300",
            "InactiveLimit=0",
        ]
        if self.epilog is not None:
            self.epilog_path.write_text(self.epilog)
            self.epilog_path.chmod(0o755)
            lines.append(f"Epilog={self.epilog_path}")
        gres = []
        for n in self.nodes:
            (r / "spool" / n.name).mkdir(parents=True)
            lines.append(
                f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.address} "
                f"CPUs={self.cpus} RealMemory={self.mem_mb} "
                f"Gres=gpu:{GPU_TYPE}:{len(n.files)} State=UNKNOWN"
            )
            gres += [f"NodeName={n.name} Name=gpu Type={GPU_TYPE} File={f}" for f in n.files]
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName=gpu Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (r / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        # Read by slurmd; the plugins above use no cgroup.
        (r / "etc" / "cgroup.conf").write_text("CgroupPlugin=autodetect\nConstrainDevices=no\n")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        finally:
            log.close()
        self._procs[name] = proc
        if not pidfile.write(self.root / "pids" / f"{name}.pid", proc.pid):
            raise KitError(f"{name} exited at once:\n{self.logs()}")

    def _in_node(self, n: KitNode) -> list[str]:
        """nsenter into the node's namespaces (with engines, its mount namespace too)."""
        argv = ["nsenter", f"--net={self.ns(n.name, 'net')}", f"--uts={self.ns(n.name, 'uts')}"]
        return [*argv, f"--mount={self.ns(n.name, 'mnt')}"] if self.engines else argv

    def _make_node_dev(self) -> None:
        """Each node's mount namespace, its /dev the node's (NODE_DEV)."""
        for n in self.nodes:
            mnt = self.ns(n.name, "mnt")
            mnt.touch()
            _run("unshare", f"--mount={mnt}", "--propagation", "private",
                 "bash", "-c", NODE_DEV, "node-dev", *(str(m) for m in n.minors))  # fmt: skip

    def node_mounts(self, node: str) -> list[str]:
        """Mount points in a node's mount namespace (with engines) under the kit's folder."""
        mnt = self.ns(self.node(node).name, "mnt")
        done = _run("nsenter", f"--mount={mnt}", "cat", "/proc/self/mountinfo")
        inside = f"{self.root}/"
        return [p for p in (x.split()[4] for x in done.stdout.splitlines()) if p.startswith(inside)]

    def _start_munge(self) -> None:
        d = self.root / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, os.urandom(1024))
        finally:
            os.close(fd)
        self._start(
            "munged",
            [
                "munged", "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed",
                f"--log-file={self.root}/log/munged.log",
            ],
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline or self._procs["munged"].poll() is not None:
                raise KitError(f"munged did not start:\n{self.logs()}")
            time.sleep(0.05)

    def _make_network(self) -> None:
        fabric = self.ns("fabric", "net")
        fabric.touch()
        _run("unshare", f"--net={fabric}", "true")
        _run("nsenter", f"--net={fabric}", "ip", "link", "add", "br0", "type", "bridge")
        _run("nsenter", f"--net={fabric}", "ip", "link", "set", "br0", "up")
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "host",
             "netns", str(fabric))  # fmt: skip
        _run("nsenter", f"--net={fabric}", "ip", "link", "set", "host", "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.controller_address}/24", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        for i, n in enumerate(self.nodes):
            net, uts = self.ns(n.name, "net"), self.ns(n.name, "uts")
            net.touch()
            uts.touch()
            _run("unshare", f"--net={net}", f"--uts={uts}", "hostname", n.name)
            port = f"n{i + 1}"
            _run("ip", "link", "add", port, "netns", str(fabric), "type", "veth",
                 "peer", "name", "eth0", "netns", str(net))  # fmt: skip
            _run("nsenter", f"--net={fabric}", "ip", "link", "set", port, "master", "br0", "up")
            inside = ["nsenter", f"--net={net}", "ip"]
            _run(*inside, "link", "set", "lo", "up")
            _run(*inside, "addr", "add", f"{n.address}/24", "dev", "eth0")
            _run(*inside, "link", "set", "eth0", "up")

    def wait_idle(self, timeout: float | None = None) -> None:
        """Until sinfo shows every node idle and responding (bounded: timeout, else the
        kit's idle_timeout), else KitError with the logs."""
        client = self.slurm()
        timeout = self.idle_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        seen = "nothing"
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise KitError(f"{name} exited ({proc.returncode}):\n{self.logs()}")
            done = client.call("sinfo", "--noheader", "-N", "--format=%N|%T|%G|%E")
            seen = (done.stdout + done.stderr).strip()
            if done.returncode == 0:
                nodes = {n.name: n for n in client.nodes()}
                if all(
                    n.name in nodes and nodes[n.name].state == "idle" and not nodes[n.name].flag
                    for n in self.nodes
                ):
                    return
            time.sleep(0.2)
        raise KitError(
            f"the test cluster's nodes were not idle after {timeout:g} s; "
            f"sinfo says:\n{seen}\n{self.logs()}"
        )

    def logs(self) -> str:
        """The tails of every daemon's log, for failure messages."""
        files = sorted((self.root / "log").glob("*")) if (self.root / "log").is_dir() else []
        return "\n".join(_tail(f) for f in files) or "(no logs)"


def shared_kit(prefix: str) -> Iterator[SlurmKit]:
    """The test cluster that the modules without a cluster of their own share in one
    session (conftest's ``shared_cluster``: tests/test_cluster_kit.py, the cluster hub's
    module, the doctor's): started at its first use, stopped at the session's end, then
    the checks those modules added to ``kit.after_stop`` run. Its registry and node
    engines keep what the modules sent there (the Debian layer the kit's tests push is
    the project image's first), so the hub's push and node 2's pull skip it. Each module
    writes its own Epilog (``epilog_path``) and leaves no container of its jobs."""
    kit = SlurmKit(prefix, mem_mb=4096)
    kit.epilog = batch.render_epilog(kit.cluster, docker_host=kit.node_docker_host_template)
    with kit:
        yield kit
    for check in kit.after_stop:
        check()


def wait_for(what: str, check, timeout: float = 60, every: float = 0.2):
    """``check()``'s first true value, asked every ``every`` seconds; AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)

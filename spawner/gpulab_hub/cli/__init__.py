"""The ``gpulab`` command: up, down, status."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import requests

from gpulab_hub import (
    blocking,
    egress,
    host,
    hubconfig,
    hubfiles,
    hubsettings,
    pidfile,
    settings,
    settingvalues,
    tls,
)
from gpulab_hub.cli import backup as cli_backup
from gpulab_hub.cli import cluster as cli_cluster
from gpulab_hub.cli import db as cli_db
from gpulab_hub.cli import gpus as cli_gpus
from gpulab_hub.cli import images as cli_images
from gpulab_hub.cli import orphans
from gpulab_hub.doctor.cli import add_parser as add_doctor_parser
from gpulab_hub.gpus import allocator
from gpulab_hub.gpus import inventory as gpu_inventory
from gpulab_hub.images import base as baseimage
from gpulab_hub.images import confine

INSTANCE_LABEL = "gpulab.instance"
HUB_PIDFILE = "gpulab-hub.pid"


def repo_dir() -> Path:
    """The checkout holding jupyterhub_config.py and images/ (the hub's own files)."""
    return hubsettings.config_file().parent


def local_url(bind_url: str) -> str:
    """bind_url as reachable from this machine (0.0.0.0 -> 127.0.0.1)."""
    u = urlparse(bind_url)
    hostname = "127.0.0.1" if u.hostname in (None, "0.0.0.0", "::") else u.hostname
    return f"{u.scheme}://{hostname}:{u.port or 80}{u.path or '/'}"


def hub_process(hub_dir: Path) -> tuple[pidfile.Identity | None, str]:
    """(the hub `gpulab up` started, if it still runs; why its PID file is stale, if so)."""
    return pidfile.check(hub_dir / HUB_PIDFILE, "jupyterhub")


def hub_pid(hub_dir: Path) -> int | None:
    me, _ = hub_process(hub_dir)
    return me.pid if me else None


def wait_for_hub(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    api = url.rstrip("/") + "/hub/api/"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text().splitlines()[-15:]
            raise host.HostError("The hub exited at start. Last log lines:\n" + "\n".join(tail))
        try:
            if requests.get(api, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise host.HostError(f"The hub did not answer at {api} within {timeout:.0f} s; see {log_path}")


def base_spec(s: settings.Settings) -> baseimage.BaseSpec:
    """The base image this host needs: GPU variant for its GPUs, else CPU only."""
    inv = gpu_inventory()
    if inv.devices:
        names = sorted({d.name for d in inv.gpus})
        print(f"GPUs: {len(inv.gpus)} ({', '.join(names)}), driver {inv.driver}")
    else:
        print(f"GPUs: none ({inv.problem})")
    return base_spec_for(s, inv)


def base_spec_for(s: settings.Settings, inv) -> baseimage.BaseSpec:
    """The base image for these settings and this GPU inventory (pure). Left unset,
    GPULAB_BASE_FROM and GPULAB_TORCH follow the host: on a GPU host a CUDA image
    and PyPI's CUDA torch, so ``torch.cuda.is_available()`` holds in a new project;
    without GPUs the local Debian and no torch."""
    caps = tuple(inv.capabilities)
    i = s.images
    gpu = bool(caps or i.torch_cuda_arch_list)
    return baseimage.BaseSpec(
        base_image=i.base_from or baseimage.default_from(gpu),
        capabilities=caps,
        gpu_names=tuple(sorted({d.name for d in inv.gpus})),
        arch_list=i.torch_cuda_arch_list,
        torch=i.torch or ("torch" if gpu else ""),
    )


UP_LOCK = "gpulab-up.lock"


def cmd_up(args, environ) -> int:
    """Start gpulab, one ``gpulab up`` of a hub at a time: set-up takes minutes (the
    Docker engine, the firewall, the base image) before the hub writes its PID file, so
    a second one started meanwhile is refused instead of starting a second hub."""
    s = settings.parse(environ)
    hub_dir = s.hub_dir  # the hub process's own files: database, log, PID file
    hub_dir.mkdir(parents=True, exist_ok=True)
    lock = blocking.file_lock(hub_dir / UP_LOCK, "gpulab up of this hub", timeout=0)
    try:
        lock.acquire()
    except blocking.Busy:
        print(
            f"Another `gpulab up` of this hub ({hub_dir}) is under way: wait for it to "
            "say where gpulab runs (`gpulab status` tells), or stop it.",
            file=sys.stderr,
        )
        return 1
    try:
        return _up(args, environ, s, hub_dir)
    finally:
        lock.release()


def _up(args, environ, s: settings.Settings, hub_dir: Path) -> int:
    where = hubsettings.load(hubsettings.config_file())
    host.ensure_data_root(where.data_root)
    where.projects_root.mkdir(parents=True, exist_ok=True)
    # From here on, what gpulab up and the hub make is private (the hub folder's files).
    os.umask(hubfiles.UMASK)
    hubfiles.protect(hub_dir)
    url = local_url(s.bind_url)
    if hub_pid(hub_dir):
        print(f"gpulab is already running at {url}")
        return 0
    if tls.wanted(s):
        tls.site_of(s.public_url)  # a bad URL is refused before anything starts
        if not Path(tls.CADDY).is_file():
            raise host.HostError(
                f"GPULAB_PUBLIC_URL={s.public_url} needs Caddy, the HTTPS proxy gpulab "
                "runs in front of the hub: run scripts/setup.sh (or apt-get install caddy)."
            )

    dk = host.Docker()
    if host.ensure_dockerd(dk, hub_dir):
        print("Started the Docker engine (dockerd).")
    if not host.build_confined(dk.call("info")):
        print(
            "This Docker engine was not started by gpulab and does not confine image builds: "
            'projects will not build on it (docs/security.md, "Builds").',
            file=sys.stderr,
        )
    network = where.network
    host.ensure_network(dk, network)
    no_ipv6 = host.ensure_firewall(dk, network, s.hub_port, egress.policy_of(s))
    if no_ipv6:
        print(f"No IPv6 rules for projects and builds: {no_ipv6} (gpulab doctor)", file=sys.stderr)
    for name in confine.remove_stale(dk.call, network):
        print(f"Removed the build network {name} an earlier hub left behind")
    # The hub's API listens on the network's gateway (hubconfig.with_hub_ip); the hub
    # process is told where, so its config file need not ask Docker again.
    env = {**environ, "GPULAB_HUB_IP": hubconfig.with_hub_ip(s).hub_ip}
    host.ensure_base_image(dk, repo_dir(), hub_dir, base_spec(s), where.base_image, network=network)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log_path = hub_dir / "hub.log"
    config = repo_dir() / "jupyterhub_config.py"
    cmd = [sys.executable, "-m", "jupyterhub", "-f", str(config)]
    if args.foreground:
        os.chdir(hub_dir)
        os.execve(sys.executable, cmd, env)
    # What the hub leaves orphaned if it fails to start becomes ours to stop (orphans.py)
    orphans.become_subreaper()
    before = orphans.children()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=hub_dir, env=env, stdout=log, stderr=log, start_new_session=True
        )
    pidfile.write(hub_dir / HUB_PIDFILE, proc.pid)
    try:
        wait_for_hub(url, proc, log_path)
    except host.HostError:
        host.stop_pid(proc.pid)
        (hub_dir / HUB_PIDFILE).unlink(missing_ok=True)
        for what in orphans.stop_left_behind(before):
            print(f"Stopped what the hub had started: {what}", file=sys.stderr)
        raise

    if tls.wanted(s):
        url = s.public_url.rstrip("/") + "/"
        say_https(s, tls.site_of(s.public_url))
    print(f"gpulab is running: open {url}")
    pw_file = s.admin_password_file
    if pw_file.exists():
        name, password = pw_file.read_text().splitlines()[:2]
        pw_file.unlink()
        print(f"Log in as {name!r} with the password {password}")
        print("(shown only this once: keep it; change it at /hub/change-password)")
    else:
        print(f"Log in as {s.accounts.admin!r} with the admin password set at the first start.")
    print(f"Others sign up at {url.rstrip('/')}/hub/signup; approve them at /hub/authorize.")
    port = s.ssh.port
    if port:
        where_ssh = urlparse(url).hostname
        print(f"SSH into a project: ssh -p {port} <you>+<project>@{where_ssh} "
              f"(add your key at {url.rstrip('/')}/hub/gpulab/ssh)")  # fmt: skip
    print(f"Hub log: {log_path}. Stop with: gpulab down")
    if not s.public_url:
        print(how_to_open(s))
    return 0


def say_https(s: settings.Settings, site, timeout: float = 30) -> None:
    """What people need to reach the hub over HTTPS: for Caddy's internal CA, the root
    certificate to install (Caddy writes it as it first starts)."""
    if not site.internal:
        print(f"Caddy serves HTTPS for {site.host} and <user>.{site.host} with "
              "certificates from Let's Encrypt or ZeroSSL (ACME): point both names at "
              "this machine.")  # fmt: skip
        return
    root = tls.root_certificate(s)
    deadline = time.monotonic() + timeout
    while not root.is_file() and time.monotonic() < deadline:
        time.sleep(0.5)
    if not root.is_file():
        raise host.HostError(
            f"Caddy did not start within {timeout:.0f} s (no {root}): see the hub log"
        )
    names = f"{site.host} and <user>.{site.host}" if s.subdomain_host else site.host
    print(f"Caddy serves HTTPS for {names} with its own certificate authority. Install "
          "its root certificate on each laptop and phone that opens gpulab "
          f"(docs/deployment.md, \"Installing the CA\"): {root}")  # fmt: skip
    if not s.subdomain_host:
        print("An IP address has no subdomains: every project shares the hub's origin, "
              "which is safe for one person only. For several people, give this machine "
              'a name (docs/deployment.md, "Reached by IP").')  # fmt: skip


def how_to_open(s: settings.Settings) -> str:
    """The paragraph `gpulab up` prints when no GPULAB_PUBLIC_URL is set: where the hub
    listens, and how to open it to other people."""
    bound = urlparse(s.bind_url).hostname or ""
    where = (
        "only this machine can open it"
        if bound in ("127.0.0.1", "localhost", "::1")
        else f"GPULAB_BIND_URL={s.bind_url}, over plain HTTP"
    )
    return (
        f"\nThis hub listens on {bound} ({where}). To open it to other people, set "
        "GPULAB_PUBLIC_URL=https://<name> (for example https://lab.example.org) and run "
        "`gpulab up` again: gpulab then serves HTTPS through Caddy, each user's projects "
        "on a subdomain of their own. For a box reached by its IP address over a LAN or a "
        'private VPN (WireGuard, Tailscale), see docs/deployment.md, "Reached by IP".'
    )


def cmd_down(args, environ) -> int:
    s = settings.parse(environ)
    hub_dir = s.hub_dir
    hub, stale = hub_process(hub_dir)
    try:
        spawner = cli_cluster.hub_spawner()
    except Exception as e:  # noqa: BLE001 - the config is the admin's Python: stop anyway
        print(
            f"Could not read the hub's configuration ({type(e).__name__}: {e}); stopping "
            "anyway. Jobs of its projects on a Slurm cluster, if any, keep running: "
            "`scancel` them (docs/cluster.md).",
            file=sys.stderr,
        )
        spawner = None
    uid = cli_cluster.hub_user(hub)
    if hub and host.stop_pid(hub.pid, expect=hub):
        print("Stopped the hub.")
    elif stale:
        print(f"The hub's PID file was stale, so nothing was signalled: {stale}.")
    left = orphans.stop_left_proxy(hub_dir)  # after the hub: it stops its own proxy
    if left:
        print(f"Stopped the proxy a stopped hub had left running: {left}")
    for what in orphans.stop_left_services(s.hub_port):
        print(f"Stopped a service a stopped hub had left running: {what}")
    (hub_dir / HUB_PIDFILE).unlink(missing_ok=True)
    if cli_cluster.on_cluster(spawner):
        cli_cluster.stop_jobs(spawner, uid)
    dk = host.Docker()
    if dk.reachable():
        label = f"{INSTANCE_LABEL}={s.prefix}"
        for name in host.remove_containers(dk, label):
            print(f"Stopped project container {name}")
        if spawner is not None:
            for name in confine.remove_stale(dk.call, spawner.network_name):
                print(f"Stopped the build on {name}")
            host.forget_firewall(dk, spawner.network_name, s.hub_port)
    if host.stop_dockerd(hub_dir):
        print("Stopped the Docker engine gpulab had started.")
    return 0


def cmd_status(args, environ) -> int:
    s = settings.parse(environ)
    hub_dir = s.hub_dir
    hub, _ = hub_process(hub_dir)
    pid = hub.pid if hub else None
    url = local_url(s.bind_url)
    print(f"hub: running (pid {pid}) at {url}" if pid else "hub: stopped")
    answered = True
    spawner = cli_cluster.hub_spawner()
    if cli_cluster.on_cluster(spawner):
        answered = cli_cluster.show_jobs(spawner, cli_cluster.hub_user(hub))
    dk = host.Docker()
    if not dk.reachable():
        print("docker: not reachable")
        return 1 if pid else 0
    print("docker: reachable")
    label = f"{INSTANCE_LABEL}={s.prefix}"
    for c in dk.call("containers", all=True, filters={"label": label}):
        labels = c["Labels"]
        print(f"  {labels.get('gpulab.owner')}/{labels.get('gpulab.project')}: {c['Status']}")
    return 1 if pid and not answered else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gpulab", description="Run gpulab on this machine.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="set up what is missing and start the hub")
    up.add_argument("--foreground", action="store_true", help="run the hub in this terminal")
    up.set_defaults(fn=cmd_up)
    sub.add_parser(
        "down", help="stop the hub and every project container (on a Slurm cluster: its jobs)"
    ).set_defaults(fn=cmd_down)
    sub.add_parser(
        "status", help="show the hub and project containers (on a Slurm cluster: its jobs)"
    ).set_defaults(fn=cmd_status)
    add_doctor_parser(sub)
    cli_images.add_parsers(sub)
    cli_backup.add_parsers(sub)
    cli_gpus.add_parser(sub)
    cli_db.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.fn(args, os.environ)
    except (host.HostError, allocator.AllocationError, settingvalues.SettingError) as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

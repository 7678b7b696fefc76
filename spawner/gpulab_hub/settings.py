"""Site settings -> JupyterHub configuration.

``jupyterhub_config.py`` calls :func:`apply` with the process environment;
tests call it with a plain dict and a fresh ``traitlets.config.Config``.
Every site setting is an environment variable with a default that works on
one machine out of the box (see docs/configuration.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpulab_hub import accounts, culling, doctor, home, secrets, sharing, ssh, usagepage
from gpulab_hub.gpus import keeper
from gpulab_hub.projects import buildlog, objects, rename, title
from gpulab_hub.sharing import accept, groupshares, origins

DEFAULTS = {
    "GPULAB_HOME": "/srv/gpulab",
    "GPULAB_BIND_URL": "http://0.0.0.0:8000",
    "GPULAB_HUB_PORT": "8081",
    "GPULAB_PROXY_API_PORT": "8001",
    "GPULAB_NETWORK": "",
    "GPULAB_HUB_IP": "",
    "GPULAB_HUB_CONNECT_IP": "",
    "GPULAB_ADMIN": "admin",
    "GPULAB_ADMIN_PASSWORD": "",
    "GPULAB_BASE_IMAGE": "gpulab/base:latest",
    # "": the host decides (images/base.py default_from): a CUDA image on GPU hosts
    "GPULAB_BASE_FROM": "",
    "GPULAB_TORCH_CUDA_ARCH_LIST": "",
    "GPULAB_TORCH": "",
    "GPULAB_GPU_POLICY": "exclusive",
    "GPULAB_GPU_ISOLATION": "auto",
    "GPULAB_DRIVER_DIR": "/usr/local/nvidia",
    "GPULAB_IMAGE_REPO": "gpulab/project",
    "GPULAB_CONTAINER_PREFIX": "gpulab",
    "GPULAB_MAX_PROJECTS": "10",
    "GPULAB_OPEN_SIGNUP": "0",
    "GPULAB_SHARE_MAX_HOURS": "168",
    "GPULAB_PUBLIC_LINKS": "0",
    "GPULAB_SUBDOMAIN_HOST": "",
    "GPULAB_PUBLIC_URL": "",
    "GPULAB_PASSWORD_MIN_LENGTH": "10",
    "GPULAB_PASSWORD_CHECK_COMMON": "1",
    "GPULAB_LOGIN_ATTEMPTS": "5",
    "GPULAB_LOGIN_LOCKOUT_SECONDS": "300",
    "GPULAB_DELETED_FILES": "archive",
    "GPULAB_IDLE_TIMEOUT": "7200",
    # Seconds idle before a GPU holder is warned while starts wait, and from the warning
    # to its stop ("": ProjectSpawner.gpu_reclaim_idle / gpu_reclaim_grace, 300 each)
    "GPULAB_GPU_RECLAIM_IDLE": "",
    "GPULAB_GPU_RECLAIM_GRACE": "",
    # Seconds a GPU holder may be idle in every way before it is warned and stopped even
    # when nobody waits ("": ProjectSpawner.gpu_idle_release, 1500; 0: never)
    "GPULAB_GPU_IDLE_RELEASE": "",
    # MiB one image build may add to the engine's disk ("": 20 GiB, build_disk_limit)
    "GPULAB_BUILD_DISK_LIMIT_MB": "",
    # Seconds within which a revoked or lowered share stops working (project servers'
    # caches of token checks and share lists; the SSH gateway rechecks twice in it).
    "GPULAB_REVOKE_WITHIN_S": "30",
    # The SSH gateway into projects (ssh/): its port (0: no gateway), and its address
    # ("": the host of GPULAB_BIND_URL).
    "GPULAB_SSH_PORT": "2222",
    "GPULAB_SSH_BIND": "",
    # Failed SSH logins from one address within GPULAB_SSH_FAILURE_WINDOW seconds that
    # lock the address ("": the gateway's own defaults, 30 in 600 s; ssh/limits.py)
    "GPULAB_SSH_IP_ATTEMPTS": "",
    "GPULAB_SSH_FAILURE_WINDOW": "",
}


def site(environ) -> dict[str, str]:
    """The site settings: each GPULAB_* variable, or its default."""
    return {key: environ.get(key) or default for key, default in DEFAULTS.items()}


def revoke_within_s(s: dict[str, str]) -> int:
    """GPULAB_REVOKE_WITHIN_S as a whole number of seconds, 2 to 3600."""
    text = s["GPULAB_REVOKE_WITHIN_S"]
    if not text.isdigit() or len(text) > 4 or not 2 <= int(text) <= 3600:
        raise ValueError(
            f"GPULAB_REVOKE_WITHIN_S must be a whole number of seconds from 2 to 3600; "
            f"it is {text!r}."
        )
    return int(text)


def network_name(s: dict[str, str]) -> str:
    """The bridge network of projects and builds: GPULAB_NETWORK, else <prefix>-net."""
    return s["GPULAB_NETWORK"] or f"{s['GPULAB_CONTAINER_PREFIX']}-net"


def with_hub_ip(environ) -> dict[str, str]:
    """``environ`` with GPULAB_HUB_IP set: where project containers reach the hub.

    Unless the admin set it, it is the gateway address of gpulab's bridge network
    (made here if missing), so the hub's API listens there and not on every
    interface. Blocking (asks Docker): called once when the hub starts.
    """
    env = dict(environ)
    if not env.get("GPULAB_HUB_IP"):
        import docker.errors
        import requests.exceptions

        from gpulab_hub import host

        try:
            env["GPULAB_HUB_IP"] = host.ensure_network(host.Docker(), network_name(site(env)))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            # The hub still starts and tells each user who starts a project why it
            # cannot; containers need the hub on the network's gateway, so restart the
            # hub once the engine answers (`gpulab up` starts one).
            print(f"gpulab: the Docker engine does not answer ({e}); restart the hub once "
                  "it does", file=sys.stderr)  # fmt: skip
            env["GPULAB_HUB_IP"] = "127.0.0.1"
    return env


def paths(home: str | Path) -> dict[str, Path]:
    home = Path(home)
    return {
        "hub": home / "hub",
        "projects": home / "projects",
        "data": home / "data",
        "admin_password": home / "hub" / "first-admin-password",
    }


def apply(c, environ, images_dir: str | Path) -> None:
    """Fill config ``c`` from the site settings in ``environ``."""
    s = site(environ)
    p = paths(s["GPULAB_HOME"])
    hub_dir = p["hub"]

    c.JupyterHub.bind_url = s["GPULAB_BIND_URL"]
    c.JupyterHub.hub_port = int(s["GPULAB_HUB_PORT"])
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{int(s['GPULAB_PROXY_API_PORT'])}"
    c.JupyterHub.db_url = f"sqlite:///{hub_dir / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(hub_dir / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(hub_dir / "jupyterhub.pid")
    # Project containers keep running across hub restarts; `gpulab down` stops them.
    c.JupyterHub.cleanup_servers = False
    # `gpulab doctor`'s last report, for admins at /hub/gpulab/doctor (linked in the nav bar).
    # Owners share projects at /hub/gpulab/share/<project> (links last at most the max).
    # Save a copy at /hub/gpulab/copy; public notebook links only where the admin allows them.
    # Owners rename stopped projects at /hub/gpulab/rename/<project>; owners and collaborators
    # read a project's latest build log at /hub/gpulab/build-log/<owner>/<project>.
    # Where each page finds projects and records: the hub's own configuration (hubsettings.py).
    # Project servers on a Slurm cluster submit multi-node jobs through the hub's API
    # /hub/api/gpulab/cluster/jobs/<owner>/<project> (cluster/jobsapi.py; on one machine
    # it lists none and refuses a submit).
    from gpulab_hub.cluster import jobsapi
    from gpulab_hub.gpus import reclaimapi
    from gpulab_hub.home import runtime

    c.JupyterHub.extra_handlers = (
        doctor.hub_handlers()
        + sharing.hub_handlers(
            int(s["GPULAB_SHARE_MAX_HOURS"]), public_links=s["GPULAB_PUBLIC_LINKS"] == "1"
        )
        + rename.hub_handlers()
        + buildlog.hub_handlers()
        + jobsapi.hub_handlers()
        # A project's JupyterLab learns it is warned that it stops unless used (gpus/).
        + reclaimapi.hub_handlers()
        # GPU usage by user, project and GPU, with a CSV export, for admins (usagepage/).
        + usagepage.hub_handlers()
        # A project's hardware, as Colab's "Change runtime type" (home/runtime.py).
        + runtime.hub_handlers()
    )
    # gpulab's home page (home/: its handler replaces JupyterHub's, see accounts/auth.py).
    c.JupyterHub.template_paths = [
        str(home.TEMPLATES),
        str(doctor.TEMPLATES),
        str(sharing.TEMPLATES),
        str(rename.TEMPLATES),
        str(usagepage.TEMPLATES),
    ]
    # Roles mirroring group shares are made at run time; JupyterHub deletes at start any
    # role it is not given here (see sharing/groupshares.py).
    c.JupyterHub.load_roles = [sharing.USER_ROLE, *groupshares.load_roles(hub_dir)]
    # ... and follow every change to the shares, the REST API's included, at once.
    groupshares.keep_in_step(hub_dir)
    # Viewer and collaborator: gpulab's scopes, asked for by the project servers'
    # authorizer (docs/sharing.md). Browser tokens of a project server may carry them.
    c.JupyterHub.custom_scopes = sharing.roles.CUSTOM_SCOPES
    c.Spawner.oauth_client_allowed_scopes = sharing.roles.SERVER_CLIENT_SCOPES
    c.Spawner.server_token_scopes = sharing.roles.SERVER_TOKEN_SCOPES
    # Access through a link ends with it unless its owner chose otherwise; the accept
    # page in gpulab's words; no OAuth confirm page for projects (sharing/accept.py).
    accept.configure(c, hub_dir, revoke_within_s(s))
    # Hub pages name a project by its display name (projects/title.py).
    title.configure(c)
    # Each user's servers on an origin of their own (JupyterHub's subdomain_host), needed
    # wherever others reach the hub; a strict CSP on the hub's pages (docs/deployment.md).
    origins.apply(c, s["GPULAB_SUBDOMAIN_HOST"])

    # Projects run on gpulab's bridge network, never the host's: the hub's API listens
    # on that network's gateway (with_hub_ip), where containers reach it.
    network = objects.check_network(network_name(s))
    c.JupyterHub.hub_ip = s["GPULAB_HUB_IP"] or "127.0.0.1"
    if s["GPULAB_HUB_CONNECT_IP"]:
        c.JupyterHub.hub_connect_ip = s["GPULAB_HUB_CONNECT_IP"]

    c.JupyterHub.authenticator_class = "gpulab_hub.accounts.auth.GpulabAuthenticator"
    c.Authenticator.admin_users = {s["GPULAB_ADMIN"]}
    # NativeAuthenticator lets in only accounts an admin approved.
    c.Authenticator.allow_all = True
    c.NativeAuthenticator.open_signup = s["GPULAB_OPEN_SIGNUP"] == "1"
    c.GpulabAuthenticator.first_admin = s["GPULAB_ADMIN"]
    c.GpulabAuthenticator.first_admin_password = s["GPULAB_ADMIN_PASSWORD"]
    c.GpulabAuthenticator.first_admin_password_file = str(p["admin_password"])
    # Password rules, lockout, cookies, deletion: accounts.py.
    accounts.configure(c, s, hub_dir)

    c.JupyterHub.allow_named_servers = True
    # After login, land on the project list instead of starting a "default" project.
    c.JupyterHub.redirect_to_server = False
    c.JupyterHub.named_server_limit_per_user = int(s["GPULAB_MAX_PROJECTS"])

    c.JupyterHub.spawner_class = "gpulab_hub.spawner.ProjectSpawner"
    c.ProjectSpawner.projects_root = str(p["projects"])
    c.ProjectSpawner.state_root = str(hub_dir / "projects")
    c.ProjectSpawner.records_dir = str(hub_dir)
    c.ProjectSpawner.data_root = str(p["data"])
    c.ProjectSpawner.images_dir = str(images_dir)
    c.ProjectSpawner.base_image = s["GPULAB_BASE_IMAGE"]
    c.ProjectSpawner.image_repo = s["GPULAB_IMAGE_REPO"]
    c.ProjectSpawner.prefix = s["GPULAB_CONTAINER_PREFIX"]
    c.ProjectSpawner.network_name = network
    c.ProjectSpawner.allocations_file = str(hub_dir / "gpu-allocations.json")
    c.ProjectSpawner.gpu_policy = s["GPULAB_GPU_POLICY"]
    c.ProjectSpawner.gpu_isolation = s["GPULAB_GPU_ISOLATION"]
    c.ProjectSpawner.driver_dir = s["GPULAB_DRIVER_DIR"]
    c.Spawner.default_url = "/lab"
    # A project server trusts the hub's answer on a token this long: a revoked share
    # stops working within it (JupyterHub's default is 300 s).
    # gpulab's authorizer enforces the viewer role (only where the hub starts the
    # server: a plain JupyterLab is unaffected).
    c.Spawner.args = [
        f"--HubOAuth.cache_max_age={revoke_within_s(s)}",
        f"--ServerApp.authorizer_class={sharing.roles.AUTHORIZER_CLASS}",
        f"--ProjectAuthorizer.shares_max_age={revoke_within_s(s)}",
        # Open kernels, terminals and rooms are checked again well within the window.
        f"--ProjectAuthorizer.connections_recheck_s={min(10, revoke_within_s(s) // 2)}",
        # Logs gpulab writes under .gpulab/ (the %gpu_install log whose path the magic
        # prints) open in JupyterLab; the project folder is the user's own.
        "--ContentsManager.allow_hidden=True",
    ]
    disk_mb = s["GPULAB_BUILD_DISK_LIMIT_MB"]
    if disk_mb:
        if not disk_mb.isdigit() or len(disk_mb) > 9 or int(disk_mb) < 1:
            raise ValueError("GPULAB_BUILD_DISK_LIMIT_MB must be a whole number of MiB.")
        c.ProjectSpawner.build_disk_limit = int(disk_mb) << 20
    # Builds report progress on the spawn page; give them time. A start may also wait
    # in the GPU queue (up to ProjectSpawner.gpu_queue_max_wait, a day by default, and
    # cancelled by the user's Stop): JupyterHub's limit covers the whole start.
    c.Spawner.start_timeout = 3600 + 24 * 3600
    c.Spawner.http_timeout = 120
    # Idle projects stop (and free their GPUs), never one with a running job or a busy
    # GPU: JupyterHub's idle culler as a service (culling.py, docs/jobs.md).
    idle = s["GPULAB_IDLE_TIMEOUT"]
    if not idle.isdigit() or len(idle) > 9:
        raise ValueError("GPULAB_IDLE_TIMEOUT must be a whole number of seconds (0: never).")
    culling.configure(c, int(idle))
    # Queued starts the hub forgot (a restart) are started again, and idle GPU holders
    # are warned and stopped while starts wait: the GPU keeper service (gpus/keeper.py).
    for key, trait in (("GPULAB_GPU_RECLAIM_IDLE", "gpu_reclaim_idle"),
                       ("GPULAB_GPU_RECLAIM_GRACE", "gpu_reclaim_grace"),
                       ("GPULAB_GPU_IDLE_RELEASE", "gpu_idle_release")):  # fmt: skip
        if s[key]:
            if not s[key].isdigit() or len(s[key]) > 9:
                raise ValueError(f"{key} must be a whole number of seconds.")
            c.ProjectSpawner[trait] = float(s[key])
    keeper.configure(c)
    # SSH into projects (ssh/, docs/remote.md) and each user's secrets (secrets/).
    ssh.configure(c, s, hub_dir)
    secrets.configure(c, s, hub_dir)


def finish(c) -> None:
    """What must read the whole configuration, called as jupyterhub_config.py's last
    step (after the admin's lines and ``jupyterhub_config.d``): the GPU keeper's
    settings (its service's environment)."""
    keeper.configure(c)

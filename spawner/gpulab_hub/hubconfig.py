"""The hub's JupyterHub configuration, made from gpulab's settings.

``jupyterhub_config.py`` parses the settings once (``settings.parse``), calls
:func:`apply` with them, runs the admin's lines and ``jupyterhub_config.d``, then calls
:func:`finish`, which completes the settings with the layout the traits give and hands
them to the hub's pages (the tornado setting ``settings.APP_KEY``) and its services
(``settings.service_env``). Tests call :func:`apply` with a plain dict of variables
and a fresh ``traitlets.config.Config``.

This module wires every part of gpulab into JupyterHub, so it sits at the top of the
house (it imports the capabilities and the pages; nothing imports it but the config
file, the command and tests).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path

from gpulab_hub import (
    accounts,
    admin,
    culling,
    doctor,
    home,
    hubsettings,
    projects,
    secrets,
    settings,
    sharing,
    ssh,
    tls,
    usagepage,
)
from gpulab_hub.accounts import providers
from gpulab_hub.gpus import keeper, usage
from gpulab_hub.home import buildlog
from gpulab_hub.images import prebuild
from gpulab_hub.projects import objects, title
from gpulab_hub.settings import Settings
from gpulab_hub.sharing import accept, groupshares, origins
from gpulab_hub.workflows import rename


def with_hub_ip(s: Settings) -> Settings:
    """``s`` with its hub_ip set: where project containers reach the hub.

    Unless the admin set GPULAB_HUB_IP, it is the gateway address of gpulab's bridge
    network (made here if missing), so the hub's API listens there and not on every
    interface. Blocking (asks Docker): called once when the hub starts.
    """
    if s.hub_ip:
        return s
    import docker.errors
    import requests.exceptions

    from gpulab_hub import blocking, host

    try:
        # JupyterHub reads its configuration on its event loop, before it serves anyone
        with blocking.allowed("asking Docker for the hub's address as the hub starts"):
            ip = host.ensure_network(host.Docker(), s.network_name)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        # The hub still starts and tells each user who starts a project why it
        # cannot; containers need the hub on the network's gateway, so restart the
        # hub once the engine answers (`gpulab up` starts one).
        print(f"gpulab: the Docker engine does not answer ({e}); restart the hub once "
              "it does", file=sys.stderr)  # fmt: skip
        ip = "127.0.0.1"
    return dataclasses.replace(s, hub_ip=ip)


def apply(c, site: Settings | Mapping[str, str], images_dir: str | Path) -> Settings:
    """Fill config ``c`` from the settings (or the variables ``site``, parsed here);
    the settings, as parsed."""
    s = site if isinstance(site, Settings) else settings.parse(site)
    hub_dir = s.hub_dir
    revoke_s = s.sharing.revoke_within_s

    c.JupyterHub.bind_url = s.bind_url
    c.JupyterHub.hub_port = s.hub_port
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s.proxy_api_port}"
    # JupyterHub's tables and gpulab's (db/): the layout's db_url reads it back
    c.JupyterHub.db_url = s.database_url
    c.JupyterHub.cookie_secret_file = str(hub_dir / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(hub_dir / "jupyterhub.pid")
    # Project containers keep running across hub restarts; `gpulab down` stops them.
    c.JupyterHub.cleanup_servers = False
    # `gpulab doctor`'s last report, for admins at /hub/gpulab/doctor (linked in the nav bar).
    # Owners share projects at /hub/gpulab/share/<project> (links last at most the max).
    # Save a copy at /hub/gpulab/copy; public notebook links only where the admin allows them.
    # Owners rename stopped projects at /hub/gpulab/rename/<project>; owners and collaborators
    # read a project's latest build log at /hub/gpulab/build-log/<owner>/<project>.
    # Where each page finds projects and records: the settings' layout (finish below).
    # Project servers on a Slurm cluster submit multi-node jobs through the hub's API
    # /hub/api/gpulab/cluster/jobs/<owner>/<project> (cluster/jobsapi.py; on one machine
    # it lists none and refuses a submit).
    from gpulab_hub.cluster import jobsapi
    from gpulab_hub.gpus import reclaimapi
    from gpulab_hub.home import runtime

    c.JupyterHub.extra_handlers = (
        doctor.hub_handlers()
        + sharing.hub_handlers(s.sharing.share_max_hours, public_links=s.sharing.public_links)
        + rename.hub_handlers()
        + buildlog.hub_handlers()
        + jobsapi.hub_handlers()
        # A project's JupyterLab learns it is warned that it stops unless used (gpus/).
        + reclaimapi.hub_handlers()
        # GPU usage by user, project and GPU, with a CSV export, for admins (usagepage/).
        + usagepage.hub_handlers()
        # Caddy's ask: certificates for the hub's name and existing users' only (tls/).
        + tls.hub_handlers(s)
        # A project's hardware, as Colab's "Change runtime type" (home/runtime.py).
        + runtime.hub_handlers()
    )
    # gpulab's home page (home/: its handler replaces JupyterHub's; gpulab_routes below).
    c.JupyterHub.template_paths = [
        str(home.TEMPLATES),
        str(doctor.TEMPLATES),
        str(sharing.TEMPLATES),
        str(projects.TEMPLATES),
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
    accept.configure(c, hub_dir, revoke_s)
    # Hub pages name a project by its display name (projects/title.py).
    title.configure(c)
    # Each user's servers on an origin of their own (JupyterHub's subdomain_host), needed
    # wherever others reach the hub; a strict CSP on the hub's pages (docs/deployment.md).
    origins.apply(c, s.subdomain_host)

    # Projects run on gpulab's bridge network, never the host's: the hub's API listens
    # on that network's gateway (with_hub_ip), where containers reach it.
    network = objects.check_network(s.network_name)
    c.JupyterHub.hub_ip = s.hub_ip or "127.0.0.1"
    if s.hub_connect_ip:
        c.JupyterHub.hub_connect_ip = s.hub_connect_ip

    a = s.accounts
    # Who logs in: gpulab's own accounts, or the lab's LDAP, OpenID Connect provider or
    # GitHub organisations (GPULAB_AUTHENTICATOR, accounts/providers.py).
    providers.configure(c, s)
    # gpulab's routes that replace JupyterHub's (the home page, the spawn page: home/; the
    # activity API: sharing/activity.py; accepting a link: sharing/accept.py) come first,
    # whatever the authenticator (accounts/auth.py GpulabHub; finish mixes it into one
    # the admin names). JupyterHub's API deletes a user only when the request names them
    # again (admin/userdelete.py): one click on JupyterHub's admin page deletes nobody.
    from gpulab_hub.admin import userdelete
    from gpulab_hub.sharing import activity

    c.GpulabHub.gpulab_routes = (
        home.front_handlers()
        + activity.hub_handlers()
        + accept.hub_handlers()
        + userdelete.hub_handlers()
    )
    c.NativeAuthenticator.open_signup = a.open_signup
    c.GpulabAuthenticator.first_admin = a.admin
    c.GpulabAuthenticator.first_admin_password = a.admin_password
    c.GpulabAuthenticator.first_admin_password_file = str(s.admin_password_file)
    # Password rules, lockout, cookies, deletion: accounts.py.
    accounts.configure(c, s)

    c.JupyterHub.allow_named_servers = True
    # After login, land on the project list instead of starting a "default" project.
    c.JupyterHub.redirect_to_server = False
    c.JupyterHub.named_server_limit_per_user = a.max_projects

    # The layout's defaults, from GPULAB_HOME (the admin's lines may move each).
    where = hubsettings.default_layout(s.home)
    c.JupyterHub.spawner_class = "gpulab_hub.spawner.ProjectSpawner"
    c.ProjectSpawner.projects_root = str(where.projects_root)
    c.ProjectSpawner.state_root = str(where.state_root)
    c.ProjectSpawner.records_dir = str(where.records_dir)
    c.ProjectSpawner.data_root = str(where.data_root)
    c.ProjectSpawner.images_dir = str(images_dir)
    c.ProjectSpawner.base_image = s.images.base_image
    c.ProjectSpawner.image_repo = s.images.image_repo
    c.ProjectSpawner.prefix = s.prefix
    c.ProjectSpawner.network_name = network
    c.ProjectSpawner.allocations_file = str(where.allocations_file)
    c.ProjectSpawner.gpu_policy = s.gpus.policy
    c.ProjectSpawner.gpu_isolation = s.gpus.isolation
    c.ProjectSpawner.driver_dir = s.gpus.driver_dir
    c.Spawner.default_url = "/lab"
    # A project server trusts the hub's answer on a token this long: a revoked share
    # stops working within it (JupyterHub's default is 300 s).
    # gpulab's authorizer enforces the viewer role (only where the hub starts the
    # server: a plain JupyterLab is unaffected).
    c.Spawner.args = [
        f"--HubOAuth.cache_max_age={revoke_s}",
        f"--ServerApp.authorizer_class={sharing.roles.AUTHORIZER_CLASS}",
        f"--ProjectAuthorizer.shares_max_age={revoke_s}",
        # Open kernels, terminals and rooms are checked again well within the window.
        f"--ProjectAuthorizer.connections_recheck_s={min(10, revoke_s // 2)}",
        # Logs gpulab writes under .gpulab/ (the %gpu_install log whose path the magic
        # prints) open in JupyterLab; the project folder is the user's own.
        "--ContentsManager.allow_hidden=True",
    ]
    if s.images.build_disk_limit_mb is not None:
        c.ProjectSpawner.build_disk_limit = s.images.build_disk_limit_mb << 20
    # The starting points built after the start, and their torch (images/prebuild.py).
    if s.images.prebuild is not None:
        c.ProjectSpawner.prebuild_stacks = list(s.images.prebuild)
    if s.images.starting_point_torch is not None:
        c.ProjectSpawner.starting_point_torch = s.images.starting_point_torch
    if s.images.cpu_torch_index is not None:
        c.ProjectSpawner.cpu_torch_index = s.images.cpu_torch_index
    prebuild.install()  # once the hub runs (its first database commit)
    # Builds report progress on the spawn page; give them time. A start may also wait
    # in the GPU queue (up to ProjectSpawner.gpu_queue_max_wait, a day by default, and
    # cancelled by the user's Stop): JupyterHub's limit covers the whole start.
    c.Spawner.start_timeout = 3600 + 24 * 3600
    c.Spawner.http_timeout = 120
    # Idle projects stop (and free their GPUs), never one with a running job or a busy
    # GPU: JupyterHub's idle culler as a service (culling.py, docs/jobs.md).
    culling.configure(c, s.idle_timeout_s)
    # Idle GPU holders are warned and stopped while starts wait (gpus/keeper.py).
    for value, trait in ((s.gpus.reclaim_idle, "gpu_reclaim_idle"),
                         (s.gpus.reclaim_grace, "gpu_reclaim_grace"),
                         (s.gpus.idle_release, "gpu_idle_release")):  # fmt: skip
        if value is not None:
            c.ProjectSpawner[trait] = float(value)
    # SSH into projects (ssh/, docs/remote.md) and each user's secrets (secrets/).
    ssh.configure(c, s)
    secrets.configure(c, s, hub_dir)
    # The admin overview, /hub/gpulab/admin (admin/, docs/admin.md).
    admin.configure(c)
    # The pages' and services' settings, as far as they are known now (finish).
    _hand_on(c, s)
    return s


def complete(c, s: Settings) -> Settings:
    """``s`` with what the traits in ``c`` decide: the layout, and the GPU reclaim
    timings (the traits', which the site variables set where given)."""
    sp = hubsettings.spawner_of(c)
    gpus = dataclasses.replace(
        s.gpus,
        reclaim_idle=float(sp.gpu_reclaim_idle),
        reclaim_grace=float(sp.gpu_reclaim_grace),
        idle_release=float(sp.gpu_idle_release),
    )
    layout = hubsettings.from_spawner(sp)
    # fair share and budgets read the whole window: the usage kept must cover it
    usage.check_retention(layout.usage_retention, layout.usage_window)
    return dataclasses.replace(s, gpus=gpus, layout=layout)


def _hand_on(c, s: Settings) -> Settings:
    """The complete settings to the pages (tornado settings) and the services (the GPU
    keeper, the SSH gateway: their environment)."""
    s = complete(c, s)
    c.JupyterHub.tornado_settings.update({settings.APP_KEY: s})
    # Each account's provider identity, in the hub's database (accounts/identities.py).
    c.BoundLogin.identities_db_url = s.layout.db_url
    keeper.configure(c, s)
    ssh.configure_service(c, s)
    tls.configure_service(c, s)  # Caddy, with an https GPULAB_PUBLIC_URL
    return s


def given(c) -> Settings:
    """The settings :func:`apply` gave ``c``."""
    ts = c.JupyterHub.tornado_settings
    # A LazyConfigValue's updates as they stand (its get_value would fix the value for
    # good, and the updates after it, finish's own, would be lost).
    given = ts.to_dict().get("update", {}) if hasattr(ts, "to_dict") else dict(ts)
    found = given.get(settings.APP_KEY)
    if not isinstance(found, Settings):
        raise ValueError(
            "gpulab's settings are missing from c.JupyterHub.tornado_settings: add to it "
            "with .update(...) instead of replacing it (and keep gpulab's first lines)"
        )
    return found


def finish(c) -> Settings:
    """What must read the whole configuration, called as jupyterhub_config.py's last
    step (after the admin's lines and ``jupyterhub_config.d``): the settings complete
    with the layout and the traits they decide, handed to the pages and services; an
    authenticator the admin named gets gpulab's routes mixed in (accounts/auth.py)."""
    _with_gpulab_routes(c)
    return _hand_on(c, given(c))


def upgrade_database(s: Settings):
    """gpulab's tables in the hub's database (``s.layout.db_url``) upgraded as the hub
    starts, a SQLite database backed up first (db/migrate.py). A database gpulab cannot
    use ends the start with its sentence. Nothing happens where the configuration is
    read by anything but JupyterHub (the ``gpulab`` command)."""
    from gpulab_hub.db import engine as db_engine
    from gpulab_hub.db import migrate
    from gpulab_hub.workflows import dbimports

    try:
        done = migrate.at_start(s.layout.db_url, imports=dbimports.of(s.layout))
    except db_engine.DatabaseError as e:
        print(f"gpulab: {e}", file=sys.stderr, flush=True)
        raise
    if done is not None and done.changed:  # the hub's log (its logging is not set up yet)
        print(f"gpulab: {done.words(s.layout.db_url)}", flush=True)
    return done


def finish_interrupted(c, s: Settings) -> list[str]:
    """The renames and deletions of projects that a killed hub left half done, finished
    before the hub serves anyone (workflows/recovery.py); what the hub's output says of
    each. The group shares' roles the hub loads are read again after them. Nothing
    happens where anything but JupyterHub reads the configuration."""
    from jupyterhub.app import JupyterHub

    from gpulab_hub import blocking
    from gpulab_hub.workflows import recovery

    if not JupyterHub.initialized():
        return []
    with blocking.allowed("finishing interrupted renames and deletions as the hub starts"):
        said = recovery.finish_interrupted(s.layout.db_url)
    for line in said:
        print(f"gpulab: {line[0].upper()}{line[1:]}", flush=True)
    if said:
        c.JupyterHub.load_roles = [sharing.USER_ROLE, *groupshares.load_roles(s.hub_dir)]
    return said


def _with_gpulab_routes(c) -> None:
    cls = c.JupyterHub.authenticator_class if "authenticator_class" in c.JupyterHub else None
    if cls is None:
        return
    from jupyterhub.auth import Authenticator
    from traitlets import import_item

    from gpulab_hub.accounts import auth

    if isinstance(cls, str):
        if cls in providers.CLASSES.values():
            return
        from importlib.metadata import entry_points

        found = [e for e in entry_points(group="jupyterhub.authenticators") if e.name == cls]
        cls = found[0].load() if found else import_item(cls)
    if isinstance(cls, type) and issubclass(cls, Authenticator):
        c.JupyterHub.authenticator_class = auth.with_gpulab(cls)

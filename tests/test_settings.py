"""Site settings (GPULAB_* variables) -> a plain traitlets Config (hubconfig.apply)."""

import json
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from gpulab_hub import (
    accounts,
    admin,
    culling,
    doctor,
    home,
    hubconfig,
    projects,
    secrets,
    settings,
    sharing,
    ssh,
    usagepage,
)
from gpulab_hub.gpus import keeper
from gpulab_hub.projects import title
from gpulab_hub.workflows import rename


def applied(environ) -> Config:
    c = Config()
    hubconfig.apply(c, environ, images_dir="/opt/gpulab/images")
    return c


def handed_on(service: dict) -> settings.Settings:
    """The settings a hub service reads from the environment it is given."""
    return settings.of_service(service["environment"])


def test_defaults_give_a_working_single_machine_hub(monkeypatch):
    for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "GPULAB_LOOP_GUARD"):
        monkeypatch.delenv(name, raising=False)
    c = applied({})
    # The services get the hub's settings, complete with the layout the traits give.
    hub_settings = hubconfig.given(c)
    assert hub_settings.layout.queue_file == Path("/srv/gpulab/hub/gpu-queue.json")
    assert hub_settings.layout.usage_file == Path("/srv/gpulab/hub/gpu-usage.jsonl")
    assert (hub_settings.gpus.reclaim_idle, hub_settings.gpus.reclaim_grace) == (300.0, 300.0)
    assert hub_settings.gpus.idle_release == 1500.0
    assert hub_settings.layout.usage_window == 604800.0
    # tornado_settings (cookies, headers) are merged by several parts: checked on their own
    hub = Config({k: v for k, v in c.JupyterHub.items() if k != "tornado_settings"})
    assert hub == Config(
        {
            "bind_url": "http://127.0.0.1:8000",
            "hub_port": 8081,
            "hub_ip": "127.0.0.1",
            "db_url": "sqlite:////srv/gpulab/hub/jupyterhub.sqlite",
            "cookie_secret_file": "/srv/gpulab/hub/jupyterhub_cookie_secret",
            "pid_file": "/srv/gpulab/hub/jupyterhub.pid",
            "cleanup_servers": False,
            # one origin (127.0.0.1): no __Host- cookies (accounts.host_only_cookies)
            "cookie_host_prefix_enabled": False,
            # Where each page finds projects and records is not given here: the pages read
            # the hub's configuration (hubsettings.py), admin's own lines included.
            "extra_handlers": [
                ("/gpulab/doctor", "gpulab_hub.doctor.web.DoctorHandler", {}),
                (
                    "/gpulab/share/([^/]+)(?:/([^/]+))?",
                    "gpulab_hub.sharing.web.ShareHandler",
                    {"max_hours": 168, "default_hours": 24},
                ),
                ("/gpulab/copy", "gpulab_hub.sharing.copy.CopyHandler", {"public_links": False}),
                (
                    "/gpulab/shared",
                    "gpulab_hub.sharing.received.SharedWithMeHandler",
                    {"public_links": False},
                ),
                (
                    "/gpulab/public-links/([^/]+)",
                    "gpulab_hub.sharing.public.PublicLinksHandler",
                    {"public_links": False, "max_hours": 168},
                ),
                (
                    "/gpulab/p/([^/]+)",
                    "gpulab_hub.sharing.public.PublicNotebookHandler",
                    {"public_links": False, "max_hours": 168},
                ),
                ("/gpulab/rename/([^/]+)", "gpulab_hub.workflows.rename.RenameHandler"),
                (
                    "/api/gpulab/projects/([^/]+)/([^/]+)/rename",
                    "gpulab_hub.workflows.rename.RenameAPIHandler",
                ),
                (
                    "/gpulab/build-log/([^/]+)(?:/([^/]+))?",
                    "gpulab_hub.home.buildlog.BuildLogHandler",
                ),
                # multi-node jobs on a Slurm cluster, asked for by project servers
                (
                    "/api/gpulab/cluster/jobs/([^/]+)/([^/]+)",
                    "gpulab_hub.cluster.jobsapi.ProjectJobsHandler",
                ),
                (
                    "/api/gpulab/cluster/jobs/([^/]+)/([^/]+)/([0-9]{8}-[0-9]{6}-[a-z0-9]{4})",
                    "gpulab_hub.cluster.jobsapi.JobHandler",
                ),
                (
                    "/api/gpulab/cluster/jobs/([^/]+)/([^/]+)/([0-9]{8}-[0-9]{6}-[a-z0-9]{4})/stop",
                    "gpulab_hub.cluster.jobsapi.StopHandler",
                ),
                # whether a project is warned that it stops unless used, for its JupyterLab
                (
                    "/api/gpulab/reclaim/([^/]+)/([^/]+)",
                    "gpulab_hub.gpus.reclaimapi.ReclaimHandler",
                ),
                # GPU usage by user, project and GPU, and its CSV, for admins
                ("/gpulab/usage", "gpulab_hub.usagepage.web.UsageHandler", {}),
                (r"/gpulab/usage\.csv", "gpulab_hub.usagepage.web.UsageCsvHandler", {}),
                # a project's hardware, as Colab's "Change runtime type"
                ("/gpulab/runtime/([^/]+)/([^/]+)", "gpulab_hub.home.runtime.RuntimeHandler"),
                # SSH: each user's keys and how to connect; what the gateway may let in
                (
                    "/gpulab/ssh",
                    "gpulab_hub.ssh.web.SSHPageHandler",
                    {
                        "keys_dir": "/srv/gpulab/hub/ssh/keys",
                        "host_key": "/srv/gpulab/hub/ssh/host_ed25519_key",
                        "port": 2222,
                        "public_url": "",
                    },
                ),
                (
                    "/api/gpulab/ssh/access/([^/]+)/([^/]+)/([^/]+)",
                    "gpulab_hub.ssh.hubapi.AccessHandler",
                ),
                # each user's secrets: the page, and the API project servers ask
                ("/gpulab/secrets", "gpulab_hub.secrets.web.SecretsPageHandler"),
                (
                    "/api/gpulab/secrets/([^/]+)/([^/]+)",
                    "gpulab_hub.secrets.api.SecretsAPIHandler",
                ),
                # the admin overview: what runs, with stop, delete and approve
                ("/gpulab/admin", "gpulab_hub.admin.web.AdminHandler", {}),
            ],
            "template_paths": [
                str(home.TEMPLATES),
                str(doctor.TEMPLATES),
                str(sharing.TEMPLATES),
                str(projects.TEMPLATES),
                str(rename.TEMPLATES),
                str(usagepage.TEMPLATES),
                str(accounts.TEMPLATES),
                str(ssh.TEMPLATES),
                str(secrets.TEMPLATES),
                str(admin.TEMPLATES),
            ],
            "load_roles": [
                {
                    "name": "user",
                    "description": "Standard user privileges, plus sharing one's own projects",
                    "scopes": ["self", "shares!user", "custom:gpulab:execute!user"],
                },
                # JupyterHub's idle culler stops projects idle for two hours, never deletes
                {"name": culling.SERVICE, "scopes": culling.SCOPES, "services": [culling.SERVICE]},
                # the GPU keeper restarts forgotten queued starts, reclaims idle GPUs
                {"name": keeper.SERVICE, "scopes": keeper.SCOPES, "services": [keeper.SERVICE]},
                # the SSH gateway asks who may get a shell, starts stopped projects
                {"name": ssh.SERVICE, "scopes": ssh.SCOPES, "services": [ssh.SERVICE]},
            ],
            "services": [
                {
                    "name": culling.SERVICE,
                    "command": [
                        sys.executable,
                        "-m",
                        "gpulab_hub.culling",
                        "--timeout=7200",
                        "--cull-every=300",
                        "--cull-users=false",
                        "--remove-named-servers=false",
                    ],
                },
                {
                    "name": keeper.SERVICE,
                    "command": [sys.executable, "-m", "gpulab_hub.gpus.keeper"],
                    "environment": settings.service_env(hub_settings),
                },
                # SSH into projects on port 2222 of the web's address (0.0.0.0)
                {
                    "name": ssh.SERVICE,
                    "command": [sys.executable, "-m", "gpulab_hub.ssh"],
                    "environment": settings.service_env(hub_settings),
                },
            ],  # fmt: skip
            "custom_scopes": {**sharing.roles.CUSTOM_SCOPES, **ssh.CUSTOM_SCOPES},
            # what hub pages show: a share's terms (sharing/accept.py), sign-ups waiting
            # for admins (accounts/)
            "template_vars": {
                "gpulab_share_terms": sharing.accept.share_terms,
                "gpulab_project_title": title.page_titles,
                "gpulab_signups_waiting": accounts.signups_waiting,
            },
            "authenticator_class": "gpulab_hub.accounts.auth.GpulabAuthenticator",
            "allow_named_servers": True,
            "redirect_to_server": False,
            "named_server_limit_per_user": 10,
            "spawner_class": "gpulab_hub.spawner.ProjectSpawner",
        }
    )
    assert c.ProjectSpawner == Config(
        {
            "projects_root": "/srv/gpulab/projects",
            "state_root": "/srv/gpulab/hub/projects",
            "records_dir": "/srv/gpulab/hub",
            "data_root": "/srv/gpulab/data",
            "images_dir": "/opt/gpulab/images",
            "base_image": "gpulab/base:latest",
            "image_repo": "gpulab/project",
            "prefix": "gpulab",
            "network_name": "gpulab-net",
            "allocations_file": "/srv/gpulab/hub/gpu-allocations.json",
            "gpu_policy": "exclusive",
            "gpu_isolation": "auto",
            "driver_dir": "/usr/local/nvidia",
        }
    )
    assert c.Authenticator.admin_users == {"admin"}
    assert c.Authenticator.allow_all is True
    assert c.NativeAuthenticator.open_signup is False
    assert c.GpulabAuthenticator == Config(
        {
            "first_admin": "admin",
            "first_admin_password": "",
            "first_admin_password_file": "/srv/gpulab/hub/first-admin-password",
        }
    )
    assert c.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:8001"
    assert c.Spawner.default_url == "/lab"
    assert c.Spawner.args == [
        "--HubOAuth.cache_max_age=30",
        "--ServerApp.authorizer_class=gpulab_jupyter.authorizer.ProjectAuthorizer",
        "--ProjectAuthorizer.shares_max_age=30",
        "--ProjectAuthorizer.connections_recheck_s=10",
        "--ContentsManager.allow_hidden=True",
        "--ActivityReporter.every_s=150",
        "--ServerApp.kernel_manager_class=gpulab_jupyter.secrets.kernels.SecretsKernelManager",
    ]
    # The project knows its idle timeout; servers report activity well within it.
    assert c.Spawner.environment == {
        "GPULAB_IDLE_TIMEOUT": "7200",
        "JUPYTERHUB_ACTIVITY_INTERVAL": "300",
    }


def test_no_idle_culling_when_the_admin_says_0():
    c = applied({"GPULAB_IDLE_TIMEOUT": "0"})
    assert [s["name"] for s in c.JupyterHub.services] == [keeper.SERVICE, ssh.SERVICE]  # no culler
    assert [r["name"] for r in c.JupyterHub.load_roles] == ["user", keeper.SERVICE, ssh.SERVICE]
    assert c.Spawner.environment == {"GPULAB_IDLE_TIMEOUT": "0"}
    with pytest.raises(ValueError, match="GPULAB_IDLE_TIMEOUT"):
        applied({"GPULAB_IDLE_TIMEOUT": "2h"})


def test_project_servers_enforce_the_share_roles():
    c = applied({})
    scopes = c.JupyterHub.custom_scopes
    assert sorted(scopes) == [
        "custom:gpulab:execute",
        "custom:gpulab:read",
        ssh.GATEWAY_SCOPE,  # the SSH gateway's, held by its service only
        "custom:gpulab:write",
    ]
    assert scopes["custom:gpulab:execute"]["subscopes"] == [
        "custom:gpulab:write",
        "custom:gpulab:read",
    ]
    # Browser tokens of a project server may carry gpulab's scopes on that server
    # (JupyterHub adds the server's own access scope itself).
    assert c.Spawner.oauth_client_allowed_scopes == [
        "custom:gpulab:read!server",
        "custom:gpulab:write!server",
        "custom:gpulab:execute!server",
    ]
    # The server's own token may read the server's shares (the authorizer looks up
    # the roles of people whose browser token has no gpulab scope).
    assert c.Spawner.server_token_scopes == [
        "users:activity!server",
        "access:servers!server",
        "read:shares!server",
    ]
    # The class named on the command line is the one the image installs.
    from gpulab_jupyter.authorizer import ProjectAuthorizer

    assert sharing.roles.AUTHORIZER_CLASS == (
        f"{ProjectAuthorizer.__module__}.{ProjectAuthorizer.__qualname__}"
    )


def test_site_settings_override_defaults():
    c = applied(
        {
            "GPULAB_HOME": "/data/gpulab",
            "GPULAB_BIND_URL": "http://127.0.0.1:9000",
            "GPULAB_ADMIN": "root",
            "GPULAB_ADMIN_PASSWORD": "s3cret-pass",
            "GPULAB_MAX_PROJECTS": "3",
            "GPULAB_OPEN_SIGNUP": "1",
            "GPULAB_SHARE_MAX_HOURS": "12",
            "GPULAB_PUBLIC_LINKS": "1",
            "UNRELATED": "ignored",
        }
    )
    assert c.JupyterHub.bind_url == "http://127.0.0.1:9000"
    assert c.JupyterHub.named_server_limit_per_user == 3
    assert c.ProjectSpawner.projects_root == "/data/gpulab/projects"
    assert c.ProjectSpawner.state_root == "/data/gpulab/hub/projects"
    assert c.Authenticator.admin_users == {"root"}
    assert c.GpulabAuthenticator.first_admin_password == "s3cret-pass"
    assert c.NativeAuthenticator.open_signup is True
    # A link cannot outlast the maximum; its default shrinks to fit.
    handlers = {h[1].rsplit(".", 1)[-1]: (h[2:] or [{}])[0] for h in c.JupyterHub.extra_handlers}
    assert handlers["ShareHandler"] == {"max_hours": 12, "default_hours": 12}
    assert c.ProjectSpawner.records_dir == "/data/gpulab/hub"
    # The admin allowed public notebook links.
    assert handlers["CopyHandler"]["public_links"] is True
    assert handlers["PublicNotebookHandler"]["public_links"] is True
    assert handlers["PublicLinksHandler"]["max_hours"] == 12


def test_the_hub_listens_where_project_containers_reach_it():
    c = applied({"GPULAB_NETWORK": "gpulab", "GPULAB_HUB_IP": "172.30.0.1"})
    assert c.JupyterHub.hub_ip == "172.30.0.1"
    assert c.ProjectSpawner.network_name == "gpulab"
    c = applied({"GPULAB_HUB_IP": "0.0.0.0", "GPULAB_HUB_CONNECT_IP": "gpulab-hub"})
    assert c.JupyterHub.hub_connect_ip == "gpulab-hub"


@pytest.mark.parametrize("network", ["host", "none"])
def test_host_networking_is_refused_at_start(network):
    with pytest.raises(ValueError, match="bridge network of its own"):
        applied({"GPULAB_NETWORK": network})


def test_empty_variables_fall_back_to_defaults():
    assert settings.parse({"GPULAB_HOME": ""}).home == Path("/srv/gpulab")


def test_group_share_roles_survive_a_hub_restart(tmp_path):
    """JupyterHub deletes at start the roles load_roles does not name: the roles that
    mirror group shares are recorded in the hub's folder and loaded from there."""
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "group-share-roles.json").write_text(
        json.dumps(
            {
                "version": 1,
                "roles": {
                    "gpulab-group-share-0123": {
                        "description": "gpulab: alice/one shared with group team",
                        "scopes": ["access:servers!server=alice/one"],
                        "group": "team",
                        "project": "alice/one",
                    }
                },
            }
        )
    )
    c = Config()
    no_culler = {"GPULAB_HOME": str(tmp_path), "GPULAB_IDLE_TIMEOUT": "0", "GPULAB_SSH_PORT": "0"}
    hubconfig.apply(c, no_culler, images_dir="images")
    assert [r for r in c.JupyterHub.load_roles[1:] if r["name"] != keeper.SERVICE] == [
        {
            "name": "gpulab-group-share-0123",
            "description": "gpulab: alice/one shared with group team",
            "scopes": ["access:servers!server=alice/one"],
            "groups": ["team"],
        }
    ]


def test_the_revocation_window_is_a_site_setting():
    c = applied({"GPULAB_REVOKE_WITHIN_S": "8"})
    assert "--HubOAuth.cache_max_age=8" in c.Spawner.args
    assert "--ProjectAuthorizer.shares_max_age=8" in c.Spawner.args
    assert "--ProjectAuthorizer.connections_recheck_s=4" in c.Spawner.args  # twice in it
    (gateway,) = [s for s in c.JupyterHub.services if s["name"] == ssh.SERVICE]
    assert handed_on(gateway).sharing.revoke_within_s == 8
    for bad in ("1", "3601", "8s", "-5", "08\n"):
        with pytest.raises(ValueError, match="GPULAB_REVOKE_WITHIN_S"):
            applied({"GPULAB_REVOKE_WITHIN_S": bad})


def test_the_gpu_queue_and_usage_ledger_sit_beside_the_allocation_record(tmp_path):
    from gpulab_hub.gpus.spawner import GpuTraits

    s = GpuTraits(allocations_file=str(tmp_path / "hub" / "gpu-allocations.json"))
    assert s.queue_file == str(tmp_path / "hub" / "gpu-queue.json")
    assert s.usage_file == str(tmp_path / "hub" / "gpu-usage.jsonl")
    moved = GpuTraits(allocations_file="/a/gpus.json", usage_file="/b/use.jsonl")
    assert (moved.queue_file, moved.usage_file) == ("/a/gpu-queue.json", "/b/use.jsonl")

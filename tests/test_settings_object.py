"""One settings object: every documented site variable is read by the one parser, reaches
the object and from there what uses it (the hub's configuration, its pages, the SSH
gateway, the GPU keeper, the ``gpulab`` command); each default is written once."""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from pathlib import Path

import pytest
from traitlets.config import Config

from gpulab_hub import egress, hubconfig, hubsettings, settings
from gpulab_hub.cli import backup as cli_backup
from gpulab_hub.cli import base_spec_for, local_url
from gpulab_hub.gpus import Inventory, keeper, reclaim
from gpulab_hub.projects import objects
from gpulab_hub.ssh import limits
from gpulab_hub.ssh.settings import Settings as GatewaySettings

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
HUB = REPO / "spawner" / "gpulab_hub"
HUB_API = {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api", "JUPYTERHUB_API_TOKEN": "t"}

# A value other than the default for every site variable (a new variable must be added
# here, and so be shown to reach what uses it).
SAMPLES = {
    "GPULAB_HOME": "/data/elsewhere",
    "GPULAB_BIND_URL": "http://10.1.2.3:9000",
    "GPULAB_PUBLIC_URL": "https://lab.example.org/",
    "GPULAB_SUBDOMAIN_HOST": "https://lab.example.org",
    "GPULAB_HUB_PORT": "18081",
    "GPULAB_PROXY_API_PORT": "18001",
    "GPULAB_NETWORK": "labnet",
    "GPULAB_HUB_IP": "172.30.0.1",
    "GPULAB_HUB_CONNECT_IP": "gpulab-hub",
    "GPULAB_CONTAINER_PREFIX": "lab",
    "GPULAB_IDLE_TIMEOUT": "600",
    "GPULAB_DB_URL": "postgresql+psycopg://gpulab:pw@db.example.org/gpulab",
    "GPULAB_ADMIN": "root",
    "GPULAB_ADMIN_PASSWORD": "a long admin password",
    "GPULAB_ADMIN_IDENTITY": "0b9a54c2-6c1e-4d1c-9f5e-2d1f0e7c4a11",
    "GPULAB_OPEN_SIGNUP": "1",
    "GPULAB_AUTHENTICATOR": "ldap",
    "GPULAB_LDAP_SERVER": "ldap.example.org",
    "GPULAB_LDAP_PORT": "1636",
    "GPULAB_LDAP_TLS": "before_bind",
    "GPULAB_LDAP_BIND_DN_TEMPLATE": "uid={username},ou=people,dc=example,dc=org",
    "GPULAB_LDAP_GROUPS": "cn=gpu,ou=groups,dc=example,dc=org",
    "GPULAB_OIDC_ISSUER": "https://sso.example.org/realms/lab",
    "GPULAB_OIDC_CLIENT_ID": "gpulab",
    "GPULAB_OIDC_CLIENT_SECRET": "an oidc client secret",
    "GPULAB_OIDC_USERNAME_CLAIM": "email",
    "GPULAB_OIDC_GROUPS_CLAIM": "roles",
    "GPULAB_OIDC_SCOPES": "openid,email",
    "GPULAB_GITHUB_CLIENT_ID": "gh-client",
    "GPULAB_GITHUB_CLIENT_SECRET": "a github client secret",
    "GPULAB_GITHUB_ORGS": "my-lab",
    "GPULAB_ALLOWED_GROUPS": "gpu",
    "GPULAB_MAX_PROJECTS": "3",
    "GPULAB_PASSWORD_MIN_LENGTH": "14",
    "GPULAB_PASSWORD_CHECK_COMMON": "0",
    "GPULAB_LOGIN_ATTEMPTS": "9",
    "GPULAB_LOGIN_LOCKOUT_SECONDS": "60",
    "GPULAB_DELETED_FILES": "remove",
    "GPULAB_BACKUP_PROJECT_FILES": "50000",
    "GPULAB_BACKUP_PROJECT_MB": "2048",
    "GPULAB_SHARE_MAX_HOURS": "12",
    "GPULAB_PUBLIC_LINKS": "1",
    "GPULAB_REVOKE_WITHIN_S": "8",
    "GPULAB_SSH_PORT": "2200",
    "GPULAB_SSH_BIND": "10.9.9.9",
    "GPULAB_SSH_IP_ATTEMPTS": "7",
    "GPULAB_SSH_FAILURE_WINDOW": "120",
    "GPULAB_BASE_IMAGE": "lab/base:1",
    "GPULAB_BASE_FROM": "lab/debian:trixie",
    "GPULAB_TORCH_CUDA_ARCH_LIST": "9.0",
    "GPULAB_TORCH": "torch==2.9.1",
    "GPULAB_IMAGE_REPO": "lab/project",
    "GPULAB_BUILD_DISK_LIMIT_MB": "768",
    "GPULAB_PREBUILD": "minimal,pytorch",
    "GPULAB_STARTING_POINT_TORCH": "cuda",
    "GPULAB_CPU_TORCH_INDEX": "https://mirror.example.org/whl/cpu",
    "GPULAB_GPU_POLICY": "shared",
    "GPULAB_GPU_ISOLATION": "devices",
    "GPULAB_DRIVER_DIR": "/opt/nvidia-driver",
    "GPULAB_GPU_RECLAIM_IDLE": "900",
    "GPULAB_GPU_RECLAIM_GRACE": "120",
    "GPULAB_GPU_IDLE_RELEASE": "3600",
    "GPULAB_ALLOW_METADATA": "1",
    "GPULAB_REFUSED_NETWORKS": "none",
    "GPULAB_ALLOWED_NETWORKS": "10.20.0.5",
}
# GPULAB_* names in the docs that are not site settings of the hub: the compose file's own
# variable, what images and the user side set for themselves, and (below) the
# environment the hub gives projects (gpulab_contract.environment).
NOT_SITE_SETTINGS = {
    "GPULAB_PUBLISH",  # compose.yml: where browsers reach the proxy
    "GPULAB_HUB_BASE",  # compose.yml: the image the hub image is built FROM
    "GPULAB_HOST_GPUS",  # the base image's nvidia-smi stand-in
    "GPULAB_GPU_SHARING",  # a WSL2 project's container
    "GPULAB_PRECISION",  # a job's own
    "GPULAB_ENV_SINCE",  # %gpu_install's own
    "GPULAB_PROGRESS",  # %gpu_install's own
    "GPULAB_GPU_RECLAIM_",  # "GPULAB_GPU_RECLAIM_*" in prose
    settings.SERVICE_VAR,  # the hub's hand-over of the settings to its services
    "GPULAB_LOOP_GUARD",  # the test suite's switch of the event-loop guard (blocking.py)
    "GPULAB_TEST_PREFIX",  # the test suite's names of Docker objects
    "GPULAB_TEST_RUN_PREFIX",  # the same, before each test worker adds its own name
}


def documented_variables() -> set[str]:
    """Every GPULAB_* name the hand-written docs mention, that is not the project's."""
    from gpulab_contract import environment

    found = set()
    for page in [*DOCS.glob("*.md"), REPO / "README.md"]:
        if page.name != "reference.md":  # generated from the parser's own list
            found |= set(re.findall(r"GPULAB_[A-Z0-9_]+", page.read_text()))
    project_side = set(environment.NAMES) - set(settings.variables())
    return found - NOT_SITE_SETTINGS - project_side


def test_every_documented_variable_is_parsed_and_every_parsed_one_documented():
    parsed = set(settings.variables())
    assert documented_variables() == parsed
    assert set(SAMPLES) == parsed, "give every site variable a sample value above"
    # configuration.md's tables give each one's default and meaning
    table = set(
        re.findall(r"^\| `(GPULAB_[A-Z0-9_]+)` \|", (DOCS / "configuration.md").read_text(), re.M)
    )
    assert table == parsed


def what_uses_the_settings(env: dict[str, str]) -> dict:
    """Everything the parts that read the settings make of ``env``: the hub's
    configuration, its pages' settings, the SSH gateway's and the GPU keeper's (from
    the environment the hub gives them), and the ``gpulab`` command's."""
    c = Config()
    hubconfig.apply(c, {"GPULAB_HUB_IP": "127.0.0.1", **env}, images_dir="/i")
    s = hubconfig.finish(c)
    services = {svc["name"]: svc.get("environment", {}) for svc in c.JupyterHub.services}
    hub = {k: v for k, v in c.items() if k != "JupyterHub"}
    hub["JupyterHub"] = {
        k: v for k, v in c.JupyterHub.items() if k not in ("services", "tornado_settings")
    }
    hub["tornado"] = {
        k: v
        for k, v in c.JupyterHub.tornado_settings.get_value({}).items()
        if k != settings.APP_KEY
    }
    hub["services"] = [
        {k: v for k, v in svc.items() if k != "environment"} for svc in c.JupyterHub.services
    ]
    gateway = (
        GatewaySettings.from_env({**services["gpulab-ssh"], **HUB_API})
        if "gpulab-ssh" in services
        else None
    )
    kept = keeper.Keeper.of(settings.of_service(services[keeper.SERVICE]))
    cli = settings.parse(env)
    return {
        "hub configuration": repr(hub),
        "pages (layout)": s.layout,
        "SSH gateway": gateway,
        "GPU keeper": kept,
        "gpulab command": (
            base_spec_for(cli, Inventory()),
            local_url(cli.bind_url),
            cli.hub_port,
            cli.admin_password_file,
            egress.policy_of(cli, resolvers=()),  # the rules `gpulab up` sets
            cli_backup.limits_of(cli),  # what one project may put in `gpulab backup`
        ),
    }


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_variable_reaches_the_object_and_what_uses_it(name, monkeypatch):
    for var in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(var, raising=False)
    path = settings.variables()[name]
    parsed = settings.parse({name: SAMPLES[name]})
    assert settings.value_at(parsed, path) != settings.value_at(settings.DEFAULT, path)
    before, after = what_uses_the_settings({}), what_uses_the_settings({name: SAMPLES[name]})
    changed = [part for part in before if before[part] != after[part]]
    assert changed, f"{name} is parsed but nothing that reads the settings uses it"


def test_a_bad_value_stops_the_start_naming_the_variable():
    for name, bad in [
        ("GPULAB_HUB_PORT", "80a"),
        ("GPULAB_OPEN_SIGNUP", "yes"),
        ("GPULAB_DELETED_FILES", "shred"),
        ("GPULAB_PASSWORD_MIN_LENGTH", "ten"),
        ("GPULAB_SSH_FAILURE_WINDOW", "0"),
        ("GPULAB_GPU_POLICY", "fair"),
        ("GPULAB_BUILD_DISK_LIMIT_MB", "1e9"),
        ("GPULAB_PREBUILD", "pytorch, minimal"),
        ("GPULAB_STARTING_POINT_TORCH", "rocm"),
        ("GPULAB_CPU_TORCH_INDEX", "https://x.org/cpu --extra-index-url=http://evil"),
    ]:
        with pytest.raises(ValueError, match=name):
            hubconfig.apply(Config(), {name: bad}, images_dir="/i")


def test_pages_get_the_settings_the_config_file_made():
    """The object the hub's configuration completed is the one its pages read."""
    c = Config()
    hubconfig.apply(c, {"GPULAB_HUB_IP": "127.0.0.1", "GPULAB_SHARE_MAX_HOURS": "12"}, "/i")
    c.ProjectSpawner.records_dir = "/var/lib/gpulab"  # the admin's own line
    done = hubconfig.finish(c)

    class Page:  # what a JupyterHub handler offers: the tornado application's settings
        settings = {"config": c, **c.JupyterHub.tornado_settings.get_value({})}

    assert settings.of_handler(Page()) is done
    assert hubsettings.of_handler(Page()).public_links == Path("/var/lib/gpulab/public-links.json")
    assert done.sharing.share_max_hours == 12


def test_the_settings_survive_the_hand_over_to_a_service():
    s = hubconfig.complete(Config(), settings.parse(SAMPLES))
    back = settings.of_service(settings.service_env(s))
    # the database URL (it may hold a password) reaches services only in the layout
    # (JupyterHub.db_url), for those that read gpulab's tables (the usage ledger)
    assert back == dataclasses.replace(
        s,
        db_url="",
        accounts=dataclasses.replace(s.accounts, admin_password=""),
        login=dataclasses.replace(s.login, oidc_client_secret="", github_client_secret=""),
    )
    assert SAMPLES["GPULAB_ADMIN_PASSWORD"] not in settings.service_env(s)[settings.SERVICE_VAR]


# --- each default in one place -------------------------------------------------------------


def test_the_traits_and_every_reader_report_the_objects_defaults():
    from gpulab_hub.sharing import REVOKE_WITHIN_S
    from gpulab_hub.spawner import ProjectSpawner

    d = settings.DEFAULT
    sp = ProjectSpawner()
    where = hubsettings.default_layout(d.home)
    # the traits an admin sets: their defaults are the object's
    assert (sp.driver_dir, sp.gpu_policy, sp.gpu_isolation) == (
        d.gpus.driver_dir, d.gpus.policy, d.gpus.isolation,
    )  # fmt: skip
    assert (sp.base_image, sp.image_repo) == (d.images.base_image, d.images.image_repo)
    assert (Path(sp.projects_root), Path(sp.records_dir)) == (
        where.projects_root,
        where.records_dir,
    )
    assert (Path(sp.data_root), Path(sp.state_root)) == (where.data_root, where.state_root)
    assert Path(sp.allocations_file) == where.allocations_file
    assert (sp.gpu_reclaim_idle, sp.gpu_reclaim_grace) == (
        reclaim.Rules().idle_after, reclaim.Rules().grace,
    )  # fmt: skip
    # the layout pages and the doctor read, a project's GPUs, the sharing pages
    assert hubsettings.from_spawner(sp) == where
    assert where.driver_dir == objects.GpuAssignment().driver_dir == d.gpus.driver_dir
    assert REVOKE_WITHIN_S == d.sharing.revoke_within_s
    # the SSH gateway's limits and recheck, with nothing set and from the hub's hand-over
    gw = GatewaySettings.from_env({**settings.service_env(d), **HUB_API})
    assert gw.limits == limits.Limits() == limits.Limits.of(d)
    assert (limits.Limits().user_failures, limits.Limits().ip_failures) == (
        d.accounts.login_attempts, d.ssh.ip_attempts,
    )  # fmt: skip
    assert gw.recheck_s == d.sharing.revoke_within_s / 2 == GatewaySettings.recheck_s
    assert gw.port == d.ssh.port
    # the command: its hub URL and SSH port
    assert local_url(d.bind_url) == "http://127.0.0.1:8000/"


# Defaults that were once written in several modules (or could be): each may stand whole
# in the hub's source once, in the settings module (or the layout's, layout.py, for a
# default the layout shares with the settings).
ONCE = [
    settings.DEFAULT.gpus.driver_dir,
    str(settings.DEFAULT.home),
    settings.DEFAULT.images.base_image,
    settings.DEFAULT.images.image_repo,
    settings.DEFAULT.bind_url,
    settings.DEFAULT.hub_port,
    settings.DEFAULT.proxy_api_port,
    settings.DEFAULT.ssh.port,
    settings.DEFAULT.idle_timeout_s,
    settings.DEFAULT.sharing.share_max_hours,
]


@functools.cache
def hub_constants() -> tuple[tuple[str, int, object], ...]:
    """(file, line, value) of every constant in the hub's source (read once a run)."""
    found = []
    for path in sorted(HUB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant):
                found.append((str(path.relative_to(HUB)), node.lineno, node.value))
    return tuple(found)


@pytest.mark.parametrize("value", ONCE)
def test_each_default_is_written_once(value):
    where = [
        f"{path}:{line}"
        for path, line, constant in hub_constants()
        if type(constant) is type(value) and constant == value
    ]
    assert where and all(w.startswith(("settings.py:", "layout.py:")) for w in where), where
    assert len(where) == 1, where


def test_the_command_says_which_variable_is_wrong(monkeypatch, capsys):
    from gpulab_hub import cli

    monkeypatch.setenv("GPULAB_OPEN_SIGNUP", "yes")
    assert cli.main(["status"]) == 1
    err = capsys.readouterr().err
    assert err == "gpulab: GPULAB_OPEN_SIGNUP must be 1 (on) or 0 (off); it is 'yes'.\n"

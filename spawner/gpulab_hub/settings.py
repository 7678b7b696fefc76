"""gpulab's settings: one typed object, parsed once, handed to every part.

Three words, each meaning one thing (docs/architecture.md, "Settings"):

- **settings**: the :class:`Settings` object here: every value the site sets with a
  ``GPULAB_*`` environment variable, parsed and checked by :func:`parse` (the one
  reader of those variables on the hub side), plus the :attr:`Settings.layout` the
  hub's traits give. Every default is a field's default below (those the layout
  shares: layout.py's), and nowhere else. How one variable's text is read, and the
  ``SettingError`` that says it is not allowed: settingvalues.py.
- **layout**: where files live (:class:`~gpulab_hub.layout.Layout` in layout.py,
  derived by hubsettings.py): paths from ``GPULAB_HOME``, moved where the admin's
  traits move them.
- **traits**: the ``config=True`` traits of gpulab's configurable classes
  (``c.ProjectSpawner.* = ...`` in jupyterhub_config.py, docs/reference.md).

The hub parses the settings once when it reads jupyterhub_config.py
(``hubconfig.apply``), completes them with the layout after the admin's lines
(``hubconfig.finish``) and hands them to its pages (the tornado setting
:data:`APP_KEY`: :func:`of_handler`) and to its services (one variable,
:data:`SERVICE_VAR`, written by :func:`service_env` and read by :func:`of_service`).
The ``gpulab`` command and the doctor parse them once per run (:func:`parse`).

Nothing here imports gpulab's capabilities (only settingvalues.py and layout.py, at
the bottom with it): this module sits at the bottom of the house, and everything may
read it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpulab_hub.layout import DATABASE, DRIVER_DIR, Layout, sqlite_url
from gpulab_hub.settingvalues import (
    LAN_NETWORKS,
    PORT,
    SECONDS,
    choice,
    database_url,
    dns,
    flag,
    host_or_empty,
    index_url,
    is_ip,
    names,
    names_or_all,
    networks,
    optional,
    url_or_empty,
    var,
    whole,
)

APP_KEY = "gpulab"  # the tornado setting that holds the hub's Settings (pages)
SERVICE_VAR = "GPULAB_SETTINGS"  # the variable that hands them to a hub service


# --- the settings ---------------------------------------------------------------------


@dataclass(frozen=True)
class Accounts:
    """Accounts and logins (accounts/, docs/configuration.md "Users")."""

    admin: str = var("GPULAB_ADMIN", "admin")
    admin_password: str = var("GPULAB_ADMIN_PASSWORD", "", secret=True)
    # the lab's own logins: the provider's id of the admin's person (OpenID Connect sub,
    # LDAP entryUUID=..., GitHub user id); empty: whoever first signs in as the admin
    admin_identity: str = var("GPULAB_ADMIN_IDENTITY", "")
    open_signup: bool = var("GPULAB_OPEN_SIGNUP", False, flag)
    max_projects: int = var("GPULAB_MAX_PROJECTS", 10, whole(1, 100_000))
    password_min_length: int = var("GPULAB_PASSWORD_MIN_LENGTH", 10, whole(1, 1000))
    password_check_common: bool = var("GPULAB_PASSWORD_CHECK_COMMON", True, flag)
    # wrong passwords in a row that lock an account (0: never); the SSH gateway's
    # per-account limit too (ssh/limits.py)
    login_attempts: int = var("GPULAB_LOGIN_ATTEMPTS", 5, whole(0, 1000))
    login_lockout_s: int = var("GPULAB_LOGIN_LOCKOUT_SECONDS", 300, whole(1, 86_400))
    deleted_files: str = var("GPULAB_DELETED_FILES", "archive", choice("archive", "remove"))


@dataclass(frozen=True)
class Login:
    """Who may log in, and how (accounts/providers.py, docs/authentication.md)."""

    # local: gpulab's own accounts (sign-up, admin approval); the others are the lab's
    # own logins (JupyterHub's ldapauthenticator and oauthenticator).
    authenticator: str = var(
        "GPULAB_AUTHENTICATOR", "local", choice("local", "ldap", "oidc", "github")
    )
    ldap_server: str = var("GPULAB_LDAP_SERVER", "", host_or_empty)
    ldap_port: int | None = var("GPULAB_LDAP_PORT", None, optional(PORT))
    ldap_tls: str = var(
        "GPULAB_LDAP_TLS", "on_connect", choice("on_connect", "before_bind", "insecure")
    )
    # e.g. uid={username},ou=people,dc=example,dc=org (or DOMAIN\\{username} on AD)
    ldap_bind_dn: str = var("GPULAB_LDAP_BIND_DN_TEMPLATE", "")
    # group DNs whose members may log in; each becomes a JupyterHub group (its cn)
    ldap_groups: tuple[str, ...] = var("GPULAB_LDAP_GROUPS", (), dns)
    oidc_issuer: str = var("GPULAB_OIDC_ISSUER", "", url_or_empty)
    oidc_client_id: str = var("GPULAB_OIDC_CLIENT_ID", "")
    oidc_client_secret: str = var("GPULAB_OIDC_CLIENT_SECRET", "", secret=True)
    oidc_username_claim: str = var("GPULAB_OIDC_USERNAME_CLAIM", "preferred_username")
    oidc_groups_claim: str = var("GPULAB_OIDC_GROUPS_CLAIM", "groups")
    oidc_scopes: tuple[str, ...] = var("GPULAB_OIDC_SCOPES", ("openid", "profile", "email"), names)
    github_client_id: str = var("GPULAB_GITHUB_CLIENT_ID", "")
    github_client_secret: str = var("GPULAB_GITHUB_CLIENT_SECRET", "", secret=True)
    # organisations (org) or teams (org:team) whose members may log in
    github_orgs: tuple[str, ...] = var("GPULAB_GITHUB_ORGS", (), names)
    # who may log in besides (every provider's groups: GPULAB_LDAP_GROUPS, the IdP's groups)
    allowed_groups: tuple[str, ...] = var("GPULAB_ALLOWED_GROUPS", (), names)


@dataclass(frozen=True)
class Sharing:
    """Shares, links and how soon a revoke takes effect (sharing/)."""

    share_max_hours: int = var("GPULAB_SHARE_MAX_HOURS", 168, whole(1, 100_000))
    public_links: bool = var("GPULAB_PUBLIC_LINKS", False, flag)
    # Seconds within which a revoked or lowered share stops working: project servers'
    # caches of token checks and share lists; the SSH gateway rechecks twice in it.
    revoke_within_s: int = var(
        "GPULAB_REVOKE_WITHIN_S", 30, whole(2, 3600, "a whole number of seconds")
    )


@dataclass(frozen=True)
class SSH:
    """The SSH gateway into projects (ssh/, docs/remote.md)."""

    port: int = var("GPULAB_SSH_PORT", 2222, whole(0, 65535, "a port number (0: no gateway)"))
    bind: str = var("GPULAB_SSH_BIND", "", host_or_empty)  # "": the host of bind_url
    # failed logins from one address within failure_window_s that lock the address
    ip_attempts: int = var("GPULAB_SSH_IP_ATTEMPTS", 30, whole(1, 100_000))
    failure_window_s: int = var("GPULAB_SSH_FAILURE_WINDOW", 600, whole(1, 86_400))


@dataclass(frozen=True)
class Images:
    """Base and project images (images/)."""

    base_image: str = var("GPULAB_BASE_IMAGE", "gpulab/base:latest")
    base_from: str = var("GPULAB_BASE_FROM", "")  # "": the host decides (images/base.py)
    torch_cuda_arch_list: str = var("GPULAB_TORCH_CUDA_ARCH_LIST", "")
    torch: str = var("GPULAB_TORCH", "")  # "": the host decides
    image_repo: str = var("GPULAB_IMAGE_REPO", "gpulab/project")
    # MiB one build may add to the engine's disk (None: ProjectSpawner.build_disk_limit)
    build_disk_limit_mb: int | None = var(
        "GPULAB_BUILD_DISK_LIMIT_MB", None, optional(whole(1, 999_999_999, "a number of MiB"))
    )
    # the starting points built in the background after the hub starts (None: the trait's
    # default, all; () for "none"), and the torch of the PyTorch and Hugging Face ones
    prebuild: tuple[str, ...] | None = var("GPULAB_PREBUILD", None, optional(names_or_all))
    starting_point_torch: str | None = var(
        "GPULAB_STARTING_POINT_TORCH", None, optional(choice("auto", "cpu", "cuda"))
    )
    cpu_torch_index: str | None = var("GPULAB_CPU_TORCH_INDEX", None, optional(index_url))


@dataclass(frozen=True)
class Gpus:
    """GPUs: how they are shared and given, and when idle holders are reclaimed."""

    policy: str = var("GPULAB_GPU_POLICY", "exclusive", choice("exclusive", "shared"))
    isolation: str = var("GPULAB_GPU_ISOLATION", "auto")
    driver_dir: str = var("GPULAB_DRIVER_DIR", DRIVER_DIR)
    # Seconds (None: the ProjectSpawner traits gpu_reclaim_idle, gpu_reclaim_grace,
    # gpu_idle_release, whose defaults are gpus/reclaim.py's)
    reclaim_idle: float | None = var("GPULAB_GPU_RECLAIM_IDLE", None, optional(SECONDS))
    reclaim_grace: float | None = var("GPULAB_GPU_RECLAIM_GRACE", None, optional(SECONDS))
    idle_release: float | None = var("GPULAB_GPU_IDLE_RELEASE", None, optional(SECONDS))


@dataclass(frozen=True)
class Egress:
    """What projects and builds may reach beyond the box (egress.py, docs/security.md
    "Beyond the box"): the internet (the package index), not the cloud's metadata
    service or the LAN, unless the admin allows a network."""

    # 1: projects and builds may reach the cloud's metadata service (169.254.169.254,
    # fd00:ec2::254): on a cloud VM, the instance's credentials
    allow_metadata: bool = var("GPULAB_ALLOW_METADATA", False, flag)
    # networks projects and builds may not reach ("lan": LAN_NETWORKS; "none")
    refused_networks: tuple[str, ...] = var("GPULAB_REFUSED_NETWORKS", LAN_NETWORKS, networks)
    # networks they may reach although refused above (a package mirror on the LAN)
    allowed_networks: tuple[str, ...] = var("GPULAB_ALLOWED_NETWORKS", (), networks)


@dataclass(frozen=True)
class Backup:
    """What one project folder may put in ``gpulab backup --projects`` (backup/,
    docs/backup.md): what is over is left out, each entry named, one line per project."""

    # entries (files, folders, links) of one project folder (0: no limit)
    project_files: int = var("GPULAB_BACKUP_PROJECT_FILES", 1_000_000, whole(0, 999_999_999))
    # MiB of one project folder's files, a sparse file counted by its data (0: no limit)
    project_mb: int = var(
        "GPULAB_BACKUP_PROJECT_MB", 0, whole(0, 999_999_999, "a whole number of MiB")
    )


@dataclass(frozen=True)
class Settings:
    """Everything gpulab runs with (module docstring). Fields with a ``var`` come from
    the environment; ``layout`` from the hub's traits (None until they are read)."""

    home: Path = var("GPULAB_HOME", Path("/srv/gpulab"), lambda n, v: Path(v))
    bind_url: str = var("GPULAB_BIND_URL", "http://127.0.0.1:8000")  # this machine only
    public_url: str = var("GPULAB_PUBLIC_URL", "")
    # "": see __post_init__; set by an admin whose own TLS proxy is in front
    subdomain_host: str = var("GPULAB_SUBDOMAIN_HOST", "")
    hub_port: int = var("GPULAB_HUB_PORT", 8081, PORT)
    proxy_api_port: int = var("GPULAB_PROXY_API_PORT", 8001, PORT)
    network: str = var("GPULAB_NETWORK", "")  # "": <prefix>-net (network_name)
    hub_ip: str = var("GPULAB_HUB_IP", "")
    hub_connect_ip: str = var("GPULAB_HUB_CONNECT_IP", "")
    prefix: str = var("GPULAB_CONTAINER_PREFIX", "gpulab")
    idle_timeout_s: int = var("GPULAB_IDLE_TIMEOUT", 7200, SECONDS)  # 0: never
    # the hub's database (JupyterHub's tables and gpulab's); "": SQLite in the hub folder.
    # Secret: a PostgreSQL URL may hold the password.
    db_url: str = var("GPULAB_DB_URL", "", database_url, secret=True)
    accounts: Accounts = field(default_factory=Accounts)
    login: Login = field(default_factory=Login)
    sharing: Sharing = field(default_factory=Sharing)
    ssh: SSH = field(default_factory=SSH)
    images: Images = field(default_factory=Images)
    gpus: Gpus = field(default_factory=Gpus)
    egress: Egress = field(default_factory=Egress)
    backup: Backup = field(default_factory=Backup)
    layout: Layout | None = None  # from the traits (hubconfig.finish, hubsettings.py)

    def __post_init__(self) -> None:
        # Behind gpulab's own Caddy, each user's servers are on <user>.<public host>, an
        # origin apart from the hub's (tls/, docs/deployment.md "HTTPS by default").
        # An IP address has no subdomains: there every project shares the hub's origin.
        https = self.public_url.lower().startswith("https://")
        if not self.subdomain_host and https:
            if not is_ip(urlsplit(self.public_url).hostname or ""):
                object.__setattr__(self, "subdomain_host", self.public_url.rstrip("/"))

    @property
    def hub_dir(self) -> Path:
        """The hub's own folder (database, cookie secret, logs, keys): $GPULAB_HOME/hub."""
        return self.home / "hub"

    @property
    def database_url(self) -> str:
        """The hub's database: GPULAB_DB_URL, else the SQLite file in the hub folder."""
        return self.db_url or sqlite_url(self.hub_dir / DATABASE)

    @property
    def admin_password_file(self) -> Path:
        return self.hub_dir / "first-admin-password"

    @property
    def network_name(self) -> str:
        """The bridge network of projects and builds: GPULAB_NETWORK, else <prefix>-net."""
        return network_of(self.prefix, self.network)

    @property
    def ssh_bind(self) -> str:
        """The gateway's address: GPULAB_SSH_BIND, else the host of GPULAB_BIND_URL."""
        bind = self.ssh.bind or urlsplit(self.bind_url).hostname or "0.0.0.0"
        return host_or_empty("GPULAB_SSH_BIND", bind)

    @property
    def revoke_recheck_s(self) -> float:
        """Open connections (SSH sessions) are checked again twice in the window."""
        return self.sharing.revoke_within_s / 2


DEFAULT = Settings()  # every default, in one place: the fields above


def network_of(prefix: str, network: str = "") -> str:
    """The bridge network of projects and builds: ``network``, else <prefix>-net."""
    return network or f"{prefix}-net"


def fields_with_vars(cls=Settings, prefix: tuple[str, ...] = ()):
    """(path of attribute names, dataclasses.Field) of every field read from a variable."""
    for f in dataclasses.fields(cls):
        if "var" in f.metadata:
            yield (*prefix, f.name), f
        elif f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
            f.default_factory
        ):
            yield from fields_with_vars(f.default_factory, (*prefix, f.name))


def variables() -> dict[str, tuple[str, ...]]:
    """Every site variable and where it lands in :class:`Settings` (its attribute path)."""
    return {f.metadata["var"]: path for path, f in fields_with_vars()}


def value_at(s: Settings, path: tuple[str, ...]) -> Any:
    for name in path:
        s = getattr(s, name)
    return s


def shown(value: Any) -> str:
    """A default as the site would write it in the environment ("" for none)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def defaults() -> dict[str, str]:
    """Each site variable and its default, as written in the environment."""
    return {f.metadata["var"]: shown(value_at(DEFAULT, p)) for p, f in fields_with_vars()}


def _build(cls, environ: Mapping[str, str]):
    values = {}
    for f in dataclasses.fields(cls):
        if "var" in f.metadata:
            raw = environ.get(f.metadata["var"]) or ""
            if raw:
                values[f.name] = f.metadata["parse"](f.metadata["var"], raw)
        elif f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
            f.default_factory
        ):
            values[f.name] = _build(f.default_factory, environ)
    return cls(**values)


def parse(environ: Mapping[str, str]) -> Settings:
    """The site's settings from ``environ`` (the process environment, or a dict in
    tests): each GPULAB_* variable checked, or its default where empty or unset.
    ValueError names a variable whose value is not allowed, and says what is."""
    s = _build(Settings, environ)
    s.ssh_bind  # noqa: B018 - checked now: a bad address stops the start, naming it
    return s


# --- handing the settings on -----------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.metadata.get("secret")
        }
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def to_json(s: Settings) -> str:
    """The settings as JSON, secrets left out (what a service gets)."""
    return json.dumps(_plain(s), sort_keys=True)


def _tuples(value: Any) -> Any:
    """JSON's lists as the tuples they were, at every depth."""
    return tuple(map(_tuples, value)) if isinstance(value, list) else value


def _typed(cls, data: Mapping) -> Any:
    import typing

    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        if dataclasses.is_dataclass(hint):
            value = _typed(hint, value)
        elif hint is Path or hint == Path | None:
            value = None if value is None else Path(value)
        elif typing.get_origin(hint) is tuple or isinstance(value, list):
            value = _tuples(value)  # a tuple, or one that may be None (its list in JSON)
        values[f.name] = value
    return cls(**values)


def from_json(text_: str) -> Settings:
    """The settings :func:`to_json` wrote (the layout too, where it was complete)."""
    data = json.loads(text_)
    layout = data.pop("layout", None)
    s = _typed(Settings, data)
    if layout is not None:
        s = dataclasses.replace(s, layout=_typed(Layout, layout))
    return s


def service_env(s: Settings) -> dict[str, str]:
    """What a hub service needs in its environment to have the hub's settings (the one
    writer; :func:`of_service` is the one reader)."""
    return {SERVICE_VAR: to_json(s)}


def of_service(environ: Mapping[str, str]) -> Settings:
    """The hub's settings, in a service the hub started (:func:`service_env`)."""
    given = environ.get(SERVICE_VAR)
    if not given:
        raise ValueError(f"{SERVICE_VAR} is missing: the hub sets it for its services")
    return from_json(given)


def of_handler(handler) -> Settings:
    """The running hub's settings, for one of its pages (hubconfig.finish put them in
    the tornado settings; hubsettings.of_handler reads them for a hub configured
    otherwise)."""
    found = handler.settings.get(APP_KEY)
    if not isinstance(found, Settings):
        raise ValueError("the hub's configuration gave its pages no gpulab settings")
    return found

"""gpulab's settings: one typed object, parsed once, handed to every part.

Three words, each meaning one thing (docs/architecture.md, "Settings"):

- **settings**: the :class:`Settings` object here: every value the site sets with a
  ``GPULAB_*`` environment variable, parsed and checked by :func:`parse` (the one
  reader of those variables on the hub side), plus the :attr:`Settings.layout` the
  hub's traits give. Every default is a field's default below, and nowhere else.
- **layout**: where files live (:class:`Layout`, derived by hubsettings.py): paths from
  ``GPULAB_HOME``, moved where the admin's traits move them.
- **traits**: the ``config=True`` traits of gpulab's configurable classes
  (``c.ProjectSpawner.* = ...`` in jupyterhub_config.py, docs/reference.md).

The hub parses the settings once when it reads jupyterhub_config.py
(``hubconfig.apply``), completes them with the layout after the admin's lines
(``hubconfig.finish``) and hands them to its pages (the tornado setting
:data:`APP_KEY`: :func:`of_handler`) and to its services (one variable,
:data:`SERVICE_VAR`, written by :func:`service_env` and read by :func:`of_service`).
The ``gpulab`` command and the doctor parse them once per run (:func:`parse`).

Nothing here imports gpulab's capabilities: this module sits at the bottom of the
house, and everything may read it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

APP_KEY = "gpulab"  # the tornado setting that holds the hub's Settings (pages)
SERVICE_VAR = "GPULAB_SETTINGS"  # the variable that hands them to a hub service

_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")  # fmt: skip


# --- how one variable is read ----------------------------------------------------------


class SettingError(ValueError):
    """A site variable's value is not allowed; the sentence names it and what it may be."""


def text(name: str, value: str) -> str:
    return value


def flag(name: str, value: str) -> bool:
    if value not in ("0", "1"):
        raise SettingError(f"{name} must be 1 (on) or 0 (off); it is {value!r}.")
    return value == "1"


def whole(low: int, high: int, unit: str = "a whole number") -> Callable[[str, str], int]:
    """A whole number from ``low`` to ``high``, digits only."""

    def parse(name: str, value: str) -> int:
        if not re.fullmatch(r"[0-9]{1,9}", value) or not low <= int(value) <= high:
            raise SettingError(f"{name} must be {unit} from {low} to {high}; it is {value!r}.")
        return int(value)

    return parse


def optional(parse: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """``parse``, or None where the variable is empty: the trait's own default then."""

    def read(name: str, value: str) -> Any:
        return parse(name, value) if value else None

    return read


def choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, value: str) -> str:
        if value not in allowed:
            words = " or ".join(repr(a) for a in allowed)
            raise SettingError(f"{name} must be {words}; it is {value!r}.")
        return value

    return parse


# A package index URL as it may stand unquoted in a Dockerfile's RUN line (projects/stacks).
INDEX_URL = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/%+@:-]*)?")


def index_url(name: str, value: str) -> str:
    if not INDEX_URL.fullmatch(value):
        raise SettingError(
            f"{name} must be an http or https URL (letters, digits and -._~/:%+@ only); "
            f"it is {value[:80]!r}."
        )
    return value


_NAMES = re.compile(r"[a-z0-9][a-z0-9-]{0,39}(?:,[a-z0-9][a-z0-9-]{0,39}){0,31}")


def names_or_all(name: str, value: str) -> tuple[str, ...] | None:
    """``all`` (None: every one), ``none`` (()) or names with commas, no spaces."""
    if value == "all":
        return None
    if value == "none":
        return ()
    if not _NAMES.fullmatch(value):
        raise SettingError(
            f"{name} must be all, none or names with commas (pytorch,minimal); it is {value!r}."
        )
    return tuple(value.split(","))


def host_or_empty(name: str, value: str) -> str:
    """An IP address or a host name, whole; "" where unset."""
    if value and not valid_host(value):
        raise SettingError(f"{name} must be an IP address or a host name; it is {value!r}.")
    return value


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False


def valid_host(value: str) -> bool:
    """An IP address or a host name, whole."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return _HOSTNAME.fullmatch(value) is not None


def var(name: str, default: Any, parse: Callable[[str, str], Any] = text, *, secret=False):
    """A field read from the environment variable ``name``; empty or unset: ``default``.
    ``secret``: never handed to a service (:func:`service_env`)."""
    return field(default=default, metadata={"var": name, "parse": parse, "secret": secret})


# Defaults of traits that other parts read too (the traits take them from here).
GPU_USAGE_WINDOW_S = 7 * 24 * 3600.0  # ProjectSpawner.gpu_usage_window: a week
GPU_USAGE_RETENTION_DAYS = 90.0  # ProjectSpawner.gpu_usage_retention_days

PORT = whole(1, 65535, "a port number")
SECONDS = whole(0, 999_999_999, "a whole number of seconds")


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


def names(name: str, value: str) -> tuple[str, ...]:
    """A comma-separated list of names (spaces around each are dropped)."""
    return tuple(n.strip() for n in value.split(",") if n.strip())


def dns(name: str, value: str) -> tuple[str, ...]:
    """LDAP DNs separated by semicolons (a DN holds commas)."""
    return tuple(n.strip() for n in value.split(";") if n.strip())


def url_or_empty(name: str, value: str) -> str:
    """An http(s) URL with a host, whole; "" where unset."""
    if value and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
        raise SettingError(f"{name} must be an https:// URL; it is {value!r}.")
    return value


DATABASE_BACKENDS = {"sqlite": ("", "pysqlite"), "postgresql": ("", "psycopg", "psycopg2")}


def database_url(name: str, value: str) -> str:
    """The hub's database as SQLAlchemy names it: SQLite (``sqlite:///<file>``) or
    PostgreSQL (``postgresql+psycopg://user:password@host/db``, or its socket:
    ``postgresql+psycopg://user@/db?host=/run/postgresql``); "" where unset."""
    if not value:
        return value
    import sqlalchemy as sa

    try:
        url = sa.make_url(value)
    except sa.exc.ArgumentError:
        raise SettingError(
            f"{name} is not a database URL (like postgresql+psycopg://gpulab@db/gpulab)."
        ) from None
    drivers = DATABASE_BACKENDS.get(url.get_backend_name())
    if drivers is None or (url.drivername.partition("+")[2] not in drivers):
        raise SettingError(
            f"{name} names a database gpulab does not run on ({url.drivername}): use "
            "sqlite:///<file> or postgresql+psycopg://..."
        )
    return value


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
    driver_dir: str = var("GPULAB_DRIVER_DIR", "/usr/local/nvidia")
    # Seconds (None: the ProjectSpawner traits gpu_reclaim_idle, gpu_reclaim_grace,
    # gpu_idle_release, whose defaults are gpus/reclaim.py's)
    reclaim_idle: float | None = var("GPULAB_GPU_RECLAIM_IDLE", None, optional(SECONDS))
    reclaim_grace: float | None = var("GPULAB_GPU_RECLAIM_GRACE", None, optional(SECONDS))
    idle_release: float | None = var("GPULAB_GPU_IDLE_RELEASE", None, optional(SECONDS))


def networks(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated IPv4 and IPv6 networks (``10.0.0.0/8``) or addresses; ``lan``
    stands for every private and link-local range (LAN_NETWORKS), ``none`` for none."""
    found: list[str] = []
    for item in names(name, value):
        if item.lower() == "none":
            continue
        if item.lower() == "lan":
            found += LAN_NETWORKS
            continue
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise SettingError(
                f"{name} must be networks such as 10.0.0.0/8 or 192.168.1.20, comma-separated "
                f"(or lan, or none); {item!r} is not one."
            ) from None
    return tuple(dict.fromkeys(found))


# The LAN: private IPv4 ranges, carrier-grade NAT, link-local, unique-local and
# link-local IPv6 (what GPULAB_REFUSED_NETWORKS=lan stands for, its default).
LAN_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                "169.254.0.0/16", "fc00::/7", "fe80::/10")  # fmt: skip


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


# --- the layout: where things live (hubsettings.py derives it) -----------------------------

# Files in ``records_dir`` (the hub's folder), each kept by one module.
SHARING_POLICY = "sharing.json"
GROUP_SHARE_ROLES = "group-share-roles.json"
PUBLIC_LINKS = "public-links.json"
DOCTOR_REPORT = "doctor-last.json"
DELETED = "deleted"
SECRETS = "secrets"  # one file per user (secrets/store.py)
DATABASE = "jupyterhub.sqlite"  # the hub's database (JupyterHub's tables and gpulab's)


# Files beside the GPU allocation record, unless the traits say otherwise.
QUEUE = "gpu-queue.json"  # starts waiting for a GPU
USAGE = "gpu-usage.jsonl"  # ended GPU holdings


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of the SQLite database file ``path``."""
    return f"sqlite:///{path}"


@dataclass(frozen=True)
class Layout:
    """Where gpulab keeps things, and the names it gives Docker objects."""

    records_dir: Path  # hub-owned: sharing records, public links, doctor report, archives
    projects_root: Path
    data_root: Path
    state_root: Path
    allocations_file: Path
    image_repo: str
    base_image: str
    allowed_base_images: tuple[str, ...]  # what project Dockerfiles may name (policy.py)
    prefix: str
    network: str
    queue_file: Path | None = None  # None: QUEUE beside allocations_file
    usage_file: Path | None = None  # None: USAGE beside allocations_file
    usage_window: float = GPU_USAGE_WINDOW_S  # seconds budgets are measured over
    # seconds a usage record is kept after its holding ended (gpu_usage_retention_days)
    usage_retention: float = GPU_USAGE_RETENTION_DAYS * 24 * 3600.0
    # the hub's database (JupyterHub.db_url), where gpulab's tables live (db/); "": the
    # SQLite file DATABASE in records_dir
    db_url: str = ""
    budget_hours: tuple[tuple[str, float], ...] = ()  # ProjectSpawner.gpu_budget_hours
    driver_dir: str = Gpus.driver_dir  # ProjectSpawner.driver_dir (GPULAB_DRIVER_DIR's)
    # how GPUs are granted: the allocator.Policy fields the ProjectSpawner gpu_* traits set
    # other than its defaults (gpu_policy, gpu_shared_cap, gpu_max_per_user, ...)
    allocation_policy: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for name, file in (("queue_file", QUEUE), ("usage_file", USAGE)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, Path(self.allocations_file).parent / file)
        if not self.db_url:
            object.__setattr__(self, "db_url", sqlite_url(Path(self.records_dir) / DATABASE))

    @property
    def sharing_policy(self) -> Path:
        return self.records_dir / SHARING_POLICY

    @property
    def group_share_roles(self) -> Path:
        return self.records_dir / GROUP_SHARE_ROLES

    @property
    def public_links(self) -> Path:
        return self.records_dir / PUBLIC_LINKS

    @property
    def doctor_report(self) -> Path:
        return self.records_dir / DOCTOR_REPORT

    @property
    def deleted_dir(self) -> Path:
        return self.records_dir / DELETED

    @property
    def secrets_dir(self) -> Path:
        return self.records_dir / SECRETS


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

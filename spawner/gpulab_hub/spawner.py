"""ProjectSpawner: one container per project (JupyterHub named server).

Each project's image is built from the Dockerfile the project keeps (content
hash tag, so an unchanged project reuses its image), and its directory is
mounted at /workspace. Containers join gpulab's bridge network (never the
host's), run as the notebook user with no capabilities and no privilege gain,
and within process, memory and CPU limits (docs/security.md). How a start finds or
builds its image is ImageSteps' (spawnerimage.py), mixed in here.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import docker.errors
import docker.tls
import requests.exceptions
from dockerspawner import DockerSpawner
from traitlets import TraitError, default, validate

from gpulab_contract import environment
from gpulab_hub import blocking, host, images, serverready
from gpulab_hub.gpus import allocator, waiting
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.gpus.spawner import GpuTraits
from gpulab_hub.images import project as projectimage
from gpulab_hub.images.startfail import MIN_FAILURE_S, SpawnError, build_failed
from gpulab_hub.projects import (
    DEFAULT_PROJECT,
    Project,
    ProjectError,
    datafolders,
    objects,
    options,
    project_name,
    safe_owner,
)
from gpulab_hub.projects.title import title
from gpulab_hub.projects.traits import ProjectTraits
from gpulab_hub.settings import DEFAULT, network_of
from gpulab_hub.spawnerimage import ImageSteps

# DockerSpawner's settings that ProjectSpawner's container spec does not apply
# (objects.container_spec builds the whole container); setting one is refused.
UNAPPLIED_SETTINGS = (
    "volumes",
    "read_only_volumes",
    "mounts",
    "extra_host_config",
    "extra_create_kwargs",
    "links",
    "allowed_images",
    "mem_guarantee",
    "cpu_guarantee",
)


class ProjectSpawner(ImageSteps, DockerSpawner, ProjectTraits, GpuTraits):
    """Spawn each project (named server) in its own container and image (ImageSteps, ahead
    of DockerSpawner: its ``progress`` is the spawn page's)."""

    _progress_events: list
    _gpus: objects.GpuAssignment = objects.GpuAssignment()

    @default("prefix")
    def _default_prefix(self):
        return DEFAULT.prefix

    @default("network_name")
    def _default_network(self):
        return network_of(self.prefix)

    @validate("network_name")
    def _check_network(self, proposal):
        try:
            return objects.check_network(proposal.value)
        except ValueError as e:
            raise TraitError(str(e)) from e

    @default("mem_limit")
    def _default_mem_limit(self):
        # Room for the hub and the host: no single project can exhaust memory.
        return host.default_mem_limit()

    @default("cpu_limit")
    def _default_cpu_limit(self):
        return host.default_cpu_limit()

    @default("remove")
    def _default_remove(self):
        return True

    @default("pull_policy")
    def _default_pull_policy(self):
        # Project images are built here, never pulled.
        return "never"

    @default("cmd")
    def _default_cmd(self):
        return ["jupyterhub-singleuser"]

    @default("notebook_dir")
    def _default_notebook_dir(self):
        return self.workspace_dir

    @default("ip")
    def _ip_default(self):
        # Inside the container, on its own bridge address; the hub connects to it.
        return "0.0.0.0"

    _docker_info: dict | None = None

    def notebook_owner(self) -> tuple[int, int]:
        """Blocking: host uid/gid of the notebook user, shifted by the engine's
        user-namespace remapping (so files it makes are never a real account's)."""
        cls = ProjectSpawner
        if cls._docker_info is None:
            cls._docker_info = self._docker("info")
        uid_off, gid_off = objects.userns_offset(cls._docker_info)
        return self.notebook_uid + uid_off, self.notebook_gid + gid_off

    def _data_groups(self) -> tuple[str, ...]:
        """The data folders of this user's groups that have one (objects.group_folder:
        a Keycloak group path ``/staff/gpu-team`` is folder ``+staff+gpu-team``)."""
        mine = {g.name for g in self.user.groups}
        folders = (objects.group_folder(g) for g in self.data_groups if g in mine)
        return tuple(f for f in folders if f)

    def _ensure_data_folders(self, settings: objects.ContainerInputs) -> None:
        """Blocking: this project's data folders (hub-owned parents, never through a link)."""
        datafolders.ensure(settings, *self.notebook_owner())

    @property
    def client(self):
        """The hub's Docker client (host.docker_client, as the CLI and doctor make
        theirs), with DockerSpawner's own ``tls_config`` and ``client_kwargs``. Made on
        a Docker pool thread (its constructor asks the engine's version)."""
        cls = ProjectSpawner
        if cls._client is None:
            blocking.off_loop("Making the Docker client")
            extra = dict(self.client_kwargs)
            if self.tls_config:
                extra["tls"] = docker.tls.TLSConfig(**self.tls_config)
            cls._client = host.docker_client(**extra)
        return cls._client

    @property
    def executor(self):
        """The hub's Docker pool (blocking.DOCKER, ``docker_threads`` threads), where
        DockerSpawner's own calls run too."""
        blocking.configure(blocking.DOCKER, self.docker_threads)
        return blocking.pool(blocking.DOCKER)

    @property
    def project(self) -> Project:
        return Project(
            Path(self.projects_root),
            self.user.name,
            project_name(self.name),
            Path(self.state_root),
        )

    def _run(self, fn, *args):
        """``fn(*args)`` on the hub's Docker pool (starts, stops, polls, their records)."""
        return asyncio.wrap_future(self.executor.submit(fn, *args))

    @default("options_form")
    def _default_options_form(self):
        return self._options_form

    @staticmethod
    def _options_form(spawner):
        """The spawn form, made on a worker thread (NVML and files stay off the event loop)."""
        return spawner._run(spawner._options_form_blocking)

    def _options_form_blocking(self) -> str:
        try:
            project = self.project
        except ProjectError:
            return ""
        good = projectimage.last_good(project, repo=self.image_repo)
        failed = projectimage.last_build_failed(project)
        changed = bool(good and failed) and projectimage.changed_since_failure(
            self._docker, project, self.image_repo, allowed=tuple(self.allowed_base_images)
        )
        return options.form(good.describe() if good else None, failed, self.gpu_choices(), changed)

    def gpu_choices(self) -> options.GpuChoices | None:
        inv = gpu_spawner.cached_inventory()
        if not inv.devices:
            return None
        whole = [d for d in inv.devices if not d.parent_uuid and not d.mig_mode]
        limit = min(len(whole), self.gpu_max_per_project or len(whole))
        kept = options.remembered(self)  # the project's last choice, else the site's
        return options.GpuChoices(
            max_count=limit,
            default_count=min(kept.get("gpus", self.default_gpus), limit),
            types=tuple(self.gpu_allowed_types),
            chosen_type=kept.get("gpu_type", ""),
            chosen_mig=kept.get("mig_profile", ""),
            mig_profiles=tuple(sorted({d.mig_profile for d in inv.devices if d.mig_profile}))
            if self.gpu_allow_mig
            else (),
        )

    @default("options_from_form")
    def _default_options_from_form(self):
        return options.from_form

    def container_settings(self) -> objects.ContainerInputs:
        project = self.project
        return objects.ContainerInputs(
            name=self.container_name,
            image=self.image,
            command=self.cmd + self.get_args(),
            env=self.get_env(),
            project_dir=str(project.path),
            data_root=self.data_root,
            hf_cache_volume=self.hf_cache_volume.format(
                prefix=self.prefix, username=self.escaped_name
            ),
            network=self.network_name,
            port=self.port,
            owner=safe_owner(self.user.name),
            user=f"{self.notebook_uid}:{self.notebook_gid}",
            labels={
                "gpulab.instance": self.prefix,
                "gpulab.owner": self.user.name,
                "gpulab.project": project.name,
            },
            workspace=self.workspace_dir,
            data_mount=self.data_mount,
            hf_cache_mount=self.hf_cache_mount,
            shm_size=self.shm_size,
            mem_limit=self.mem_limit,
            cpu_limit=self.cpu_limit,
            pids_limit=self.pids_limit,
            data_read_all=self.data_read_all,
            data_scope=self.data_scope,
            data_groups=self._data_groups(),
            gpus=self._gpus,
        )

    def get_env(self):
        env = super().get_env()
        # Which image this start runs, for the project's user (docs/projects.md)
        state, note = getattr(self, "_image_note", ("latest", ""))
        env.update(
            environment.build(
                project=project_name(self.name),
                # JupyterLab's tab title names the project as its people know it (renamed
                # only while it is stopped, so the start's name holds while it runs)
                display_name=title(self),
                owner=self.user.name,
                image_state=state,
                image_note=note,
                build_log_url=getattr(self, "_build_log_url", ""),
            )
        )
        return env

    async def create_object(self):
        settings = self.container_settings()
        await self._run(self._ensure_data_folders, settings)
        spec = objects.container_spec(settings)
        client = await self._run(lambda: self.client)  # never made on the event loop
        spec["host_config"] = client.create_host_config(**spec["host_config"])
        return await self.docker("create_container", **spec)

    def _refuse_unapplied_settings(self) -> None:
        """DockerSpawner settings that gpulab's container spec does not apply are an
        error, not silently ignored (the spec is gpulab's hardened one)."""
        for name in UNAPPLIED_SETTINGS:
            if self.trait_has_value(name) and getattr(self, name):
                raise ProjectError(
                    f"The hub sets c.{type(self).__name__}.{name} (a DockerSpawner setting) "
                    "that gpulab does not apply: project containers come from gpulab's own "
                    "spec (docs/security.md). Ask the administrator to remove it "
                    "(docs/configuration.md lists what gpulab offers instead)."
                )

    async def start(self):
        self._progress_events = []
        started = time.monotonic()
        try:
            return await self._start()
        except Exception:
            # A start that fails within JupyterHub's first second shows as a bare error
            # page; one that fails later, on the spawn page with its reason (startfail.py).
            await asyncio.sleep(max(0.0, MIN_FAILURE_S - (time.monotonic() - started)))
            raise

    def _refuse_default_project(self) -> None:
        """gpulab has named projects only: JupyterHub's default server (its REST API and
        admin page can still ask for it) and a project named like it are refused, so no
        hidden project, unlisted by sharing, comes to be."""
        if self.name in ("", DEFAULT_PROJECT):
            raise ProjectError(
                "gpulab has no default project: create a project with a name on the home "
                "page and start that one (through the API: POST "
                f"/hub/api/users/{self.user.name}/servers/<project>)."
            )

    async def _start(self):
        try:
            self._refuse_default_project()
            self._refuse_unapplied_settings()
            opts = options.validate(self.user_options)
            options.refuse_unchecked_display_name(self.orm_spawner, self.name, self.user.db)
            self._emit(2, f"Preparing project {project_name(self.name)}")
            try:
                self.image = await self._prepare_image(opts.get("use_last_good", False))
            finally:
                self._build_log_url = await self._run(self.build_log_url)
            return await self._launch(opts)
        except allocator.AllocationError as e:
            raise SpawnError(str(e), reason="gpus", status_code=409) from e
        except images.BuildError as e:
            good = await self._run(
                projectimage.last_good, self.project, self._docker, self.image_repo
            )
            raise build_failed(
                self.project.name,
                good.describe() if good else "",
                e.tail,
                self._build_log_url,
                limit=e.message if e.limit else "",
            ) from e
        except options.OptionsError as e:
            raise SpawnError(str(e), reason="options") from e
        except blocking.Busy as e:
            raise SpawnError(str(e), reason="busy", status_code=503) from e
        except (ProjectError, host.HostError) as e:
            raise SpawnError(str(e), reason="project") from e
        except (docker.errors.DockerException, requests.exceptions.ConnectionError) as e:
            if (
                isinstance(e, docker.errors.APIError)
                and e.response is not None
                and (e.response.status_code < 500)
            ):
                raise SpawnError(
                    f"Docker refused to start the project: {e.explanation}", reason="docker"
                ) from e
            raise SpawnError(
                "The Docker engine is not reachable, so the project cannot start. "
                "Ask the administrator to start it (`gpulab up` does).",
                reason="docker",
                status_code=503,
            ) from e

    async def _launch(self, opts: dict):
        """Run the prepared image (``self.image``) with the validated options: GPUs from
        this machine's allocator, the container on this machine's engine. Returns
        (ip, port). The Slurm spawner (cluster/spawner.py) submits a job instead."""
        await self._reserve_gpus(opts)
        self._emit(80, "Starting the project's container")
        try:
            ip, port = await super().start()
        except Exception:  # the GPUs back (records pool: the usage ledger's row)
            await blocking.run(
                blocking.RECORDS, gpu_spawner.release, self, self.user.name, self.project.name
            )
            raise
        self._emit(90, "Starting JupyterLab")
        await self._until_answers(ip, port)
        return ip, port

    async def _until_answers(self, ip: str, port: int) -> None:
        """Until the started server answers, polled often (serverready.py), so that
        JupyterHub's own wait, with its back-off, finds it up at its first look. A
        container that exits meanwhile, or a server that stays silent for
        ``http_timeout``, is left to JupyterHub's wait and its error."""
        if self.internal_ssl:
            return
        url = f"http://{ip or '127.0.0.1'}:{port}{self.server.base_url}api"
        deadline = time.monotonic() + self.http_timeout
        while time.monotonic() < deadline:
            if await serverready.answers(url, timeout=min(1.0, deadline - time.monotonic())):
                return
            if await self.poll() is not None:
                return

    async def _reserve_gpus(self, opts: dict) -> None:
        inv = await self._run(gpu_spawner.cached_inventory)
        default = self.default_gpus if inv.devices else 0
        request = allocator.Request(
            owner=self.user.name,
            project=self.project.name,
            count=opts.get("gpus", 0 if opts.get("mig_profile") else default),
            gpu_type=opts.get("gpu_type", ""),
            mig_profile=opts.get("mig_profile", ""),
        )
        try:
            self._gpus, devices = await self._run(
                gpu_spawner.reserve, self, self._docker, self.prefix, request
            )
        except allocator.AllocationError as e:
            admin = bool(getattr(self.user, "admin", False))  # may be told who holds GPUs
            if not (self.gpu_queue and e.busy):  # off, or never possible on this host
                if e.told(admin) != str(e):
                    raise allocator.AllocationError(e.told(admin), e.busy) from None
                raise
            devices, self._gpus = await waiting.wait(
                self, self._docker, self.prefix, request, self._run, self._emit,
                self._budget_members(), self._idle_holders, admin,
            )  # fmt: skip
        for d in devices:
            self._emit(75, f"Reserved GPU {d.index} ({d.name}, {d.uuid})")

    def _idle_holders(self) -> dict[tuple[str, str], float]:
        """Minutes since each running project last reported activity to the hub, for
        those idle at least ``gpu_reclaim_idle`` (the spawn page's "idle 35 min")."""
        from jupyterhub import orm

        db = getattr(self.user, "db", None)
        if db is None:
            return {}
        now = datetime.now(UTC).replace(tzinfo=None)  # the hub keeps naive UTC
        out = {}
        running = db.query(orm.Spawner).filter(orm.Spawner.server_id.isnot(None)).all()
        for sp in running:
            if sp.last_activity is None or sp.user is None:
                continue
            idle_s = (now - sp.last_activity).total_seconds()
            if idle_s >= self.gpu_reclaim_idle:
                out[(sp.user.name, sp.name)] = idle_s / 60
        return out

    def _budget_members(self) -> dict[str, list[str]]:
        """The users of each group the GPU budgets name (from the hub's database)."""
        from jupyterhub import orm

        named = waiting.budget_groups(self)
        if not named:
            return {}
        found = self.user.db.query(orm.Group).filter(orm.Group.name.in_(named)).all()
        return {g.name: [u.name for u in g.users] for g in found}

    async def stop(self, now=False):
        """Out of the GPU queue, the container stopped, its GPUs released: the container
        stops whatever the GPU records do (their helpers log and never raise). The queue,
        the allocation record and the usage ledger (the hub's database) on the records
        pool; only the container's stop on the Docker pool."""
        owner, project = self.user.name, self.project.name
        try:
            await blocking.run(blocking.RECORDS, waiting.cancel, self, owner, project)
        finally:
            try:
                await super().stop(now=now)
            finally:
                await blocking.run(blocking.RECORDS, gpu_spawner.release, self, owner, project)

    async def poll(self):
        status = await super().poll()
        if status is not None:
            # the container died or is gone: its GPUs are free again (records pool)
            await blocking.run(
                blocking.RECORDS, gpu_spawner.release, self, self.user.name, self.project.name
            )
        return status

    async def delete_forever(self):
        """The project (or its user) is deleted: its folder, records, shares and GPUs
        go, so nothing passes to a later account or project of the same name."""
        from gpulab_hub.workflows import deletion

        await deletion.delete_project(self)

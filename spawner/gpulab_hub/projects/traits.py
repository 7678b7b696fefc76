"""Traits of the project side (mixed into ProjectSpawner): where projects, records
and data live, the image templates, the notebook user, the container's limits and
shared data. Every setting is a trait with help (docs/reference.md is made from it).
"""

from __future__ import annotations

from traitlets import (
    Bool,
    Enum,
    Float,
    HasTraits,
    Int,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)

from gpulab_hub.hubsettings import default_layout
from gpulab_hub.projects import objects, stacks
from gpulab_hub.settings import DEFAULT

# Where things live and what images are called, unless the site says otherwise (the
# settings' defaults, under the default GPULAB_HOME): each trait's default below.
_LAYOUT = default_layout(DEFAULT.home)
# The default repository of project images (images/project.py uses the same).
PROJECT_REPO = DEFAULT.images.image_repo


class ProjectTraits(HasTraits):
    """Traits of the project side (mixed into ProjectSpawner)."""

    projects_root = Unicode(
        str(_LAYOUT.projects_root),
        config=True,
        help=f"""Host folder holding every project, as <projects_root>/<user>/<project>/.

        Each project folder holds its Dockerfile and files and is mounted at
        ``workspace_dir`` in its container. Default: {_LAYOUT.projects_root}.
        Example: ``c.ProjectSpawner.projects_root = "/srv/gpulab/projects"``
        """,
    )
    state_root = Unicode(
        str(_LAYOUT.state_root),
        config=True,
        help=f"""Hub-owned folder of what the hub keeps about each project, as
        <state_root>/<user>/<project>/: its last image that built (``image.json``)
        and its build logs (``logs/``). Never inside a project folder, where the
        project's user could change it; made root-only (0700).
        Default: {_LAYOUT.state_root} (``gpulab up``: $GPULAB_HOME/hub/projects).
        Example: ``c.ProjectSpawner.state_root = "/srv/gpulab/hub/projects"``
        """,
    )
    data_root = Unicode(
        str(_LAYOUT.data_root),
        config=True,
        help=f"""Host folder of shared data, mounted at ``data_mount``.

        Its ``datasets`` folder is mounted read-only in every project. What a
        project writes is that project's (``data_scope`` "project", the default):
        ``projects/<user>/<project>/models``, ``.../outputs`` (mounted writable at
        ``models`` and ``outputs``) and ``.../huggingface`` (its Hugging Face
        cache, at ``hf_cache_mount``). With ``data_scope`` "user", each user's
        ``models/<user>`` and ``outputs/<user>`` folders are mounted in all of
        that user's projects instead. Default: {_LAYOUT.data_root}.
        Example: ``c.ProjectSpawner.data_root = "/mnt/shared"``
        """,
    )
    data_scope = Enum(
        list(objects.DATA_SCOPES),
        default_value=objects.PROJECT_SCOPE,
        config=True,
        help="""Whose are the data folders and the Hugging Face cache a project
        container writes. "project": each project has its own
        (``<data_root>/projects/<user>/<project>/``), so a collaborator on one
        project reaches nothing of the owner's other projects. "user": the layout
        gpulab had before this setting, one ``models``, ``outputs`` and cache volume per user,
        mounted in every project of that user, so anyone a project is shared with
        reads and writes the data of all of the owner's projects (choose it only
        where nobody shares projects). Switching leaves the other layout's folders
        where they are (docs/projects.md). Default: "project".
        Example: ``c.ProjectSpawner.data_scope = "user"``""",
    )
    data_mount = Unicode(
        "/data",
        config=True,
        help="""Where the shared data root appears in containers. Default: /data.
        Example: ``c.ProjectSpawner.data_mount = "/data"``""",
    )
    workspace_dir = Unicode(
        "/workspace",
        config=True,
        help="""Where the project folder is mounted in its container; also the
        notebook root. Default: /workspace.
        Example: ``c.ProjectSpawner.workspace_dir = "/workspace"``""",
    )
    images_dir = Unicode(
        config=True,
        help="""Folder of gpulab's image templates (``*.j2``).

        Default: the ``images/`` folder next to the hub's jupyterhub_config.py,
        set there. Example: ``c.ProjectSpawner.images_dir = "/srv/gpulab/images"``
        """,
    )
    project_template = Unicode(
        "project.Dockerfile.j2",
        config=True,
        help="""Template (in ``images_dir``) of a new project's Dockerfile.
        Default: project.Dockerfile.j2.
        Example: ``c.ProjectSpawner.project_template = "my-lab.Dockerfile.j2"``""",
    )
    base_image = Unicode(
        DEFAULT.images.base_image,
        config=True,
        help=f"""Image a new project's Dockerfile starts FROM. Existing projects
        keep the FROM line their Dockerfile has. Default: {DEFAULT.images.base_image}
        (built by ``gpulab up``).
        Example: ``c.ProjectSpawner.base_image = "gpulab/base:cuda12"``""",
    )
    allowed_base_images = List(
        Unicode(),
        config=True,
        help="""Images a project's Dockerfile may name in ``FROM`` and ``COPY --from=``,
        besides its own earlier stages (and ``FROM scratch``). Names are compared
        exactly, after an implicit ``:latest`` is made explicit (``gpulab/base`` is
        ``gpulab/base:latest``); an image ID, another project's image, a registry name
        not on the list or a name built from ARG variables is refused with the line
        number. Each start pins an allowed FROM to the image ID the name has then.
        Default: [``base_image``] (the image new projects start FROM); when you
        change ``base_image``, list the old name here too, or projects whose FROM
        names it stop building. Example:
        ``c.ProjectSpawner.allowed_base_images = ["gpulab/base:latest", "gpulab/base:cuda12"]``""",
    )

    @default("allowed_base_images")
    def _allowed_base_images_default(self) -> list[str]:
        return [self.base_image]

    image_repo = Unicode(
        PROJECT_REPO,
        config=True,
        help=f"""Repository name of project images; each is tagged with a hash of
        its Dockerfile and base image. Default: {PROJECT_REPO}.
        Example: ``c.ProjectSpawner.image_repo = "registry.local/gpulab-project"``""",
    )
    hf_cache_volume = Unicode(
        "{prefix}-hf-{username}",
        config=True,
        help="""With ``data_scope`` "user" only: the Docker volume holding a user's
        Hugging Face cache, shared by that user's projects; ``{prefix}`` is the
        container prefix, ``{username}`` the escaped user name. (With "project",
        each project's cache is the folder
        ``<data_root>/projects/<user>/<project>/huggingface``.)
        Default: {prefix}-hf-{username}.
        Example: ``c.ProjectSpawner.hf_cache_volume = "hf-{username}"``""",
    )
    hf_cache_mount = Unicode(
        "/cache/huggingface",
        config=True,
        help="""Where the project's Hugging Face cache is mounted (HF_HOME).
        Default: /cache/huggingface.
        Example: ``c.ProjectSpawner.hf_cache_mount = "/cache/huggingface"``""",
    )
    shm_size = Unicode(
        "8g",
        config=True,
        help="""Size of /dev/shm in project containers (Docker size string;
        PyTorch data loaders need more than Docker's 64m). Default: 8g.
        Example: ``c.ProjectSpawner.shm_size = "16g"``""",
    )
    notebook_uid = Int(
        1000,
        config=True,
        help="""Numeric user id of the notebook user in project images; project
        folders are given to it. Default: 1000.
        Example: ``c.ProjectSpawner.notebook_uid = 1000``""",
    )
    notebook_gid = Int(
        100,
        config=True,
        help="""Numeric group id of the notebook user in project images. Default: 100.
        Example: ``c.ProjectSpawner.notebook_gid = 100``""",
    )
    build_timeout = Float(
        3600,
        config=True,
        help="""Longest a project image build may take, in seconds. Default: 3600.
        Example: ``c.ProjectSpawner.build_timeout = 1800``""",
    )
    docker_threads = Int(
        8,
        config=True,
        help="""Worker threads for Docker calls (starts, stops, polls, deletes), shared
        by all spawners. Image builds never run on them (``build_threads``), so a slow
        build never makes another start wait. Default: 8.
        Example: ``c.ProjectSpawner.docker_threads = 16``""",
    )
    build_threads = Int(
        4,
        config=True,
        help="""Image builds that run at once, hub-wide, on a pool of their own; more
        wait, and their spawn page says so. Default: 4.
        Example: ``c.ProjectSpawner.build_threads = 2``""",
    )
    build_max_per_user = Int(
        1,
        config=True,
        help="""Image builds one user may run at once (their other starts that need a
        build wait for it, and say so); starts that need no build never wait.
        Default: 1. Example: ``c.ProjectSpawner.build_max_per_user = 2``""",
    )
    build_quick_s = Float(
        120,
        config=True,
        help="""How long a rebuild may run beside the same user's other builds, in
        seconds. A start whose build would wait for the user's own build
        (``build_max_per_user``) runs at once in a lane of its own, one per user: a
        rebuild that takes all but its last steps from Docker's cache (a line that
        %gpu_install appended) ends within seconds. Past this time its running step is
        stopped and the build waits for the user's slot, then goes on from the steps it
        finished. It takes one of the hub's ``build_threads`` only while one is free,
        and gives it up (stopped the same way) to another user's build that finds them
        all taken. 0 turns the lane off. Default: 120.
        Example: ``c.ProjectSpawner.build_quick_s = 60``""",
    )
    build_mem_limit = Int(
        None,
        allow_none=True,
        config=True,
        help="""Memory of one build step, in bytes (a step over it is killed).
        Default: None, the projects' ``mem_limit``.
        Example: ``c.ProjectSpawner.build_mem_limit = 8 * 1024**3``""",
    )
    build_cpu_limit = Float(
        None,
        allow_none=True,
        config=True,
        help="""CPUs one build step may use. Default: None, the projects' ``cpu_limit``.
        Example: ``c.ProjectSpawner.build_cpu_limit = 2.0``""",
    )
    build_pids_limit = Int(
        1024,
        config=True,
        help="""Processes (and threads) one build step may run at once; a fork bomb in a
        Dockerfile stops there. Enforced by gpulab's engine runtime (buildruntime.py).
        Default: 1024. Example: ``c.ProjectSpawner.build_pids_limit = 4096``""",
    )
    build_disk_limit = Int(
        20 * 1024**3,
        config=True,
        help="""Bytes one build may add to the engine's disk (its layers and what the
        running step wrote, checked every second); the step is killed past it.
        Default: 20 GiB. Example: ``c.ProjectSpawner.build_disk_limit = 50 * 1024**3``""",
    )
    build_log_limit = Int(
        4 * 1024**2,
        config=True,
        help="""Bytes of a build's output kept in its log: the first and the last half,
        with a line saying how much was left out. Default: 4 MiB.
        Example: ``c.ProjectSpawner.build_log_limit = 16 * 1024**2``""",
    )
    build_logs_kept = Int(
        10,
        config=True,
        help="""Build logs kept per project (the oldest are removed). Default: 10.
        Example: ``c.ProjectSpawner.build_logs_kept = 30``""",
    )
    records_dir = Unicode(
        str(_LAYOUT.records_dir),
        config=True,
        help=f"""Hub-owned folder of gpulab's hub-wide records: sharing settings,
        group-share roles, public links, the doctor's last report, archives of
        deleted accounts. Hub pages, the ``gpulab`` command and the doctor all read
        it from here (gpulab_hub.hubsettings). Never inside a project folder.
        Default: {_LAYOUT.records_dir} (``gpulab up``: $GPULAB_HOME/hub).
        Example: ``c.ProjectSpawner.records_dir = "/var/lib/gpulab"``""",
    )
    pids_limit = Int(
        4096,
        allow_none=True,
        config=True,
        help="""Most processes and threads one project container may run (a fork
        bomb stops there instead of taking the host); None for Docker's default
        (no limit). Default: 4096. Example: ``c.ProjectSpawner.pids_limit = 8192``""",
    )
    data_read_all = Bool(
        False,
        config=True,
        help="""Let every project read (never write) the per-user ``models`` and
        ``outputs`` folders of every user (``<data_root>/models``, ``.../outputs``:
        the ``data_scope`` "user" layout, and what users wrote before "project"
        became the default), at ``<data_mount>/all/``. Default: False.
        Example: ``c.ProjectSpawner.data_read_all = True``""",
    )
    data_groups = List(
        Unicode(),
        config=True,
        help="""JupyterHub groups that get a shared data folder: members' projects
        mount ``<data_root>/groups/<group>`` writable at ``<data_mount>/groups/<group>``
        (members can change each other's files there). Default: [] (none).
        Example: ``c.ProjectSpawner.data_groups = ["vision-lab"]``""",
    )
    prebuild_stacks = List(
        Unicode(),
        [s.name for s in stacks.STACKS],
        config=True,
        help="""Starting points whose image the hub builds in the background after it
        starts (one at a time, at the lowest CPU priority, never while a user's build
        runs), so the first project from each opens like a cached one. The build is of
        the very Dockerfile a new project of that starting point gets, so its layers are
        the ones that project reuses. Set by ``GPULAB_PREBUILD`` (``all``, ``none`` or
        names with commas). Default: every starting point.
        Example: ``c.ProjectSpawner.prebuild_stacks = ["minimal", "pytorch"]``""",
    )
    starting_point_torch = Enum(
        list(stacks.TORCH_CHOICES),
        "auto",
        config=True,
        help="""Which PyTorch the PyTorch and Hugging Face starting points install where
        the base image has none: ``cpu`` from ``cpu_torch_index`` (a few hundred MB),
        ``cuda`` PyPI's own (the CUDA build, several GB), ``auto`` the CPU one on a host
        without a GPU and the CUDA one on a GPU host. A base image's own PyTorch (the GPU
        base's CUDA build, or ``GPULAB_TORCH``) is always kept. Set by
        ``GPULAB_STARTING_POINT_TORCH``. Default: "auto".
        Example: ``c.ProjectSpawner.starting_point_torch = "cuda"``""",
    )
    cpu_torch_index = Unicode(
        stacks.CPU_TORCH_INDEX,
        config=True,
        help=f"""The package index (pip's ``--index-url``) a starting point's CPU PyTorch
        comes from (``starting_point_torch``): an http(s) URL without spaces or quotes.
        Set by ``GPULAB_CPU_TORCH_INDEX``. Default: {stacks.CPU_TORCH_INDEX}.
        Example: ``c.ProjectSpawner.cpu_torch_index = "https://mirror.example.org/cpu"``""",
    )

    @validate("prebuild_stacks")
    def _check_prebuild_stacks(self, proposal):
        try:
            return [stacks.get(name).name for name in proposal["value"]]
        except stacks.UnknownStack as e:
            raise TraitError(f"ProjectSpawner.prebuild_stacks: {e}") from e

    @validate("cpu_torch_index")
    def _check_cpu_torch_index(self, proposal):
        if not stacks.INDEX_URL.fullmatch(proposal["value"]):
            raise TraitError(
                "ProjectSpawner.cpu_torch_index must be an http or https URL (letters, digits"
                f" and -._~/:%+@ only); it is {proposal['value'][:80]!r}"
            )
        return proposal["value"]

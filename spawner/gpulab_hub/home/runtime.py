"""/hub/gpulab/runtime/<owner>/<project>: "Change runtime type", as in Colab.

The page shows the hardware a project runs on (CPU only, or N GPU(s), of a model,
or one MIG slice) and offers what this computer has (the spawn form's own fields
and checks, projects/options.py). On submit:

- a running project is stopped and started again with the new choice, through
  JupyterHub's own spawn (the GPU queue applies: with no GPU free, the start waits
  in the queue and its progress page says so); its files and its image stay (the
  image is built again only where its Dockerfile changed);
- a stopped project keeps the choice for its next start (the start page, the home
  page's Start button and the REST API all start from it).

The choice is kept where JupyterHub keeps the options of a project's last start (its
database's ``user_options``), so there is one record of it. The project's owner may
change it, and collaborators where the owner lets them start the project; viewers,
other users and admins without a share get 404, as for a project that does not exist.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.projects import options
from gpulab_hub.sharing import roles
from gpulab_hub.sharing.policy import ProjectSharing
from gpulab_hub.sharing.received import policies_now, policy_store

PAGE = "/gpulab/runtime"
NO_GPU = "this computer has no GPU"
STOP_WAIT_S = 180.0  # the most a restart waits for the old server to stop


def page_url(hub_base_url: str, owner: str, project: str) -> str:
    """The page's path for ``owner``'s ``project``, from the hub's base URL ("/hub/")."""
    return f"{hub_base_url.rstrip('/')}{PAGE}/{quote(owner, safe='')}/{quote(project, safe='')}"


def words(chosen: dict, default_gpus: int = 0) -> str:
    """The hardware of validated runtime options, as the page says it."""
    if chosen.get("mig_profile"):
        return f"one MIG slice {chosen['mig_profile']}"
    count = chosen.get("gpus", default_gpus)
    if not count:
        return "CPU only"
    model = f" of type {chosen['gpu_type']}" if chosen.get("gpu_type") else ""
    return f"{count} GPU{'s' if count > 1 else ''}{model}"


def parse(formdata: dict[str, list[str]]) -> dict:
    """The page's form -> runtime options (the spawn form's parsing and checks);
    OptionsError in the user's words."""
    if "gpus" not in formdata:
        raise options.OptionsError("Choose the hardware: the form names no number of GPUs.")
    return options.from_form({k: v for k, v in formdata.items() if k in options.RUNTIME})


def check(chosen: dict, choices: options.GpuChoices | None) -> None:
    """Refuse, in the user's words, a choice this computer does not offer."""
    wants_gpu = bool(chosen.get("gpus") or chosen.get("mig_profile"))
    if not wants_gpu:
        return
    if choices is None:
        raise options.OptionsError(
            f"You chose {words(chosen)}, but {NO_GPU}: projects here run on its CPU only."
        )
    if chosen.get("gpus", 0) > choices.max_count:
        raise options.OptionsError(
            f"You chose {words(chosen)}, but a project here may have at most "
            f"{choices.max_count} GPU{'s' if choices.max_count != 1 else ''}."
        )
    model = chosen.get("gpu_type", "")
    if model and model not in choices.types:
        offered = ", ".join(choices.types) or "none (any free GPU is given)"
        raise options.OptionsError(f"GPU model {model!r} is not offered here; offered: {offered}.")
    mig = chosen.get("mig_profile", "")
    if mig and mig not in choices.mig_profiles:
        offered = ", ".join(choices.mig_profiles) or "none"
        raise options.OptionsError(f"MIG slice {mig!r} is not offered here; offered: {offered}.")


def with_runtime(kept: dict | None, chosen: dict) -> dict:
    """The project's start options ``kept`` with its hardware replaced by ``chosen``
    (its starting point and image choice stay)."""
    out = {k: v for k, v in (kept or {}).items() if k not in options.RUNTIME}
    out.update(chosen)
    return out


class RuntimeHandler(BaseHandler):
    """GET: the project's hardware and the choices; POST (XSRF checked by JupyterHub's
    BaseHandler): change it (module doc)."""

    def _target(self, owner: str, project: str):
        """(hub user, spawner, mine) of the request, or 404."""
        me = self.current_user
        if owner == me.name:
            if project not in me.orm_user.orm_spawners:
                raise web.HTTPError(404, f"You have no project named {project!r}.")
            return me, me.spawners[project], True
        found = self.find_user(owner)
        orm_spawner = found.orm_user.orm_spawners.get(project) if found is not None else None
        if (
            orm_spawner is None
            or roles.role_on(self.db, me.orm_user, orm_spawner) != "collaborator"
        ):
            raise web.HTTPError(404, f"No project {owner}/{project} is shared with you.")
        return found, found.spawners[project], False

    async def _may_change(self, owner: str, project: str, mine: bool) -> bool:
        if mine:
            return True
        store = policy_store(hubsettings.of_handler(self).db_url)
        policy = (await policies_now(store)).get(f"{owner}/{project}", ProjectSharing())
        return policy.collaborators_may_start

    async def _choices(self, spawner) -> tuple[options.GpuChoices | None, int]:
        """What this computer offers the project, and its GPUs where none was chosen."""
        # NVML off the event loop
        inventory = await blocking.run(blocking.RECORDS, gpu_spawner.cached_inventory)
        gpu_choices = getattr(spawner, "gpu_choices", None)
        choices = gpu_choices() if gpu_choices is not None else None  # reads the cache
        default = getattr(spawner, "default_gpus", 0) if inventory.devices else 0
        return choices, default

    async def _page(self, owner, project, status=200, message="", error=""):
        user, spawner, mine = self._target(owner, project)
        choices, default = await self._choices(spawner)
        current = options.remembered(spawner)
        fields = options.form(None, False, choices) if choices is not None else ""
        html = await self.render_template(
            "gpulab-runtime.html",
            owner=owner,
            project=project,
            display_name=spawner.display_name or project,
            mine=mine,
            may_change=await self._may_change(owner, project, mine),
            current=words(current, default),
            running=bool(spawner.ready),
            pending=spawner.pending or "",
            fields=fields,
            no_gpu=NO_GPU if choices is None else "",
            action=page_url(self.hub.base_url, owner, project),
            home_url=self.hub.base_url + "home",
            message=message,
            error=error,
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self, owner: str, project: str):
        await self._page(owner, project)

    async def _stopped(self, user, project: str) -> None:
        spawner = user.spawners[project]
        await self.stop_single_user(user, project)  # returns early on a slow stop
        deadline = time.monotonic() + STOP_WAIT_S
        while spawner.active:
            if time.monotonic() > deadline:
                raise web.HTTPError(
                    503, f"{project} did not stop within {int(STOP_WAIT_S)} s; try again."
                )
            await asyncio.sleep(0.5)

    def _form(self) -> dict[str, list[str]]:
        """The posted fields, whole values as sent (no stripping)."""
        return {
            k: [v.decode("utf-8", "replace") for v in values]
            for k, values in self.request.body_arguments.items()
            if k in options.RUNTIME
        }

    @web.authenticated
    async def post(self, owner: str, project: str):
        user, spawner, mine = self._target(owner, project)
        if not await self._may_change(owner, project, mine):
            await self._page(
                owner,
                project,
                403,
                error=f"{owner} has not allowed collaborators to start {project}, so only "
                f"{owner} may change its runtime; ask {owner}.",
            )
            return
        choices, default = await self._choices(spawner)
        try:
            chosen = parse(self._form())
            check(chosen, choices)
        except options.OptionsError as e:
            await self._page(owner, project, 400, error=str(e))
            return
        if spawner.pending:
            doing = "starting" if spawner.pending == "spawn" else "stopping"
            await self._page(
                owner,
                project,
                409,
                error=f"{project} is {doing}: wait until it has, then change its runtime.",
            )
            return
        new = with_runtime(spawner.orm_spawner.user_options, chosen)
        said = words(chosen, default)
        if not spawner.ready:
            spawner.orm_spawner.user_options = new  # the next start's options
            self.db.commit()
            spawner.user_options = new
            self.log.info(
                "gpulab: %s set %s/%s to %s", self.current_user.name, owner, project, said
            )
            await self._page(
                owner, project, message=f"Saved: {project} starts on {said} from now on."
            )
            return
        self.log.info(
            "gpulab: %s restarts %s/%s on %s", self.current_user.name, owner, project, said
        )
        try:
            await self._stopped(user, project)
            # JupyterHub's own spawn (as the start page's): it keeps ``new`` as the
            # project's options, and a GPU start waits in the queue where none is free.
            await self.spawn_single_user(user, project, options=new)
        except web.HTTPError as e:
            await self._page(owner, project, e.status_code, error=e.log_message or str(e))
            return
        self.redirect(
            f"{self.hub.base_url}spawn-pending/{quote(owner, safe='')}/{quote(project, safe='')}"
        )


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers`` of the page (hubconfig.py adds them)."""
    return [(PAGE + r"/([^/]+)/([^/]+)", "gpulab_hub.home.runtime.RuntimeHandler")]

"""Public notebook links: one notebook, read-only, for people without an account.

Off unless the admin sets ``GPULAB_PUBLIC_LINKS=1``. The owner makes and revokes
links at /hub/gpulab/public-links/<project>; each link names ONE notebook of that
project, fixed when it is made, and expires (at most GPULAB_SHARE_MAX_HOURS).
Anyone with the link sees /hub/gpulab/p/<code>: the notebook rendered by
nbconvert with its outputs sanitized, no kernel, served with a Content-Security-
Policy that lets no script run (the page comes from the hub's origin, where users
have their login cookies). The path is opened again on each view through
safefs.py (sharing/notebooks.py: no link followed, a regular file only, bounded), so
nothing else in the project, or outside it, is reachable. What a view may cost is
bounded (publicrender.py: rendered once per notebook version, in a process with a
time limit, off the pools signed-in users need, a size limit; publiclimits.py:
views per minute per client address). Codes are
``secrets.token_urlsafe(32)``; only their SHA-256 is kept, in
``<hub dir>/public-links.json`` (file-locked, written atomically), read and written on
the records pool (the owner's page) or the public views' pool (a view), never on the
hub's event loop (blocking.py); a record held too long elsewhere shows as 503 with words.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab_hub import blocking, hubsettings, jsonfile, stateversion
from gpulab_hub.projects import safefs
from gpulab_hub.sharing.notebooks import FileRefused, check_path, open_project_dir, read_notebook
from gpulab_hub.sharing.publiclimits import RateLimiter, client_address, trusted_networks
from gpulab_hub.sharing.publicrender import RenderBusy, TooLarge, renders_of

LINKS_FILE = hubsettings.PUBLIC_LINKS  # in the hub's records folder
MAX_LINKS_PER_PROJECT = 50
MAX_LISTED = 500  # notebooks offered when making a link
MAX_SCANNED = 20_000  # files and folders looked at to find them
_CODE = re.compile(r"[A-Za-z0-9_-]{32,64}")
_ID = re.compile(r"pl_[0-9a-f]{12}")
# Nothing runs: no scripts, no plugins, no fetches; inline styles and data: images only.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'; sandbox allow-popups "
    "allow-popups-to-escape-sandbox allow-top-navigation-by-user-activation"
)
GONE = "This link does not exist: it was revoked, it expired, or it never was."


@dataclass(frozen=True)
class PublicLink:
    id: str
    hash: str
    owner: str
    project: str
    path: str
    created_at: float
    expires_at: float

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at

    def expires_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.expires_at))

    def expires_iso(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires_at))


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


class PublicLinkStore(jsonfile.LockedRecord):
    """``{"links": [...]}`` in one JSON file of the hub's records (jsonfile.LockedRecord:
    file lock, atomic and durable writes, a damaged file moved aside with one message)."""

    kind = stateversion.KINDS["public-links"]
    section = "links"
    what = "The public links file"
    on_damage = "every public notebook link stopped working; owners make new ones"

    def _parse(self, section) -> list[PublicLink]:
        if not isinstance(section, list):
            raise TypeError('"links" is not a list')
        return [PublicLink(**raw) for raw in section]  # TypeError on a malformed link

    def _missing(self) -> list[PublicLink]:
        return []

    def _recover(self) -> list[PublicLink]:
        return []

    def _dump(self, links: list[PublicLink]) -> list[dict]:
        return [asdict(x) for x in links]

    def create(self, owner: str, project: str, path: str, seconds: float) -> tuple[str, PublicLink]:
        """A new link; its code (shown once, never stored) and its record."""
        code = secrets.token_urlsafe(32)
        now = time.time()
        link = PublicLink(
            id="pl_" + secrets.token_hex(6),
            hash=_digest(code),
            owner=owner,
            project=project,
            path=path,
            created_at=now,
            expires_at=now + seconds,
        )
        with self.locked():
            links = [x for x in self._read() if not x.expired]
            mine = [x for x in links if (x.owner, x.project) == (owner, project)]
            if len(mine) >= MAX_LINKS_PER_PROJECT:
                raise FileRefused(400, f"A project has at most {MAX_LINKS_PER_PROJECT} links.")
            self._write([*links, link])
        return code, link

    def list(self, owner: str, project: str) -> list[PublicLink]:
        with self.locked():
            links = self._read()
        return [x for x in links if (x.owner, x.project) == (owner, project) and not x.expired]

    def revoke(self, owner: str, project: str, link_id: str) -> bool:
        with self.locked():
            links = self._read()
            kept = [
                x
                for x in links
                if not x.expired
                and not (x.id == link_id and (x.owner, x.project) == (owner, project))
            ]
            gone = len([x for x in links if not x.expired]) - len(kept)
            if kept != links:
                self._write(kept)
        return gone > 0

    def forget(self, owner: str, project: str) -> None:
        """Drop every link of a deleted project."""
        with self.locked():
            links = self._read()
            kept = [x for x in links if (x.owner, x.project) != (owner, project)]
            if kept != links:
                self._write(kept)

    def forget_owner(self, owner: str) -> None:
        """Drop every link of a deleted user's projects."""
        with self.locked():
            links = self._read()
            kept = [x for x in links if x.owner != owner]
            if kept != links:
                self._write(kept)

    def find(self, code: str) -> PublicLink | None:
        """The unexpired link of ``code``, or None."""
        if not _CODE.fullmatch(code or ""):
            return None
        digest = _digest(code)
        with self.locked():
            links = self._read()
        for link in links:
            if secrets.compare_digest(link.hash, digest) and not link.expired:
                return link
        return None


def store(hub_dir: str | Path) -> PublicLinkStore:
    return PublicLinkStore(Path(hub_dir) / LINKS_FILE)


def find_link(hub_dir: str | Path, code: str) -> PublicLink | None:
    return store(hub_dir).find(code)


def notebooks_in(projects_root: str | Path, owner: str, project: str) -> list[str]:
    """The notebooks of a project (relative paths), not in hidden folders, no links.

    Walked through safefs.py (by descriptor, never into a link); bounded by
    MAX_SCANNED entries and MAX_LISTED notebooks. A best-effort list for the
    owner's page: what it cannot walk is left out.
    """
    try:
        fd = open_project_dir(projects_root, owner, project)
    except FileRefused:
        return []
    found: list[str] = []
    budget = safefs.Budget(MAX_SCANNED, "The project")
    try:
        for path, what, _, name in safefs.walk(fd, "", budget, skip=_hidden):
            if what != "file" or not name.endswith(".ipynb"):
                continue
            try:
                check_path(path)
            except FileRefused:
                continue
            found.append(path)
            if len(found) >= MAX_LISTED:
                break
    except safefs.Refused:
        return found  # too many entries, too deep, or a folder swapped for a link
    finally:
        os.close(fd)
    return found


def _hidden(name: str) -> bool:
    return name.startswith(".")


@functools.cache
def highlight_css() -> str:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style="default").get_style_defs(".highlight")


class _Base(BaseHandler):
    def initialize(self, public_links: bool, max_hours: int):
        where = hubsettings.of_handler(self)  # the hub's own configuration
        self.projects_root = where.projects_root
        self.links = store(where.records_dir)
        self.enabled = public_links
        self.max_hours = max_hours

    async def _run(self, fn, *args):
        """``fn(*args)`` on the records pool (blocking.py): never on the event loop."""
        return await blocking.run(blocking.RECORDS, fn, *args)


class PublicLinksHandler(_Base):
    """The owner's page: the public links of one project; make and revoke them."""

    def _check(self, project: str) -> None:
        if not self.enabled:
            raise web.HTTPError(
                404, "Public links are turned off on this hub (an admin can turn them on)."
            )
        if project not in self.current_user.orm_spawners:
            raise web.HTTPError(404, f"You have no project named {project!r}.")

    async def _page(self, project: str, status=200, message="", error="", new_url=""):
        owner = self.current_user.name
        html = await self.render_template(
            "gpulab-public-links.html",
            project=project,
            links=await self._run(self.links.list, owner, project),
            notebooks=await self._run(notebooks_in, self.projects_root, owner, project),
            message=message,
            error=error,
            new_url=new_url,
            max_hours=self.max_hours,
            default_hours=min(24, self.max_hours),
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self, project: str):
        self._check(project)
        await self._page(project)

    async def _create(self, project: str) -> tuple[str, str]:
        owner = self.current_user.name
        path = self.get_body_argument("path", "").strip()
        try:
            hours = int(self.get_body_argument("hours", "24"))
        except ValueError as e:
            raise FileRefused(400, "Hours must be a whole number.") from e
        if not 1 <= hours <= self.max_hours:
            raise FileRefused(400, f"A link lasts from 1 to {self.max_hours} hours.")
        # The notebook must be there, a notebook, and reached without links.
        await self._run(read_notebook, self.projects_root, owner, project, path)
        code, link = await self._run(self.links.create, owner, project, path, hours * 3600)
        request = self.request
        url = f"{request.protocol}://{request.host}{self.hub.base_url}gpulab/p/{code}"
        self.log.info("gpulab: %s made public link %s for %s:%s", owner, link.id, project, path)
        return f"Public link made for {path}; it works for {hours} h.", url

    @web.authenticated
    async def post(self, project: str):
        self._check(project)
        action = self.get_body_argument("action", "")
        try:
            if action == "create":
                message, url = await self._create(project)
                await self._page(project, message=message, new_url=url)
                return
            if action == "revoke":
                link_id = self.get_body_argument("id", "")
                if not _ID.fullmatch(link_id) or not await self._run(
                    self.links.revoke, self.current_user.name, project, link_id
                ):
                    raise FileRefused(404, "No such link.")
                await self._page(project, message="Public link revoked.")
                return
            raise FileRefused(400, f"Unknown action {action!r}.")
        except FileRefused as e:
            await self._page(project, status=e.status, error=str(e))


def _mib(n: int, up: bool = False) -> str:
    """Bytes as MiB to a tenth (rounded up for a notebook's size: never shown as the limit)."""
    tenths = math.ceil(n * 10 / 2**20) if up else round(n * 10 / 2**20)
    return f"{tenths / 10:.1f}".removesuffix(".0")


# What the page says instead of the notebook: (HTTP status, words).
FAILED = {
    "slow": (
        422,
        "This notebook takes too long to show here (over {timeout} s) \u2014 ask the owner "
        "to share the project instead.",
    ),
    "invalid": (404, "The notebook of this link cannot be shown: it is not a valid notebook."),
    "failed": (
        422,
        "This notebook cannot be shown here (it needs more than the hub gives one "
        "page) \u2014 ask the owner to share the project instead.",
    ),
}
TOO_LARGE = (
    "This notebook is too large to show here ({size} MiB; the limit is {limit} MiB) "
    "\u2014 ask the owner to share the project instead."
)
TOO_MANY = "Too many views from your address: at most {n} a minute. Try again in {wait} s."
BUSY = "The hub is busy showing other notebooks. Try again in a minute."


def limiter_of(handler, per_minute: int) -> RateLimiter:
    """The hub's one rate limiter of public views (made at the first view)."""
    settings = handler.settings
    if "gpulab_public_limiter" not in settings:
        hub_config = settings["config"].get("JupyterHub", {})
        settings["gpulab_public_limiter"] = (
            RateLimiter(per_minute),
            trusted_networks(hub_config.get("trusted_downstream_ips", [])),
        )
    return settings["gpulab_public_limiter"]


class PublicNotebookHandler(_Base):
    """/hub/gpulab/p/<code>: the notebook of a public link, for anyone (no login)."""

    def _plain(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(message + "\n")

    @property
    def content_security_policy(self):
        return CSP

    def get_content_type(self):
        return "text/html; charset=utf-8"  # JupyterHub's says no charset

    def set_default_headers(self):
        super().set_default_headers()
        # The hub's configured CSP (tornado_settings['headers']) would replace this one.
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("Cache-Control", "no-store")

    def write_error(self, status_code, **kwargs):
        self._plain(status_code, "This page cannot be shown.")

    def _too_many(self, status: int, message: str, retry_after: int) -> None:
        self.set_header("Retry-After", str(retry_after))
        self._plain(status, message)

    async def get(self, code: str):
        if not self.enabled:
            self._plain(404, "Public links are turned off on this hub.")
            return
        renders = renders_of(self)
        limits = renders.limits
        limiter, trusted = limiter_of(self, limits.views_per_minute)
        client = client_address(self.request, trusted)
        wait = limiter.take(client)
        if wait:
            n = limits.views_per_minute
            self.log.warning("gpulab: public link views from %s over %d a minute", client, n)
            self._too_many(429, TOO_MANY.format(n=n, wait=wait), wait)
            return
        try:
            link = await renders.in_thread(self.links.find, code)
        except blocking.Busy:
            self._too_many(503, BUSY, 30)
            return
        if link is None:
            self._plain(404, GONE)
            return
        status, message, body = 200, "", ""
        try:
            _, rendered, how = await renders.page(self.projects_root, link)
        except FileRefused:
            self._plain(404, "The notebook of this link is not there any more.")
            return
        except TooLarge as e:
            status = 413
            message = TOO_LARGE.format(size=_mib(e.size, up=True), limit=_mib(limits.max_bytes))
        except RenderBusy:
            self._too_many(503, BUSY, 30)
            return
        else:
            self.set_header("X-Gpulab-Cache", how)
            if rendered.failure:
                status, message = FAILED[rendered.failure]
                message = message.format(timeout=f"{limits.render_timeout_s:g}")
            body = rendered.html
        copy_page = f"{self.hub.base_url}gpulab/copy?" + urlencode({"public": code})
        html = await self.render_template(
            "gpulab-public.html",
            link=link,
            notebook=body,
            message=message,
            css=highlight_css() if body else "",
            save_url=f"{self.hub.base_url}login?next={quote(copy_page, safe='')}",
        )
        self.set_status(status)
        self.finish(html)

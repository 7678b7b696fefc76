"""Every route of a project server, asked as each role (issue 13, tests).

The route list is read from the project's own image: the owner's kernel builds a
Jupyter server with the same extensions as the running one (JupyterLab, jupyter-
collaboration, terminals, language servers, gpulab's) and lists its tornado rules,
with the methods each handler defines. Every rule must be in :data:`EXPECTED` (by
handler class): a route added by a new extension and not listed here FAILS, so
someone decides what it needs. Then each route's GET is asked as anonymous,
another user, an admin without a share, a viewer, a collaborator and the owner,
and each method that changes something (POST, PUT, PATCH, DELETE) as the four
that may not change anything (never as a collaborator or the owner: it could stop
the server).

In the same project, a training job writes TensorBoard event files and the
TensorBoard tile's address (jupyter-server-proxy) shows its scalars to the owner
and a collaborator, never to a viewer (issue 16).
"""

from __future__ import annotations

import json
import re

import pytest
import requests
from people import (
    NB,
    execute,
    log_in_admin,
    make_user,
    share_by_link,
    start_with_notebook,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT = "rmowner", "matrix"
VIEWER, COLLAB, OTHER = "rmviewer", "rmcollab", "rmother"
SERVER = f"/user/{OWNER}/{PROJECT}"
ROLES = ("anonymous", "other", "admin", "viewer", "collaborator", "owner")

DUMP = r"""
import json
from jupyter_server.serverapp import ServerApp
from jupyter_server.base.handlers import JupyterHandler
from tornado.web import RequestHandler
app = ServerApp()
app.initialize(argv=["--ServerApp.port=0", "--ServerApp.open_browser=False"],
               new_httpserver=False)
rules, pending = [], [app.web_app.default_router]
while pending:
    for rule in getattr(pending.pop(), "rules", ()):
        (rules if isinstance(rule.target, type) else pending).append(
            rule if isinstance(rule.target, type) else rule.target)
rows = []
for rule in rules:
    cls = rule.target
    methods = [m for m in ("get", "head", "post", "put", "patch", "delete")
               if getattr(cls, m, None) is not getattr(RequestHandler, m)]
    rows.append({"pattern": getattr(rule.matcher, "regex").pattern,
                 "handler": cls.__module__ + "." + cls.__qualname__, "methods": methods,
                 "jupyter": issubclass(cls, JupyterHandler)})
print("ROUTES " + json.dumps(rows))
"""

# What each handler's GET needs: "public" (no login: static files, login, logout,
# redirects), "read" (viewer and up), "execute" (collaborator and up: websockets of
# kernels, terminals, events). Keyed by handler class name.
EXPECTED = {
    # jupyter_server
    "jupyter_server.base.handlers.RedirectWithParams": "public",
    "jupyter_server.base.handlers.TrailingSlashHandler": "public",
    "jupyter_server.base.handlers.MainHandler": "public",  # a redirect to /lab
    "jupyter_server.base.handlers.APIVersionHandler": "public",
    "jupyter_server.base.handlers.Template404": "read",
    "jupyter_server.base.handlers.FileFindHandler": "public",
    "jupyter_server.base.handlers.PublicStaticFileHandler": "public",
    "jupyter_server.base.handlers.AuthenticatedFileHandler": "read",
    "jupyter_server.base.handlers.FilesRedirectHandler": "read",
    "jupyter_server.base.handlers.PrometheusMetricsHandler": "read",
    "jupyter_server.files.handlers.FilesHandler": "read",
    "jupyter_server.view.handlers.ViewHandler": "read",
    "jupyter_server.auth.login.LoginFormHandler": "public",
    "jupyter_server.auth.login.LoginHandler": "public",
    "jupyter_server.auth.logout.LogoutHandler": "public",
    "jupyter_server.nbconvert.handlers.NbconvertFileHandler": "read",
    "jupyter_server.nbconvert.handlers.NbconvertPostHandler": "read",
    "jupyter_server.services.api.handlers.APISpecHandler": "read",
    "jupyter_server.services.api.handlers.APIStatusHandler": "read",
    "jupyter_server.services.api.handlers.IdentityHandler": "read",
    "jupyter_server.services.config.handlers.ConfigHandler": "read",
    "jupyter_server.services.contents.handlers.ContentsHandler": "read",
    "jupyter_server.services.contents.handlers.CheckpointsHandler": "read",
    "jupyter_server.services.contents.handlers.ModifyCheckpointsHandler": "read",
    "jupyter_server.services.contents.handlers.NotebooksRedirectHandler": "public",
    "jupyter_server.services.contents.handlers.TrustNotebooksHandler": "read",
    "jupyter_server.services.events.handlers.EventHandler": "read",
    "jupyter_server.services.events.handlers.SubscribeWebsocket": "execute",
    "jupyter_server.services.kernels.handlers.MainKernelHandler": "read",
    "jupyter_server.services.kernels.handlers.KernelHandler": "read",
    "jupyter_server.services.kernels.handlers.KernelActionHandler": "read",
    "jupyter_server.services.kernels.websocket.KernelWebsocketHandler": "execute",
    "jupyter_server.services.kernelspecs.handlers.MainKernelSpecHandler": "read",
    "jupyter_server.services.kernelspecs.handlers.KernelSpecHandler": "read",
    "jupyter_server.kernelspecs.handlers.KernelSpecResourceHandler": "read",
    "jupyter_server.services.nbconvert.handlers.NbconvertRootHandler": "read",
    "jupyter_server.services.security.handlers.CSPReportHandler": "read",
    "jupyter_server.services.sessions.handlers.SessionRootHandler": "read",
    "jupyter_server.services.sessions.handlers.SessionHandler": "read",
    "jupyter_server.services.shutdown.ShutdownHandler": "read",
    "jupyter_server.i18n.handlers.TranslationsHandler": "read",
    # terminals
    "jupyter_server_terminals.api_handlers.TerminalRootHandler": "read",
    "jupyter_server_terminals.api_handlers.TerminalHandler": "read",
    "jupyter_server_terminals.handlers.TermSocket": "execute",
    # JupyterLab
    "jupyterlab_server.handlers.LabHandler": "read",
    "jupyterlab_server.listings_handler.ListingsHandler": "read",
    "jupyterlab_server.settings_handler.SettingsHandler": "read",
    "jupyterlab_server.themes_handler.ThemesHandler": "public",  # theme CSS files
    "jupyterlab_server.translations_handler.TranslationsHandler": "read",
    "jupyterlab_server.workspaces_handler.WorkspacesHandler": "read",
    "jupyterlab_server.licenses_handler.LicensesHandler": "read",
    "jupyterlab.handlers.build_handler.BuildHandler": "read",
    "jupyterlab.handlers.extension_manager_handler.ExtensionHandler": "read",
    "jupyterlab.handlers.plugin_manager_handler.PluginHandler": "read",
    "jupyterlab.handlers.announcements.CheckForUpdateHandler": "read",
    "jupyterlab.handlers.announcements.NewsHandler": "read",
    "jupyterlab.labapp.LabHandler": "read",
    # language servers
    "jupyter_lsp.handlers.LanguageServersHandler": "read",
    "jupyter_lsp.handlers.LanguageServerWebSocketHandler": "execute",
    # collaboration
    "jupyter_server_ydoc.handlers.DocSessionHandler": "read",
    "jupyter_server_ydoc.handlers.YDocWebSocketHandler": "read",
    "gpulab_jupyter.collab.ReadOnlyRoomHandler": "read",
    "jupyter_server_ydoc.handlers.TimelineHandler": "read",
    "jupyter_server_ydoc.handlers.UndoRedoHandler": "read",
    "jupyter_server_fileid.handler.FileIDHandler": "read",
    "jupyter_server_fileid.handler.FilePathHandler": "read",
    "jupyter_server_ydoc.handlers.DocForkHandler": "read",
    "jupyter_server.services.api.handlers.PathResolverHandler": "read",
    "jupyterlab_server.handlers.NotFoundHandler": "read",
    # gpulab
    "gpulab_jupyter.handlers.InfoHandler": "read",
    "gpulab_jupyter.handlers.GPUStatusHandler": "read",
    "gpulab_jupyter.handlers.GPUHistoryHandler": "read",
    "gpulab_jupyter.handlers.GPUProcessesHandler": "read",
    # gpulab's jobs: reading is "read"; starting, stopping and re-running (POST) are
    # refused to all but collaborators and the owner (the POST test below)
    "gpulab_jupyter.jobs.handlers.JobsHandler": "read",
    "gpulab_jupyter.jobs.handlers.JobHandler": "read",
    "gpulab_jupyter.jobs.handlers.JobActionHandler": "read",
    # cells run on the server's side (jupyter-server-nbmodel): the list of a kernel's
    # runs and a run's state are reads (a viewer sees the outputs in the notebook too);
    # running a cell (POST execute), answering its input() and cancelling a run (POST,
    # DELETE) and the output-recovery switch (PUT) are refused to all but collaborators
    # and the owner (the POST test below); what runs now, and since when (gpulab)
    "jupyter_server_nbmodel.handlers.ExecuteHandler": "read",
    "jupyter_server_nbmodel.handlers.InputHandler": "read",
    "jupyter_server_nbmodel.handlers.RequestHandler": "read",
    "jupyter_server_nbmodel.handlers.OutputRecoverySettingHandler": "read",
    "gpulab_jupyter.cells.CellsHandler": "read",
    # when the idle culler would stop the project; "keep it" (POST) is a change
    "gpulab_jupyter.idle.ActivityHandler": "read",
    "gpulab_jupyter.idle.KeepHandler": "read",
    # jupyter-server-proxy: TensorBoard (started at its first visit), any port of the
    # container, the launcher's list of proxied servers: running code, even to GET
    "jupyter_server_proxy.config.ServerProcess.make_proxy_handler.<locals>._Proxy": "execute",
    "jupyter_server_proxy.handlers.AddSlashHandler": "execute",
    "jupyter_server_proxy.handlers.LocalProxyHandler": "execute",
    "jupyter_server_proxy.handlers.RemoteProxyHandler": "execute",
    "jupyter_server_proxy.api.ServersInfoHandler": "execute",
    "jupyter_server_proxy.api.IconHandler": "execute",
}
# Routes whose sample path is given: the proxy to <host>:<port> refuses every host but
# the container's own (host_allowlist), the owner included, so the sample names it.
SAMPLE_FOR = {
    r"/proxy/([^/:@]+):(\d+)(/.*|)$": "/proxy/localhost:1/x",
    r"/proxy/absolute/([^/:@]+):(\d+)(/.*|)$": "/proxy/absolute/localhost:1/x",
}
SAMPLES = [
    "x", f"/{NB}", "00000000-0000-0000-0000-000000000000", NB, "json:notebook:x", "1", "x/y",
    "20261123-141502-a1b2", "stop",
]  # fmt: skip
REFUSED = (401, 403)


def _fits(inner: str, sample: str) -> bool:
    try:
        return re.fullmatch(re.sub(r"^\?P<\w+>", "", inner), sample) is not None
    except re.error:
        return False


def sample_path(pattern: str) -> str | None:
    """A path the route's regex matches: each group replaced by one sample value (the
    same for every group, else for each group the first sample that fits it)."""
    if pattern in SAMPLE_FOR:
        return SAMPLE_FOR[pattern]
    body = pattern.removesuffix("$")
    for sample in [*SAMPLES, None]:
        out, depth, start = "", 0, 0
        for i, ch in enumerate(body):
            if ch == "(" and (i == 0 or body[i - 1] != "\\"):
                if depth == 0:
                    out += body[start:i]
                    group = i + 1
                depth += 1
            elif ch == ")" and (i == 0 or body[i - 1] != "\\") and depth:
                depth -= 1
                if depth == 0:
                    optional = body[i + 1 : i + 2] in ("?", "*")
                    if sample is None:  # each group its own fitting sample
                        inner = body[group : i]
                        fit = next((x for x in SAMPLES if _fits(inner, x)), SAMPLES[0])
                    out += "" if optional else (fit if sample is None else sample)
                    start = i + 2 if optional else i + 1
        out += body[start:]
        path = out.replace("\\", "").replace("?", "")
        if re.fullmatch(pattern, path):
            return path
    return None


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    made = {n: make_user(hub, admin, n) for n in (OWNER, VIEWER, COLLAB, OTHER)}
    return {"admin": admin, **made}


@pytest.fixture(scope="module")
def routes(people):
    owner = people[OWNER]
    start_with_notebook(owner, PROJECT)
    share_by_link(owner, PROJECT, people[VIEWER], "viewer")
    share_by_link(owner, PROJECT, people[COLLAB], "collaborator")
    out = execute(owner.base, SERVER, owner.token, DUMP, timeout=180)
    line = next(x for x in out.splitlines() if x.startswith("ROUTES "))
    yield json.loads(line.removeprefix("ROUTES "))
    owner.stop_project(PROJECT)


def token_of(people, role: str) -> str:
    name = {"other": OTHER, "viewer": VIEWER, "collaborator": COLLAB, "owner": OWNER}
    return "" if role == "anonymous" else people[name.get(role, role)].token


def ask(base: str, method: str, path: str, token: str, timeout: float = 15) -> int:
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        r = requests.request(
            method, base + SERVER + path, headers=headers, allow_redirects=False, timeout=timeout
        )
    except requests.Timeout:
        if timeout < 120:  # the server may be busy with the route before (licenses)
            return ask(base, method, path, token, timeout=120)
        return 599  # the handler ran and waits (news and update checks go out to the web)
    return r.status_code


def test_every_route_is_in_the_expectation_table(routes):
    unknown = sorted({r["handler"] for r in routes} - set(EXPECTED))
    assert not unknown, f"routes nobody decided on (add them to EXPECTED): {unknown}"


def test_every_route_as_every_role(people, routes):
    base = people[OWNER].base
    wrong, table = [], []
    for route in routes:
        need = EXPECTED.get(route["handler"])
        path = sample_path(route["pattern"].removeprefix(SERVER))
        if need is None or path is None or "get" not in route["methods"]:
            continue
        if path.startswith(SERVER):
            path = path[len(SERVER) :]
        got = {role: ask(base, "GET", path, token_of(people, role)) for role in ROLES}
        table.append(f"{route['handler'].rsplit('.', 1)[1]:32} GET {path:45} {got}")
        if need == "public":
            continue
        # Outsiders: refused (anonymous is sent to log in, or refused).
        for role in ("other", "admin"):  # 405: no GET on that route, nothing answered
            if got[role] not in (*REFUSED, 405):
                wrong.append((path, role, got[role]))
        if got["anonymous"] not in (*REFUSED, 302, 405):
            wrong.append((path, "anonymous", got["anonymous"]))
        allowed = (
            ("viewer", "collaborator", "owner") if need == "read" else ("collaborator", "owner")
        )
        for role in ROLES[3:]:
            refused = got[role] in REFUSED
            if refused == (role in allowed):
                wrong.append((path, role, got[role]))
    print("\n" + "\n".join(table))
    assert not wrong, f"(path, role, status) not as expected: {wrong}"


def test_no_change_by_anyone_but_collaborators_and_owner(people, routes):
    base = people[OWNER].base
    wrong = []
    for route in routes:
        if EXPECTED.get(route["handler"]) == "public":
            continue
        path = sample_path(route["pattern"].removeprefix(SERVER))
        if path is None:
            continue
        for method in ("post", "put", "patch", "delete"):
            if method not in route["methods"]:
                continue
            for role in ("anonymous", "other", "admin", "viewer"):
                got = ask(base, method.upper(), path, token_of(people, role))
                # 405: the route has no such method; DocSessionHandler's PUT is a read
                ok = got in (*REFUSED, 405) or route["handler"].endswith("DocSessionHandler")
                if not ok:
                    wrong.append((method.upper(), path, role, got))
    assert not wrong, f"a change not refused: {wrong}"


# A training script as users write one: TensorBoard event files under runs/, written
# with TensorBoard's own writer (no TensorFlow, no torch in the image).
TRAIN = """\
import sys
from tensorboard.summary import Writer

writer = Writer(sys.argv[1])
for step in range(5):
    writer.add_scalar("loss", 1.0 / (step + 1), step=step)
writer.close()
print("wrote", sys.argv[1])
"""
RUN = "runs/first-try"


def _wait_for(what: str, probe, timeout: float = 90, every: float = 2):
    """``probe()``'s first true answer within ``timeout`` seconds, or fail saying ``what``."""
    import time

    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} within {timeout:.0f} s; last answer: {last!r}")


def test_tensorboard_shows_a_jobs_scalars_to_collaborators_and_owner_only(people, routes):
    owner, collab, viewer = people[OWNER], people[COLLAB], people[VIEWER]
    put = {"type": "file", "format": "text", "content": TRAIN}
    assert owner.api("PUT", f"{SERVER}/api/contents/train.py", json=put).status_code in (200, 201)
    start = {"target": "train.py", "args": [RUN]}
    r = owner.api("POST", f"{SERVER}/api/gpulab/v1/jobs", json=start)
    assert r.status_code == 201, r.text
    job = r.json()["id"]

    def ended():
        state = owner.api("GET", f"{SERVER}/api/gpulab/v1/jobs/{job}").json()
        return state if state["state"] not in ("starting", "running") else None

    state = _wait_for("the training job ended", ended)
    assert state["state"] == "succeeded", state

    # The owner opens the TensorBoard tile: TensorBoard's own page, at the project's address.
    page = owner.api("GET", f"{SERVER}/tensorboard/", timeout=120)
    assert page.status_code == 200, page.text[:500]
    assert "tb-relative-root" in page.text, page.text[:300]

    def scalars(person):
        r = person.api("GET", f"{SERVER}/tensorboard/data/plugin/scalars/tags")
        return r.json() if r.status_code == 200 and RUN in r.json() else None

    tags = _wait_for("TensorBoard listed the job's run", lambda: scalars(owner))
    assert "loss" in tags[RUN], tags
    points = owner.api(
        "GET",
        f"{SERVER}/tensorboard/data/plugin/scalars/scalars",
        params={"run": RUN, "tag": "loss"},
    )
    assert points.status_code == 200, points.text
    assert [step for _, step, _ in points.json()] == [0, 1, 2, 3, 4]
    assert "loss" in scalars(collab)[RUN]  # collaborators see it too

    # A viewer is refused TensorBoard, its data, and every proxy route, in the role's
    # words: starting TensorBoard, or reaching a port, is running something.
    for method, path in [
        ("GET", "/tensorboard/"),
        ("GET", "/tensorboard/data/plugin/scalars/tags"),
        ("GET", "/server-proxy/servers-info"),
        ("OPTIONS", "/tensorboard/"),
        ("OPTIONS", "/proxy/8888/api/status"),
        ("GET", "/proxy/localhost:8888/api/status"),
    ]:
        got = viewer.api(method, SERVER + path)
        assert got.status_code == 403, (method, path, got.status_code, got.text[:300])
        if method == "GET":
            assert "You are a viewer" in got.text, (path, got.text[:300])
    # The proxy never leaves the container: any host but its own is refused before a
    # connection is tried, the owner included (.invalid names resolve nowhere anyway).
    outside = owner.api("GET", f"{SERVER}/proxy/gpulab-hub.invalid:8081/")
    assert outside.status_code == 403, outside.text[:300]
    assert "not allowed" in outside.text, outside.text[:300]

"""Every route of the hub, asked as each role (issue 13, tests; the project server's
side is test_route_matrix.py).

The route list is JupyterHub's own, built in-process on gpulab's configuration
(hub_routes.py): the authenticator's pages, JupyterHub's pages and REST API, gpulab's
``extra_handlers``. Every pattern must be in :data:`EXPECTED`, with a sample path and
the status each role gets: a route added by a JupyterHub upgrade or by gpulab and not
listed here FAILS. Statuses are in the order of ``ROLES``: anonymous, another user,
viewer, collaborator, owner, admin (without a share). Pages are asked with the
browser session (cookies), /hub/api/ with the person's API token. Changes (POST, PUT,
PATCH, DELETE) are asked as the four who may not change the owner's things, with
their credentials (the form's or header's XSRF token for a browser session) and, from
a browser session, without XSRF (always refused); ``.`` marks what is not asked: the
owner's and admins' own JupyterHub powers (test_hub_route_changes.py performs gpulab's
as the roles that may).
"""

from __future__ import annotations

import pytest
import requests
from hub_routes import (
    CHANGES,
    OTHER,
    OWNER,
    PROJECT,
    RENAMED,
    ROLES,
    VIEWER,
    People,
    hub_routes,
    statuses,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

U, P = OWNER, PROJECT
JOB = "20261123-141502-a1b2"
# pattern: (sample path, {method: statuses}); statuses of "get" for every role, of a
# change for anonymous, other, viewer and collaborator.
EXPECTED: dict[str, tuple[str, dict[str, str]]] = {
    "/hub/static/(.*)": ("/hub/static/favicon.ico", {"get": "200 200 200 200 200 200"}),
    # a login without a password is refused like a wrong one (NativeAuthenticator's was a 500)
    "/hub/login": ("/hub/login", {"get": "200 302 302 302 302 302", "post": "403 403 403 403 . ."}),
    "/hub/signup": (
        "/hub/signup",
        {"get": "200 200 200 200 200 200", "post": "403 400 400 400 . ."},
    ),
    "/hub/discard/([^/]*)": (
        "/hub/discard/hmother",
        {"get": "403 403 403 403 403 303", "post": "403 403 403 403 . ."},
    ),
    "/hub/authorize": ("/hub/authorize", {"get": "403 403 403 403 403 200"}),
    "/hub/authorize/([^/]*)": (
        "/hub/authorize/hmother",
        {"get": "403 403 403 403 403 303", "post": "403 403 403 403 . ."},
    ),
    "/hub/confirm/([^/]*)": ("/hub/confirm/x", {"get": "200 200 200 200 200 200"}),
    "/hub/change-password": (
        "/hub/change-password",
        {"get": "302 200 200 200 200 200", "post": "403 400 400 400 . ."},
    ),
    "/hub/change-password/([^/]+)": (
        f"/hub/change-password/{U}",
        {"get": "403 403 403 403 403 200", "post": "403 403 403 403 . ."},
    ),
    "/hub": ("/hub", {"get": "301 301 301 301 301 301"}),
    "/hub/user/(?P<user_name>[^/]+)(?P<user_path>/.*)?": (
        f"/hub/user/{U}/{P}/",
        {
            "get": "302 404 302 302 302 302",  # running: on to /user/...
            "post": "403 424 424 424 . .",
            "patch": "403 424 424 424 . .",
            "delete": "403 424 424 424 . .",
        },
    ),
    "/hub/user-redirect/(.*)?": ("/hub/user-redirect/lab", {"get": "302 302 302 302 302 302"}),
    "/hub/security/csp-report": ("/hub/security/csp-report", {"post": "403 200 200 200 . ."}),
    "/hub/": ("/hub/", {"get": "302 302 302 302 302 302"}),
    "/hub/home": ("/hub/home", {"get": "302 200 200 200 200 200"}),
    "/hub/admin": ("/hub/admin", {"get": "302 403 403 403 403 200"}),
    "/hub/spawn-pending/([^/]+)": (f"/hub/spawn-pending/{U}", {"get": "302 404 404 404 200 200"}),
    "/hub/spawn-pending/([^/]+)/([^/]+)": (
        f"/hub/spawn-pending/{U}/{P}",
        {"get": "302 404 404 404 302 302"},  # running: on to its server
    ),
    # The default server's: gpulab has none; everyone logged in is sent home (home/web.py)
    "/hub/spawn": ("/hub/spawn", {"get": "302 302 302 302 302 302", "post": "403 303 303 303 . ."}),
    "/hub/spawn/([^/]+)": (
        f"/hub/spawn/{U}",
        {"get": "302 302 302 302 302 302", "post": "403 303 303 303 . ."},
    ),
    "/hub/spawn/([^/]+)/([^/]+)": (
        f"/hub/spawn/{U}/{P}",
        {"get": "302 404 404 404 302 302", "post": "403 404 404 404 . ."},
    ),
    "/hub/token": ("/hub/token", {"get": "302 200 200 200 200 200"}),
    "/hub/accept-share": (
        "/hub/accept-share",
        {"get": "302 400 400 400 400 400", "post": "403 400 400 400 . ."},
    ),
    "/hub/error/(\\d+)": ("/hub/error/503", {"get": "200 200 200 200 200 200"}),
    "/hub/health$": ("/hub/health", {"get": "200 200 200 200 200 200"}),
    "/hub/api/health$": ("/hub/api/health", {"get": "200 200 200 200 200 200"}),
    "/hub/logout": ("/hub/logout", {"get": "302 302 302 302 302 302"}),
    "/hub/metrics$": ("/hub/metrics", {"get": "403 403 403 403 403 200"}),
    "/hub/api/metrics$": ("/hub/api/metrics", {"get": "403 403 403 403 403 200"}),
    "/hub/api/authorizations/cookie/([^/]+)(?:/([^/]+))?": (
        "/hub/api/authorizations/cookie/x",
        {"get": "403 404 404 404 404 404"},
    ),
    "/hub/api/authorizations/token/([^/]+)": (
        "/hub/api/authorizations/token/x",
        {"get": "403 404 404 404 404 404", "post": "500 500 500 500 . ."},
    ),
    "/hub/api/authorizations/token": (
        "/hub/api/authorizations/token",
        {"get": "403 500 500 500 500 500", "post": "404 404 404 404 . ."},
    ),
    "/hub/api/oauth2/authorize": (
        "/hub/api/oauth2/authorize",
        {"get": "302 302 302 302 302 302", "post": "403 403 403 403 . ."},
    ),
    "/hub/api/oauth2/token": ("/hub/api/oauth2/token", {"post": "400 400 400 400 . ."}),
    "/hub/api/shutdown": ("/hub/api/shutdown", {"post": "403 403 403 403 . ."}),
    "/hub/api/?": ("/hub/api/", {"get": "200 200 200 200 200 200"}),
    "/hub/api/info": ("/hub/api/info", {"get": "403 403 403 403 403 200"}),
    "/hub/api/proxy": (
        "/hub/api/proxy",
        {
            "get": "403 403 403 403 403 200",
            "post": "403 403 403 403 . .",
            "patch": "403 403 403 403 . .",
        },
    ),
    "/hub/api/user": ("/hub/api/user", {"get": "403 200 200 200 200 200"}),
    "/hub/api/users": (
        "/hub/api/users",
        {"get": "403 403 403 403 403 200", "post": "403 403 403 403 . ."},
    ),
    "/hub/api/users/([^/]+)": (
        f"/hub/api/users/{U}",
        {
            "get": "403 404 404 404 200 200",
            "post": "403 403 403 403 . .",
            "patch": "403 403 403 403 . .",
            "delete": "403 403 403 403 . .",
        },
    ),
    "/hub/api/users/([^/]+)/server": (
        f"/hub/api/users/{U}/server",
        {
            "get": "403 404 404 404 200 200",
            "post": "403 404 404 404 . .",
            "put": "403 404 404 404 . .",
            "patch": "403 404 404 404 . .",
            "delete": "403 404 404 404 . .",
        },
    ),
    # No default server is ever started (home/): nothing in progress
    "/hub/api/users/([^/]+)/server/progress": (
        f"/hub/api/users/{U}/server/progress",
        {"get": "403 404 404 404 400 400"},
    ),
    "/hub/api/users/([^/]+)/tokens": (
        f"/hub/api/users/{U}/tokens",
        {"get": "403 404 404 404 200 200", "post": "403 403 403 403 . ."},
    ),
    "/hub/api/users/([^/]+)/tokens/([^/]*)": (
        f"/hub/api/users/{U}/tokens/a1",
        {"get": "403 404 404 404 404 404", "delete": "403 404 404 404 . ."},
    ),
    "/hub/api/users/([^/]+)/servers/([^/]*)": (
        f"/hub/api/users/{U}/servers/{P}",
        {
            "get": "403 404 404 404 200 200",
            "post": "403 404 404 404 . .",
            "put": "403 404 404 404 . .",
            "patch": "403 404 404 404 . .",
            "delete": "403 404 404 404 . .",
        },
    ),
    "/hub/api/users/([^/]+)/servers/([^/]*)/progress": (
        f"/hub/api/users/{U}/servers/{P}/progress",
        {"get": "403 404 404 404 200 200"},
    ),
    "/hub/api/users/([^/]+)/activity": (
        f"/hub/api/users/{U}/activity",
        {"post": "403 404 404 404 . ."},
    ),
    "/hub/api/users/([^/]+)/admin-access": (
        f"/hub/api/users/{U}/admin-access",
        {"post": "403 404 404 404 . ."},
    ),
    "/hub/api/groups": (
        "/hub/api/groups",
        {"get": "403 403 403 403 403 200", "post": "403 403 403 403 . ."},
    ),
    "/hub/api/groups/([^/]+)": (
        "/hub/api/groups/hmgroup",
        {
            "get": "403 403 403 403 403 404",
            "post": "403 403 403 403 . .",
            "delete": "403 403 403 403 . .",
        },
    ),
    "/hub/api/groups/([^/]+)/users": (
        "/hub/api/groups/hmgroup/users",
        {"post": "403 403 403 403 . .", "delete": "403 403 403 403 . ."},
    ),
    "/hub/api/groups/([^/]+)/properties": (
        "/hub/api/groups/hmgroup/properties",
        {"put": "403 403 403 403 . ."},
    ),
    "/hub/api/services": ("/hub/api/services", {"get": "403 403 403 403 403 200"}),
    "/hub/api/services/([^/]+)": (
        "/hub/api/services/x",
        {
            "get": "403 403 403 403 403 404",
            "post": "403 403 403 403 . .",
            "delete": "403 403 403 403 . .",
        },
    ),
    "/hub/api/shares/([^/]+)": (
        f"/hub/api/shares/{U}",
        {
            "get": "403 404 404 404 200 200",
            "post": "403 404 404 404 . .",
            "patch": "403 404 404 404 . .",
            "delete": "403 404 404 404 . .",
        },
    ),
    "/hub/api/shares/([^/]+)/([^/]*)": (
        f"/hub/api/shares/{U}/{P}",
        {
            "get": "403 404 404 404 200 200",
            "post": "403 404 404 404 . .",
            "patch": "403 404 404 404 . .",
            "delete": "403 404 404 404 . .",
        },
    ),
    "/hub/api/users/([^/]+)/shared": (
        f"/hub/api/users/{VIEWER}/shared",
        {"get": "403 404 200 404 404 200"},
    ),
    "/hub/api/groups/([^/]+)/shared": (
        "/hub/api/groups/hmgroup/shared",
        {"get": "403 404 404 404 404 404"},
    ),
    "/hub/api/users/([^/]+)/shared/([^/]+)/([^/]*)": (
        f"/hub/api/users/{VIEWER}/shared/{U}/{P}",
        {"get": "403 404 200 404 404 200", "delete": "403 404 . 404 . ."},
    ),
    "/hub/api/groups/([^/]+)/shared/([^/]+)/([^/]*)": (
        f"/hub/api/groups/hmgroup/shared/{U}/{P}",
        {"get": "403 404 404 404 404 404", "delete": "403 404 404 404 . ."},
    ),
    "/hub/api/share-codes/([^/]+)": (
        f"/hub/api/share-codes/{U}",
        {
            "get": "403 404 404 404 200 200",
            "post": "403 404 404 404 . .",
            "delete": "403 404 404 404 . .",
        },
    ),
    "/hub/api/share-codes/([^/]+)/([^/]*)": (
        f"/hub/api/share-codes/{U}/{P}",
        {
            "get": "403 404 404 404 200 200",
            "post": "403 404 404 404 . .",
            "delete": "403 404 404 404 . .",
        },
    ),
    "/hub/gpulab/doctor": ("/hub/gpulab/doctor", {"get": "302 403 403 403 403 200"}),
    # GPU usage of everyone: admins only
    "/hub/gpulab/usage": ("/hub/gpulab/usage", {"get": "302 403 403 403 403 200"}),
    "/hub/gpulab/usage\\.csv": ("/hub/gpulab/usage.csv", {"get": "302 403 403 403 403 200"}),
    # The admin overview and its actions (stop, delete, approve): admins only
    "/hub/gpulab/admin": (
        "/hub/gpulab/admin",
        {"get": "302 403 403 403 403 200", "post": "403 403 403 403 . ."},
    ),
    "/hub/gpulab/share/([^/]+)(?:/([^/]+))?": (
        f"/hub/gpulab/share/{U}/{P}",
        {"get": "302 404 404 403 200 404", "post": "403 404 404 403 . ."},
    ),
    "/hub/gpulab/copy": (
        f"/hub/gpulab/copy?owner={U}&project={P}&path=notes.ipynb",
        {"get": "302 404 200 200 200 404", "post": "403 404 404 404 . ."},
    ),
    "/hub/gpulab/shared": (
        "/hub/gpulab/shared",
        {"get": "302 200 200 200 200 200", "post": "403 400 400 400 . ."},
    ),
    "/hub/gpulab/public-links/([^/]+)": (
        f"/hub/gpulab/public-links/{P}",
        {"get": "302 404 404 404 404 404", "post": "403 404 404 404 . ."},
    ),
    "/hub/gpulab/p/([^/]+)": ("/hub/gpulab/p/x", {"get": "404 404 404 404 404 404"}),
    "/hub/gpulab/rename/([^/]+)": (
        f"/hub/gpulab/rename/{P}",
        {"get": "302 404 404 404 200 404", "post": "403 404 404 404 . ."},
    ),
    # A project's latest build log: its owner and collaborators only (viewers never)
    "/hub/gpulab/build-log/([^/]+)(?:/([^/]+))?": (
        f"/hub/gpulab/build-log/{U}/{P}",
        {"get": "302 404 404 200 200 404"},
    ),
    # Change runtime type (home/runtime.py): its owner and collaborators see it; a
    # collaborator changes it only where the owner lets them start the project (not here)
    "/hub/gpulab/runtime/([^/]+)/([^/]+)": (
        f"/hub/gpulab/runtime/{U}/{P}",
        {"get": "302 404 404 200 200 404", "post": "403 404 404 403 . ."},
    ),
    "/hub/api/gpulab/projects/([^/]+)/([^/]+)/rename": (
        f"/hub/api/gpulab/projects/{U}/{P}/rename",
        {"post": "403 404 404 404 . ."},
    ),
    # Each user's SSH keys (every logged-in user: their own); the gateway's access API:
    # its service token only, never a user's or an admin's (ssh/)
    "/hub/gpulab/ssh": (
        "/hub/gpulab/ssh",
        {"get": "302 200 200 200 200 200", "post": "403 400 400 400 . ."},
    ),
    "/hub/api/gpulab/ssh/access/([^/]+)/([^/]+)/([^/]+)": (
        f"/hub/api/gpulab/ssh/access/{U}/{U}/{P}",
        {"get": "403 403 403 403 403 403"},
    ),
    # Each user's own secrets (every logged-in user: their own; an empty form is refused);
    # the API project servers ask with the starter's token: the owner and collaborators
    # (who get {"env": {}} unless the owner allows them), nobody else (secrets/)
    "/hub/gpulab/secrets": (
        "/hub/gpulab/secrets",
        {"get": "302 200 200 200 200 200", "post": "403 400 400 400 . ."},
    ),
    "/hub/api/gpulab/secrets/([^/]+)/([^/]+)": (
        f"/hub/api/gpulab/secrets/{U}/{P}",
        {"get": "403 403 403 200 200 403"},
    ),
    # Multi-node jobs on a Slurm cluster (cluster/jobsapi.py): the project server's own
    # token, owners and collaborators submit and stop, viewers read, others get 404. This
    # hub runs on one machine: its list is empty and a submit is 409; no job exists.
    "/hub/api/gpulab/cluster/jobs/([^/]+)/([^/]+)": (
        f"/hub/api/gpulab/cluster/jobs/{U}/{P}",
        {"get": "403 404 200 200 200 404", "post": "403 404 403 409 . ."},
    ),
    "/hub/api/gpulab/cluster/jobs/([^/]+)/([^/]+)/([0-9]{8}-[0-9]{6}-[a-z0-9]{4})": (
        f"/hub/api/gpulab/cluster/jobs/{U}/{P}/{JOB}",
        {"get": "403 404 404 404 404 404"},
    ),
    "/hub/api/gpulab/cluster/jobs/([^/]+)/([^/]+)/([0-9]{8}-[0-9]{6}-[a-z0-9]{4})/stop": (
        f"/hub/api/gpulab/cluster/jobs/{U}/{P}/{JOB}/stop",
        {"post": "403 404 403 404 . ."},
    ),
    # Whether a project is warned that it stops unless used (gpus/reclaimapi.py): the
    # project server's own token, its owner and collaborators; others (viewers too) 404.
    "/hub/api/gpulab/reclaim/([^/]+)/([^/]+)": (
        f"/hub/api/gpulab/reclaim/{U}/{P}",
        {"get": "403 404 404 200 200 404"},
    ),
    "/hub/logo": ("/hub/logo", {"get": "200 200 200 200 200 200"}),
    "/hub/api/(.*)": ("/hub/api/nothing", {}),
    # /user/<owner> (no default server behind it): the hub adds the slash
    "/(user|services)/([^/]+)": (f"/user/{U}", {"get": "301 301 301 301 301 301"}),
    "(?!/hub/).*": ("/nothing", {"get": "302 302 302 302 302 302"}),
    "(.*)": ("/hub/nothing", {}),
}
# Logging out ends the browser session the other tests use: asked with tokens only.
TOKEN_ONLY = frozenset({"/hub/logout"})


@pytest.fixture(scope="module")
def routes():
    return hub_routes()


@pytest.fixture(scope="module")
def people(hub):
    return People(hub)


def how(pattern: str, path: str) -> str:
    return "token" if path.startswith("/hub/api/") or path in TOKEN_ONLY else "cookie"


def test_every_hub_route_is_in_the_expectation_table(routes):
    found = {r["pattern"]: r["methods"] for r in routes}
    unknown = sorted(set(found) - set(EXPECTED))
    assert not unknown, f"hub routes nobody decided on (add them to EXPECTED): {unknown}"
    gone = sorted(set(EXPECTED) - set(found))
    assert not gone, f"routes in EXPECTED the hub no longer has: {gone}"
    for pattern, methods in found.items():
        assert set(EXPECTED[pattern][1]) == set(methods), (pattern, methods)


def observed(people, method: str, with_how) -> dict[str, dict[str, int]]:
    jobs, keys = [], []
    for pattern, (path, table) in EXPECTED.items():
        if method not in table:
            continue
        for role, want in statuses(table[method]).items():
            if want == ".":
                continue
            jobs.append((role, method.upper(), path, with_how(pattern, path), {}))
            keys.append((pattern, role))
    got: dict[str, dict[str, int]] = {}
    for (pattern, role), status in zip(keys, people.ask_all(jobs), strict=True):
        got.setdefault(pattern, {})[role] = status
    return got


def compare(method: str, got) -> list[str]:
    wrong = []
    for pattern, by_role in got.items():
        want = statuses(EXPECTED[pattern][1][method])
        seen = " ".join(str(by_role.get(role, ".")) for role in ROLES)
        if any(want[r] != str(s) for r, s in by_role.items()):
            wrong.append(
                f"{pattern!r}: {method} want {EXPECTED[pattern][1][method]!r} got {seen!r}"
            )
    return wrong


def test_every_hub_route_as_every_role(people):
    wrong = compare("get", observed(people, "get", how))
    assert not wrong, "statuses not as expected:\n" + "\n".join(wrong)


@pytest.mark.parametrize("method", CHANGES)
def test_no_change_by_those_who_may_not(people, method):
    wrong = compare(
        method,
        observed(
            people,
            method,
            lambda pattern, path: how(pattern, path) if how(pattern, path) == "token" else "xsrf",
        ),
    )
    assert not wrong, "statuses not as expected:\n" + "\n".join(wrong)


@pytest.mark.parametrize("method", CHANGES)
def test_no_change_from_a_browser_session_without_xsrf(people, method):
    jobs = []
    for _pattern, (path, table) in EXPECTED.items():
        if method in table:
            jobs += [(role, method.upper(), path, "cookie", {}) for role in ROLES[1:]]
    got = people.ask_all(jobs)
    # Refused (403), or an error before any change (JupyterHub's removed token API: 404, 500)
    wrong = [(j[0], j[1], j[2], s) for j, s in zip(jobs, got, strict=True) if s < 400]
    assert not wrong, f"a change without XSRF not refused: {wrong}"


def test_a_project_servers_own_token_reaches_its_own_projects_jobs_only(people, docker_engine):
    """The token in a project's container ($JUPYTERHUB_API_TOKEN, the owner's, which
    everyone who runs code there can read) asks the cluster jobs API for its own project
    only: another project of the same owner, or someone else's, is not there for it."""
    (box,) = docker_engine.call(
        "containers", filters={"label": [f"gpulab.owner={OWNER}", f"gpulab.project={P}"]}
    )
    env = docker_engine.call("inspect_container", box["Id"])["Config"]["Env"]
    token = next(e.split("=", 1)[1] for e in env if e.startswith("JUPYTERHUB_API_TOKEN="))
    assert "GPULAB_JOBS_ENGINE=cluster" not in env  # one machine: jobs run in the container

    def ask(method: str, path: str, body=None):
        r = requests.request(
            method, f"{people.base}/hub/api/gpulab/cluster/jobs/{path}", json=body,
            headers={"Authorization": f"token {token}"}, timeout=20,
        )  # fmt: skip
        return r.status_code, r.json()

    assert ask("GET", f"{U}/{P}") == (200, {"jobs": [], "cluster": False})
    status, answer = ask("POST", f"{U}/{P}", {"id": JOB, "script": "t.py", "nodes": 2})
    assert status == 409 and "multi-node jobs need gpulab on a Slurm cluster" in answer["message"]
    assert ask("GET", f"{U}/{P}/{JOB}")[0] == 404
    for elsewhere in (f"{U}/{RENAMED}", f"{VIEWER}/{P}", f"{U}/nothing"):
        assert ask("GET", elsewhere)[0] == 404, elsewhere
        assert ask("POST", elsewhere, {})[0] == 404, elsewhere


def test_a_project_servers_own_token_reads_its_own_projects_reclaim_warning_only(
    people, docker_engine
):
    """The same token asks whether its project is warned (gpus/reclaimapi.py): its own
    project answers, no other project of the owner or of anyone else is there for it."""
    (box,) = docker_engine.call(
        "containers", filters={"label": [f"gpulab.owner={OWNER}", f"gpulab.project={P}"]}
    )
    env = docker_engine.call("inspect_container", box["Id"])["Config"]["Env"]
    token = next(e.split("=", 1)[1] for e in env if e.startswith("JUPYTERHUB_API_TOKEN="))

    def ask(path: str) -> tuple[int, dict]:
        r = requests.get(
            f"{people.base}/hub/api/gpulab/reclaim/{path}",
            headers={"Authorization": f"token {token}"}, timeout=20,
        )  # fmt: skip
        return r.status_code, r.json()

    assert ask(f"{U}/{P}") == (
        200, {"warned": False, "reason": "", "stops_at": None, "words": ""}
    )  # fmt: skip
    for elsewhere in (f"{U}/{RENAMED}", f"{VIEWER}/{P}", f"{U}/nothing"):
        assert ask(elsewhere)[0] == 404, elsewhere


# --- gpulab's changes, made by the roles that may (run last: they change shares) -----
def form(people, who: str, path: str, **fields) -> int:
    return (
        people.users[who]
        .http.post(
            people.base + path,
            data={"_xsrf": people.xsrf(who), **fields},
            allow_redirects=False,
            timeout=30,
        )
        .status_code
    )


def test_gpulab_changes_by_those_who_may(people):
    share = f"/hub/gpulab/share/{U}/{P}"
    # Re-sharing is the owner's choice; until then a collaborator is refused.
    assert form(people, "collaborator", share, action="link", role="viewer", hours="1") == 403
    assert form(people, "owner", share, action="settings", allow="collaborators_may_reshare") == 200
    assert people.ask("collaborator", "GET", share, "cookie") == 200
    assert form(people, "collaborator", share, action="link", role="viewer", hours="1") == 200
    assert form(people, "collaborator", share, action="settings") == 403  # the owner's only
    assert form(people, "viewer", share, action="link", role="viewer", hours="1") == 404
    assert form(people, "owner", share, action="link", role="viewer", hours="1") == 200
    # The owner shares with another user, who leaves the share on "shared with me".
    assert form(people, "owner", share, action="user", name=OTHER, role="viewer") == 200
    leave = {"action": "leave", "owner": U, "project": P}
    assert form(people, "other", "/hub/gpulab/shared", **leave) == 200
    assert form(people, "other", "/hub/gpulab/shared", **leave) == 404  # gone
    # The owner renames a stopped project on the page, then through the API.
    # (People made and started it through the API. A running project is not renamed.)
    owner = people.users["owner"]
    if RENAMED in owner.api("GET", f"/hub/api/users/{U}").json()["servers"]:
        owner.stop_project(RENAMED)
    assert people.ask("owner", "GET", f"/hub/gpulab/rename/{RENAMED}", "cookie") == 200
    r = people.users["owner"].http.post(
        people.base + f"/hub/gpulab/rename/{RENAMED}",
        data={"_xsrf": people.xsrf("owner"), "new_name": "hmren2"},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 200, r.text[-3000:]
    r = people.users["owner"].api(
        "POST", f"/hub/api/gpulab/projects/{U}/hmren2/rename", json={"name": "hmren3"}
    )
    assert r.status_code == 200, r.text

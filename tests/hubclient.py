"""A browser-like client of a running hub: forms with XSRF, cookies, API tokens."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import uuid
from urllib.parse import quote

import requests
import websocket


class HubUser:
    def __init__(self, base_url: str, name: str, password: str):
        self.base = base_url.rstrip("/")
        self.name = name
        self.password = password
        self.http = requests.Session()
        self.token: str | None = None

    # --- pages (what a browser does) ---
    def _xsrf(self, path: str) -> str:
        self.http.get(self.base + path, timeout=10)
        return self.http.cookies.get("_xsrf", path="/hub/")

    def signup(self) -> requests.Response:
        xsrf = self._xsrf("/hub/signup")
        return self.http.post(
            self.base + "/hub/signup",
            data={
                "_xsrf": xsrf,
                "username": self.name,
                "signup_password": self.password,
                "signup_password_confirmation": self.password,
            },
            timeout=10,
        )

    def login(self) -> requests.Response:
        xsrf = self._xsrf("/hub/login")
        r = self.http.post(
            self.base + "/hub/login?next=",
            data={"_xsrf": xsrf, "username": self.name, "password": self.password},
            allow_redirects=False,
            timeout=10,
        )
        return r

    def authorize(self, username: str, action: str = "authorize") -> requests.Response:
        """Admin approval of a signed-up user, as a browser does it: the authorization
        page, then the POST of its form (with the page's _xsrf token)."""
        page = self.http.get(f"{self.base}/hub/authorize", timeout=10)
        m = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        xsrf = m.group(1) if m else self.http.cookies.get("_xsrf", path="/hub/")
        return self.http.post(
            f"{self.base}/hub/authorize/{quote(username)}",
            data={"_xsrf": xsrf, "action": action},
            timeout=10,
        )

    def new_token(self) -> str:
        xsrf = self.http.cookies.get("_xsrf", path="/hub/")
        r = self.http.post(
            f"{self.base}/hub/api/users/{self.name}/tokens",
            headers={"X-XSRFToken": xsrf},
            json={"note": "gpulab tests", "expires_in": 3600},
            timeout=10,
        )
        r.raise_for_status()
        self.token = r.json()["token"]
        return self.token

    # --- REST API with the token ---
    def api(self, method: str, path: str, **kw) -> requests.Response:
        headers = kw.pop("headers", {})
        headers["Authorization"] = f"token {self.token}"
        kw.setdefault("timeout", 30)
        return requests.request(method, f"{self.base}{path}", headers=headers, **kw)

    def make_project(self, project: str, display_name: str) -> None:
        """A project as the home page's form makes it (its REST call), then listed there."""
        made = self.api(
            "PUT", f"/hub/api/users/{self.name}/servers/{project}",
            json={"display_name": display_name},
        )  # fmt: skip
        assert made.ok, made.text
        assert display_name in self.http.get(self.base + "/hub/home", timeout=10).text

    def start_project(self, project: str, timeout: float = 600) -> dict:
        r = self.api("POST", f"/hub/api/users/{self.name}/servers/{project}", json={})
        if r.status_code not in (201, 202):
            raise AssertionError(f"start {project}: {r.status_code} {r.text}")
        return self.wait_ready(project, timeout)

    def wait_ready(self, project: str, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.api("GET", f"/hub/api/users/{self.name}").json()
            server = model["servers"].get(project)
            if server and server["ready"]:
                return server
            if not server or not server.get("pending"):
                raise AssertionError(f"{project} is neither pending nor ready: {model}")
            time.sleep(0.5)
        raise AssertionError(f"{project} not ready after {timeout} s")

    def progress_events(self, project: str) -> list[dict]:
        r = self.api("GET", f"/hub/api/users/{self.name}/servers/{project}/progress", stream=True)
        events = []
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
        return events

    def stop_project(self, project: str, timeout: float = 120) -> None:
        r = self.api("DELETE", f"/hub/api/users/{self.name}/servers/{project}")
        assert r.status_code in (202, 204), r.text
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.api("GET", f"/hub/api/users/{self.name}").json()
            if project not in model["servers"]:
                return
            time.sleep(0.5)
        raise AssertionError(f"{project} did not stop")

    # --- the single-user server of a project, through the proxy ---
    def server_url(self, project: str) -> str:
        return f"{self.base}/user/{self.name}/{project}"

    def execute(self, project: str, code: str, timeout: float = 60) -> str:
        """Start a kernel, run ``code`` over the websocket, return its stdout."""
        url = self.server_url(project)
        r = self.api("POST", url.removeprefix(self.base) + "/api/kernels", json={"name": "python3"})
        r.raise_for_status()
        kernel_id = r.json()["id"]
        ws_url = url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
        ws = websocket.create_connection(
            ws_url, header=[f"Authorization: token {self.token}"], timeout=timeout
        )
        try:
            msg_id = uuid.uuid4().hex
            ws.send(
                json.dumps(
                    {
                        "header": {
                            "msg_id": msg_id,
                            "username": self.name,
                            "session": uuid.uuid4().hex,
                            "msg_type": "execute_request",
                            "version": "5.3",
                        },
                        "parent_header": {},
                        "metadata": {},
                        "content": {"code": code, "silent": False},
                        "channel": "shell",
                    }
                )
            )
            out = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = json.loads(ws.recv())
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["msg_type"]
                if kind == "stream":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    raise AssertionError("kernel error: " + "\n".join(msg["content"]["traceback"]))
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    return "".join(out)
            raise AssertionError("no reply from the kernel")
        finally:
            ws.close()
            self.api("DELETE", url.removeprefix(self.base) + f"/api/kernels/{kernel_id}")


@contextlib.contextmanager
def localhost_names():
    """Resolve ``localhost`` and every ``*.localhost`` name to 127.0.0.1 in this
    process, as browsers do (this machine's resolver does not): a hub at
    lab.localhost, each user's projects at <user>.lab.localhost."""
    real = socket.getaddrinfo

    def getaddrinfo(name, *args, **kwargs):
        if isinstance(name, str) and (name == "localhost" or name.endswith(".localhost")):
            name = "127.0.0.1"
        return real(name, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.getaddrinfo = real

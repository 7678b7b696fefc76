"""The GPU status routes of gpulab-jupyter, against a real Jupyter server (pytest-jupyter).

On a machine without an NVIDIA driver (CI) these test the no-GPU path for real:
nothing fakes NVML. The sampler's error handling is driven through its one seam,
the reader it calls for everything it reads: a real ``NvmlReader`` that raises on
demand (a failing collaborator, not a fake NVML). Every route is enumerated from what the extension
registers, and each one must refuse an anonymous request. The tests are plain
functions that run requests on pytest-jupyter's own event loop (the suite's
pytest-asyncio would otherwise run them on another one).
"""

import json
import logging
import re
import threading
import time

import pytest
import tornado.httpclient

# pytest-jupyter's fixtures for this module only: as `pytest_plugins` they would apply
# (with an autouse event-loop fixture) to every later test of the suite.
from pytest_jupyter.jupyter_server import *  # noqa: F403

from gpulab_contract import environment
from gpulab_jupyter import diagnosis, handlers
from gpulab_jupyter.handlers import API_PREFIX
from gpulab_jupyter.jobs.model import JOB_ID
from gpulab_jupyter.sampler import GPUSampler, NvmlReader

REASONS = {"no_driver", "none_allocated", "nvml_error", "sampler_error", "starting", None}
COMMON = {"available", "reason", "message", "hint", "interval", "min_interval", "process_interval",
          "stale", "error", "error_since", "last_ok"}  # fmt: skip
PROCESSES = {"available", "stale", "error", "timestamp", "processes", "other"}
GPU_FIELDS = {
    "index", "uuid", "name", "nvml_index", "mig", "parent_uuid", "utilization",
    "memory_utilization", "memory_used", "memory_total", "memory_free", "temperature",
    "power_draw", "power_limit",
}  # fmt: skip


@pytest.fixture
def jp_server_config():
    return {
        "ServerApp": {"jpserver_extensions": {"gpulab_jupyter": True}},
        "GPUSampler": {"interval": 0.5, "min_interval": 0.2, "process_interval": 1.0},
    }


def has_driver() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture
def fetch(jp_fetch, jp_asyncio_loop):
    """fetch, run to completion on the server's loop."""

    def run(*parts, **kwargs):
        return jp_asyncio_loop.run_until_complete(jp_fetch(*parts, **kwargs))

    return run


def get_json(fetch, route, **params):
    r = fetch(API_PREFIX, route, params=params)
    assert r.code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    return json.loads(r.body)


def settled_status(fetch, timeout=10.0):
    """The status once the sampler's first attempt is done (no longer 'starting')."""
    deadline = time.monotonic() + timeout
    while True:
        body = get_json(fetch, "gpu")
        if body["reason"] != "starting" or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def our_routes(jp_serverapp):
    """Every URL pattern the web app has under /api/gpulab/v1/."""
    found = []
    for rule in jp_serverapp.web_app.default_router.rules:
        for sub in getattr(rule.target, "rules", []):
            pattern = sub.matcher.regex.pattern
            if f"/{API_PREFIX}/" in pattern:
                found.append((pattern.rstrip("$"), sub.target))
    return found


def test_every_route_refuses_an_anonymous_request(jp_serverapp, fetch, jp_base_url):
    routes = our_routes(jp_serverapp)
    registered = {cls for _, cls in routes}
    assert registered == {cls for _, cls in handlers.routes()}, routes
    assert len(routes) >= 4
    for pattern, cls in routes:
        path = pattern[len(jp_base_url) :] if pattern.startswith(jp_base_url) else pattern
        # a job's routes: a job id that does not exist, and the stop action
        path = path.replace(f"({JOB_ID.pattern})", "20261123-141502-a1b2")
        path = path.replace("(stop|rerun)", "stop")
        for method in ("GET", "POST"):
            if method.lower() not in cls.__dict__:
                continue
            body = b"{}" if method == "POST" else None
            with pytest.raises(tornado.httpclient.HTTPClientError) as err:
                fetch(path, method=method, body=body, headers={"Authorization": ""},
                      follow_redirects=False)  # fmt: skip
            assert err.value.code in (403, 302), (method, path, err.value.code)
        if "get" not in cls.__dict__:
            continue
        # and answers the same URL when the token is given (a job that is not there: 400)
        try:
            code = fetch(path).code
        except tornado.httpclient.HTTPClientError as e:
            code = e.code
        assert code == (400 if "jobs/" in path else 200), path


def test_every_handler_method_is_authenticated():
    for _, cls in handlers.routes():
        for verb in ("get", "post", "put", "patch", "delete"):
            method = cls.__dict__.get(verb)
            if method is not None:
                assert getattr(method, "__wrapped__", None) is not None, (cls, verb)


def test_status_shape(fetch):
    body = settled_status(fetch)
    assert COMMON <= set(body)
    assert {"timestamp", "gpus", "summary", "sampler"} <= set(body)
    assert body["reason"] in REASONS
    assert set(body["summary"]) == {"count", "utilization", "memory_used", "memory_total"}
    assert body["summary"]["count"] == len(body["gpus"])
    for gpu in body["gpus"]:
        assert GPU_FIELDS <= set(gpu)
        assert re.match(r"^(GPU|MIG)-", gpu["uuid"])


def test_no_gpu_is_said_in_words(fetch):
    if has_driver():
        pytest.skip("this machine has an NVIDIA driver; the no-GPU path is tested on CI")
    body = settled_status(fetch)
    assert body["available"] is False
    assert body["reason"] == "no_driver"
    assert "NVIDIA driver" in body["message"]
    assert body["gpus"] == []
    assert body["summary"] == {
        "count": 0, "utilization": None, "memory_used": None, "memory_total": None,
    }  # fmt: skip
    assert body["stale"] is False and body["error"] is None and body["last_ok"] > 0
    procs = get_json(fetch, "gpu/processes")
    assert procs == {"available": False, "stale": False, "error": None, "timestamp": None,
                     "processes": [], "other": []}  # fmt: skip
    hist = get_json(fetch, "gpu/history")
    assert hist["timestamps"] == [] and hist["gpus"] == {}
    assert hist["reason"] == "no_driver"


@pytest.fixture
def no_gpu_allocated(monkeypatch):
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")


def test_none_allocated_to_this_container(no_gpu_allocated, fetch):
    body = settled_status(fetch)
    assert body["available"] is False
    assert body["reason"] == "none_allocated"
    assert "NVIDIA_VISIBLE_DEVICES='void'" in body["message"]
    assert body["hint"] == "Start it again with a GPU (Docker: --gpus all)."
    assert diagnosis.why_no_gpu().as_dict() == {k: body[k] for k in ("reason", "message", "hint")}


@pytest.fixture
def gpulab_host_without_gpus(monkeypatch):
    """A project container as gpulab starts it on a host where it found no GPU: the base
    image says so, and the spawner gives the container none."""
    monkeypatch.setenv("GPULAB_HOST_GPUS", "")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")


def test_a_host_without_gpus_is_not_told_to_ask_for_one(gpulab_host_without_gpus, fetch):
    body = settled_status(fetch)
    assert body["reason"] == "no_driver"
    assert body["message"].startswith("This host has no NVIDIA driver")
    assert "ask for a GPU" not in body["hint"] and "GPUs for this project" not in body["hint"]
    assert body["hint"].startswith("Your code runs on the CPU.")
    # %gpu_info's diagnosis is the same one.
    assert diagnosis.why_no_gpu().as_dict() == {k: body[k] for k in ("reason", "message", "hint")}


@pytest.fixture
def started_without_a_gpu_on_a_gpu_host(monkeypatch):
    monkeypatch.setenv("GPULAB_HOST_GPUS", "NVIDIA A10")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")


def test_a_project_started_without_a_gpu_on_a_gpu_host_is_told_to_ask(
    started_without_a_gpu_on_a_gpu_host, fetch
):
    body = settled_status(fetch)
    assert body["reason"] == "none_allocated"
    assert body["message"] == (
        "This project was started without a GPU. This host has GPUs (NVIDIA A10)."
    )
    assert "GPUs for this project" in body["hint"]


@pytest.fixture
def given_a_gpu_on_a_gpu_host(monkeypatch):
    monkeypatch.setenv("GPULAB_HOST_GPUS", "NVIDIA A10")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-5c3e9a04-8f2b-4c1d-9e6a-1b2c3d4e5f60")


def test_a_project_given_a_gpu_whose_driver_is_missing(given_a_gpu_on_a_gpu_host, fetch):
    if has_driver():
        pytest.skip("this machine has an NVIDIA driver: NVML loads here")
    body = settled_status(fetch)
    assert body["reason"] == "nvml_error"
    assert "given a GPU, but the NVIDIA driver's library" in body["message"]
    assert "gpulab doctor" in body["hint"]


def test_history_shape_and_since(fetch):
    settled_status(fetch)
    time.sleep(1.2)  # a few ticks at 0.5 s
    hist = get_json(fetch, "gpu/history")
    assert COMMON <= set(hist) and {"timestamps", "gpus", "history_seconds"} <= set(hist)
    for series in hist["gpus"].values():
        assert set(series) == {"utilization", "memory_used", "temperature", "power_draw"}
        assert all(len(v) == len(hist["timestamps"]) for v in series.values())
    assert hist["timestamps"] == sorted(hist["timestamps"])
    since = hist["timestamps"][-1] if hist["timestamps"] else 1e12
    newer = get_json(fetch, "gpu/history", since=since)
    assert all(t > since for t in newer["timestamps"])


def test_processes_shape_with_a_running_kernel(fetch):
    r = fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "gpu-test.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    ))  # fmt: skip
    assert r.code == 201
    procs = get_json(fetch, "gpu/processes")
    assert set(procs) == PROCESSES
    for row in procs["processes"]:
        assert {"pid", "name", "command", "kernel", "gpus"} <= set(row)
        assert "ancestors" not in row and "kernel_id" not in row
        for g in row["gpus"]:
            assert set(g) == {"uuid", "index", "memory_used", "match"}
    for other in procs["other"]:
        assert set(other) == {"uuid", "index", "count", "memory_used"}


def test_requested_interval_is_clamped_by_the_server(fetch):
    get_json(fetch, "gpu", interval="0.01")
    time.sleep(0.6)
    body = get_json(fetch, "gpu", interval="0.01")
    assert body["interval"] == body["min_interval"] == 0.2
    slow = get_json(fetch, "gpu", interval="30")
    assert slow["interval"] <= 0.5  # a slow client never slows the sampler down


def test_bad_numbers_are_a_400(fetch):
    for route, param in (("gpu", "interval"), ("gpu/history", "since")):
        with pytest.raises(tornado.httpclient.HTTPClientError) as err:
            fetch(API_PREFIX, route, params={param: "soon"})
        assert err.value.code == 400


def test_info_route_still_answers(fetch):
    body = get_json(fetch, "info")
    assert set(body) == {"version", "project", "display_name", "owner", "workspace", "image",
                         "image_state", "refusal"}  # fmt: skip
    assert body["display_name"] == ""  # outside gpulab: no project to name
    # Outside gpulab: the image is what it is, and no one is refused in a role's words.
    assert body["image_state"] == {"state": "latest", "note": "", "build_log_url": ""}
    assert body["refusal"] == ""


def test_project_info_names_the_project_in_one_bounded_line():
    from gpulab_jupyter.handlers import project_info

    named = {"GPULAB_PROJECT": "alice-first", "GPULAB_PROJECT_DISPLAY_NAME": " Alice\n First "}
    assert project_info(named)["display_name"] == "Alice First"
    assert project_info({"GPULAB_PROJECT": "alice-first"})["display_name"] == "alice-first"
    long = {"GPULAB_PROJECT": "p", "GPULAB_PROJECT_DISPLAY_NAME": "x" * 500}
    assert project_info(long)["display_name"] == "x" * 100


@pytest.mark.parametrize(
    ("url", "passed"),
    [
        ("/hub/gpulab/build-log/dana/vision?build=7", True),
        ("/user/dana/vision/lab", True),
        ("//evil.example/x", False),
        ("https://evil.example/x", False),
        ("javascript:alert(1)", False),
        ("/hub/a b", False),
        ('/hub/x"onmouseover="alert(1)', False),
    ],
)
def test_image_state_passes_only_hub_paths(url, passed):
    env = {"GPULAB_IMAGE_STATE": "last-good", "GPULAB_BUILD_LOG_URL": url,
           "GPULAB_IMAGE_NOTE": "Running the last image\nthat built. " + "x" * 400}  # fmt: skip
    state = handlers.image_state(env)
    assert state["build_log_url"] == (url if passed else "")
    assert state["state"] == "last-good"
    assert "\n" not in state["note"] and len(state["note"]) == environment.NOTE_MAX
    assert handlers.image_state({"GPULAB_IMAGE_STATE": "broken"})["state"] == "latest"


def test_docs_describe_every_route_and_setting():
    from pathlib import Path

    from gpulab_jupyter.sampler import GPUSampler

    docs = Path(__file__).resolve().parents[1] / "docs"
    doc = (docs / "gpu-status-api.md").read_text()
    jobs_doc = (docs / "jobs.md").read_text()
    for pattern, cls in handlers.routes():
        route = pattern.removeprefix(API_PREFIX + "/")
        if route.startswith(("jobs", "activity")):  # docs/jobs.md, with <id> and each action
            route = route.replace(f"({JOB_ID.pattern})", "<id>")
            for method in ("get", "post"):
                if method in cls.__dict__:
                    for one in route.removesuffix(")").split("/(")[-1].split("|"):
                        shown = route.split("/(")[0] + ("/" + one if "/(" in route else "")
                        assert f"`{method.upper()} {shown}" in jobs_doc, (method, route)
            continue
        assert f"`GET {route}`" in doc, pattern
    for name in GPUSampler.class_own_traits(config=True):
        assert f"c.GPUSampler.{name}" in doc, name


# -- the sampler under errors -----------------------------------------------------------------
class FailingReader(NvmlReader):
    """The sampler's real NVML reader, made to raise ``failure`` while it is set."""

    def __init__(self):
        super().__init__()
        self.failure: BaseException | None = None
        self.calls = 0

    def open(self):
        self.calls += 1
        if self.failure is not None:
            raise self.failure
        return super().open()

    def read_fast(self, device):
        if self.failure is not None:
            raise self.failure
        return super().read_fast(device)


@pytest.fixture
def failing(jp_serverapp, monkeypatch):
    """A sampler on a FailingReader in the server's place (the handlers ask for it per
    request); yields (sampler, reader), stopped afterwards."""
    reader = FailingReader()
    sampler = GPUSampler(
        reader=reader, interval=0.2, min_interval=0.1, process_interval=0.5, max_backoff=0.8
    )
    monkeypatch.setitem(jp_serverapp.web_app.settings, "gpulab_sampler", sampler)
    yield sampler, reader
    sampler.stop()


def wait_for(fetch, route, check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        body = get_json(fetch, route)
        if check(body):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def test_sampler_survives_errors_says_stale_backs_off_and_recovers(failing, fetch, caplog):
    sampler, reader = failing
    caplog.set_level(logging.INFO)
    reader.failure = RuntimeError("the reader broke")
    sampler.start()
    body = wait_for(fetch, "gpu", lambda b: b["sampler"]["failures"] >= 4)
    assert sampler.alive()
    assert body["stale"] is True and body["available"] is False
    assert body["error"] == "RuntimeError: the reader broke"
    assert body["reason"] == "sampler_error" and "the reader broke" in body["message"]
    assert body["last_ok"] is None and body["error_since"] <= time.time()
    assert body["gpus"] == [] and body["summary"]["count"] == 0
    # three failures in a row, then it waits twice as long each time, up to max_backoff
    assert body["sampler"]["backoff"] > sampler.interval
    assert body["sampler"]["errors"] >= 4
    calls = reader.calls
    time.sleep(1.6)
    assert reader.calls - calls <= 3, "no backoff: 0.2 s would be 8 tries"
    procs = get_json(fetch, "gpu/processes")
    assert procs["stale"] is True and procs["error"] == "RuntimeError: the reader broke"
    hist = get_json(fetch, "gpu/history")
    assert hist["stale"] is True and hist["error"] == body["error"]
    # logged in full (with its traceback) once, however often it happens
    full = [r for r in caplog.records if r.exc_info and "the reader broke" in r.getMessage()]
    assert len(full) == 1, [r.getMessage() for r in caplog.records]

    # another error, of a kind the sampler expects: reported in its place
    reader.failure = OSError(5, "Input/output error")
    body = wait_for(fetch, "gpu", lambda b: b["error"].startswith("OSError"), timeout=5)
    assert body["stale"] is True and "Input/output error" in body["error"]

    # the error clears: current again, at the normal pace
    reader.failure = None
    body = wait_for(fetch, "gpu", lambda b: not b["stale"], timeout=5)
    assert sampler.alive()
    assert body["error"] is None and body["error_since"] is None
    assert body["last_ok"] >= body["timestamp"] - 1
    assert body["sampler"]["failures"] == 0 and body["sampler"]["backoff"] is None
    assert body["reason"] in REASONS - {"sampler_error", "starting"}
    if not has_driver():
        assert body["reason"] == "no_driver" and body["available"] is False
    assert any("sampling again after" in r.getMessage() for r in caplog.records)


def test_a_sampler_thread_that_ends_is_answered_as_stale(failing, fetch, monkeypatch):
    sampler, reader = failing

    class Fatal(BaseException):
        """Not an Exception: the sampler's guard lets it through and the thread ends."""

    ended = []
    monkeypatch.setattr(threading, "excepthook", ended.append)
    reader.failure = Fatal("the end")
    sampler.start()
    sampler._thread.join(5)
    assert not sampler.alive() and ended and ended[0].exc_type is Fatal
    body = get_json(fetch, "gpu")
    assert body["stale"] is True
    assert body["error"] == "The GPU sampler stopped: Fatal: the end"
    for route in ("gpu/history", "gpu/processes"):
        other = get_json(fetch, route)
        assert other["stale"] is True and other["error"] == body["error"], route


def test_failed_reads_of_a_real_gpu_keep_its_last_numbers_as_stale(failing, fetch):
    if not has_driver():
        pytest.skip("needs an NVIDIA GPU: the failures here are of reads of a real one")
    sampler, reader = failing
    sampler.start()
    good = wait_for(fetch, "gpu", lambda b: b["available"] and b["sampler"]["ticks"] >= 2)
    reader.failure = RuntimeError("read failed")
    body = wait_for(fetch, "gpu", lambda b: b["stale"])
    assert body["available"] is True and body["error"] == "RuntimeError: read failed"
    assert len(body["gpus"]) == len(good["gpus"])
    assert body["timestamp"] <= body["error_since"]  # the numbers are from before the error
    reader.failure = None
    body = wait_for(fetch, "gpu", lambda b: not b["stale"], timeout=5)
    assert body["timestamp"] > good["timestamp"]

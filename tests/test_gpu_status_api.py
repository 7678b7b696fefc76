"""The GPU status routes of gpulab-jupyter, against a real Jupyter server (pytest-jupyter).

On a machine without an NVIDIA driver (CI) these test the no-GPU path for real:
nothing fakes NVML. Every route is enumerated from what the extension
registers, and each one must refuse an anonymous request. The tests are plain
functions that run requests on pytest-jupyter's own event loop (the suite's
pytest-asyncio would otherwise run them on another one).
"""

import json
import re
import time

import pytest
import tornado.httpclient

# pytest-jupyter's fixtures for this module only: as `pytest_plugins` they would apply
# (with an autouse event-loop fixture) to every later test of the suite.
from pytest_jupyter.jupyter_server import *  # noqa: F403

from gpulab_jupyter import handlers
from gpulab_jupyter.handlers import API_PREFIX

REASONS = {"no_driver", "none_allocated", "nvml_error", "starting", None}
COMMON = {"available", "reason", "message", "interval", "min_interval", "process_interval"}
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
    for pattern, _cls in routes:
        path = pattern[len(jp_base_url) :] if pattern.startswith(jp_base_url) else pattern
        with pytest.raises(tornado.httpclient.HTTPClientError) as err:
            fetch(path, headers={"Authorization": ""}, follow_redirects=False)
        assert err.value.code in (403, 302), (path, err.value.code)
        # and answers the same URL when the token is given
        r = fetch(path)
        assert r.code == 200, path


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
    procs = get_json(fetch, "gpu/processes")
    assert procs == {"available": False, "timestamp": None, "processes": [], "other": []}
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
    assert set(procs) == {"available", "timestamp", "processes", "other"}
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
    assert set(body) == {"version", "project", "owner", "workspace", "image"}


def test_docs_describe_every_route_and_setting():
    from pathlib import Path

    from gpulab_jupyter.sampler import GPUSampler

    doc = (Path(__file__).resolve().parents[1] / "docs" / "gpu-status-api.md").read_text()
    for pattern, _ in handlers.routes():
        assert f"`GET {pattern.removeprefix(API_PREFIX + '/')}`" in doc, pattern
    for name in GPUSampler.class_own_traits(config=True):
        assert f"c.GPUSampler.{name}" in doc, name

"""The anchor's way, for comparison: NVML read on the server's event loop.

jupyterlab-nvdashboard initialises NVML when its module is imported, and each
open chart (a websocket per chart and tab) runs a tornado PeriodicCallback
that calls NVML on the event loop, every 100 ms at its fastest setting. This
module does the same for ``ANCHOR_DASHBOARDS`` open dashboards (default 1) of
three charts (GPU utilization, GPU memory, and the resource timeline:
utilization, memory and PCIe TX/RX per GPU), and adds a poll route,
``/api/anchor/gpu``, that reads NVML inside the request handler.

Loaded only by benchmarks/gpu_status.py on a GPU host, as the server extension
``nvdashboard_anchor`` (``PYTHONPATH=benchmarks``). Not part of gpulab.
"""

import json
import os
import time

import pynvml
import tornado.ioloop
import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

TICK_MS = 100
STATS = {"calls": 0, "seconds": 0.0}


def utilization(handles):
    return [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]


def memory(handles):
    return [pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]


def resources(handles):
    out = []
    for h in handles:
        row = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu, pynvml.nvmlDeviceGetMemoryInfo(h).used]
        try:
            row += [
                pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
                pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
            ]
        except pynvml.NVMLError_NotSupported:
            pass
        out.append(row)
    return out


CHARTS = (utilization, memory, resources)


def timed(chart, handles):
    t0 = time.perf_counter()
    chart(handles)
    STATS["calls"] += 1
    STATS["seconds"] += time.perf_counter() - t0


class AnchorHandler(APIHandler):
    @tornado.web.authenticated
    def get(self):
        handles = self.settings["anchor_handles"]
        body = {"utilization": utilization(handles), "memory_used": memory(handles)}
        body["chart_calls"] = STATS["calls"]
        body["chart_us"] = round(STATS["seconds"] / max(1, STATS["calls"]) * 1e6, 1)
        self.finish(json.dumps(body))


def _jupyter_server_extension_points():
    return [{"module": "nvdashboard_anchor"}]


def _load_jupyter_server_extension(serverapp):
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    web_app = serverapp.web_app
    web_app.settings["anchor_handles"] = handles
    for _ in range(int(os.environ.get("ANCHOR_DASHBOARDS", "1"))):
        for chart in CHARTS:
            cb = tornado.ioloop.PeriodicCallback(lambda c=chart: timed(c, handles), TICK_MS)
            cb.start()
    route = url_path_join(web_app.settings["base_url"], "api/anchor/gpu")
    web_app.add_handlers(".*$", [(route, AnchorHandler)])

"""Idle projects stop by themselves: JupyterHub's own idle culler
(``jupyterhub-idle-culler``) as a service the hub starts and stops.

The culler stops a project whose server reported no activity for
``GPULAB_IDLE_TIMEOUT`` seconds, which frees its GPUs at once (the spawner's stop
releases them). What counts as activity is the server's: browsers, kernels,
terminals, and gpulab's additions in the project (``gpulab_jupyter/activity.py``):
a running job, a GPU busy in the last minute. So a training run with no browser
open is never stopped. The project is stopped, never deleted (the culler's
``--remove-named-servers`` stays off), and users are never culled.
"""

from __future__ import annotations

import sys

from gpulab_contract import environment

SERVICE = "gpulab-idle-culler"
SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]


def intervals(timeout_s: int) -> dict[str, int]:
    """How often the culler looks, and how often servers report their activity:
    both well under the timeout, so a project is stopped within about
    ``timeout + every`` of its last activity, never before ``timeout``. (The culler
    looks every 2 s at most often: each look is one list of users from the hub.)"""
    every = max(2, min(300, timeout_s // 4))
    return {"cull_every": every, "activity_interval": every, "reporter_every": max(2, every // 2)}


def configure(c, timeout_s: int) -> None:
    """The culler service and its role (``timeout_s`` 0: no culling), and what each
    project server needs to know (the timeout, for the notice in JupyterLab)."""
    env = dict(c.Spawner.environment) if "environment" in c.Spawner else {}
    env.update(environment.build(idle_timeout_s=timeout_s))
    if not timeout_s:
        c.Spawner.environment = env
        return
    every = intervals(timeout_s)
    env["JUPYTERHUB_ACTIVITY_INTERVAL"] = str(every["activity_interval"])
    c.Spawner.environment = env
    c.JupyterHub.services = [
        *(c.JupyterHub.services if "services" in c.JupyterHub else []),
        {
            "name": SERVICE,
            "command": [
                sys.executable, "-m", "gpulab_hub.culling",
                f"--timeout={timeout_s}", f"--cull-every={every['cull_every']}",
                "--cull-users=false", "--remove-named-servers=false",
            ],
        },
    ]  # fmt: skip
    c.JupyterHub.load_roles = [
        *(c.JupyterHub.load_roles if "load_roles" in c.JupyterHub else []),
        {"name": SERVICE, "scopes": SCOPES, "services": [SERVICE]},
    ]
    args = list(c.Spawner.args) if "args" in c.Spawner else []
    c.Spawner.args = [*args, f"--ActivityReporter.every_s={every['reporter_every']}"]


def main() -> None:
    """The service's command: jupyterhub-idle-culler, made to stop at the hub's first
    signal. A process started with SIGINT ignored (the hub's services inherit that
    from a hub started in the background) keeps ignoring it, and JupyterHub waits 30 s
    before its SIGTERM: every hub stop would take that long."""
    import signal

    from jupyterhub_idle_culler import main as culler_main

    signal.signal(signal.SIGINT, signal.default_int_handler)
    culler_main()


if __name__ == "__main__":
    main()

"""``python -m gpulab_hub.ssh``: the SSH gateway, as the hub's service ``gpulab-ssh``.

JupyterHub starts it with its API token and URL; the rest of its settings come from
ssh/__init__.py's service_env (see gateway.Settings). It stops at SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys


def main() -> int:
    from gpulab_hub import host
    from gpulab_hub.ssh import gateway, hostkey

    try:
        settings = gateway.Settings.from_env(os.environ)
    except ValueError as e:
        print(f"gpulab-ssh: {e}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await gateway.serve(settings, stop, lambda: host.docker_client(timeout=60))

    try:
        asyncio.run(run())
    except (hostkey.HostKeyError, OSError) as e:
        print(f"gpulab-ssh: the SSH gateway cannot start: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

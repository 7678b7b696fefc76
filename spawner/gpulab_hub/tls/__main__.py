"""The hub's TLS service: writes the Caddyfile from the hub's settings, then becomes
Caddy (``caddy run``), so the hub stops it as it stops its other services."""

from __future__ import annotations

import os

from gpulab_hub import settings, tls


def main() -> None:
    s = settings.of_service(os.environ)
    for d in (tls.data_dir(s), tls.data_dir(s) / "data", tls.data_dir(s) / "config"):
        d.mkdir(mode=0o700, exist_ok=True)
    path = tls.caddyfile(s)
    tmp = path.with_name(path.name + ".new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(tls.render(s))
    tmp.replace(path)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **tls.caddy_env(s)}
    args = [tls.CADDY, "run", "--config", str(path), "--adapter", "caddyfile"]
    os.execve(tls.CADDY, args, env)


if __name__ == "__main__":
    main()

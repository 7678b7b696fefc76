# gpulab hub image, for compose.yml: JupyterHub + gpulab's hub side + the proxy.
# Build from the repository root: docker build -f images/hub.Dockerfile -t gpulab/hub .
ARG BASE=python:3.12-slim-bookworm
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm ca-certificates iptables \
 && rm -rf /var/lib/apt/lists/* \
 && npm install -g --no-fund --no-audit configurable-http-proxy@4 \
 && npm cache clean --force

WORKDIR /srv/gpulab/app
COPY contract/ contract/
COPY spawner/ spawner/
COPY extensions/ extensions/
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
gpulab_hub.ssh.keys, gpulab_hub.ssh.web, gpulab_hub.ssh.hubapi, gpulab_hub.home.web, gpulab_hub.cli"

# 8000: the proxy (browsers); 2222: the SSH gateway into projects (GPULAB_SSH_PORT).
EXPOSE 8000 2222
# Makes sure the base image for projects exists, then runs the hub in the foreground.
CMD ["gpulab", "up", "--foreground"]

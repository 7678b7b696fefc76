# gpulab base image (CPU only): rendered by gpulab from images/base-cpu.Dockerfile.j2; do not edit.
# Project images start FROM it; their managed block adds packages on top.
FROM gpulab/debian:bookworm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
USER 0

# Python for the notebook environment (CUDA images come without it).
# hadolint ignore=DL3008
RUN if ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# Debian's SFTP server: gpulab's SSH gateway runs it as the notebook user for sftp and
# scp (OpenSSH 9's scp copies over SFTP) into the project (docs/remote.md).
# hadolint ignore=DL3008
RUN if [ ! -x /usr/lib/openssh/sftp-server ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends openssh-sftp-server \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && test -x /usr/lib/openssh/sftp-server

# Extra CA certificates from the host's trust store, so pip works behind a
# TLS-intercepting proxy (corporate networks).
COPY ca-certificates/ /usr/local/share/ca-certificates/gpulab/
RUN update-ca-certificates

# nvidia-smi, which Colab users type first: the driver's own where the project has a
# GPU (the stand-in finds it and runs it), else plain words on why this project has
# none and how to start it with one, exit status 9 (images/nvidia-smi.sh, docs/gpus.md).
COPY nvidia-smi.sh /usr/local/bin/nvidia-smi
RUN chmod 0755 /usr/local/bin/nvidia-smi
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    VIRTUAL_ENV=/opt/gpulab/venv \
    PATH=/opt/gpulab/venv/bin:$PATH \
    SHELL=/bin/bash \
    HF_HOME=/cache/huggingface
# The GPUs gpulab found on its host ("" for none): the GPU panel and %gpu_info tell
# "this host has no GPU" from "this project was started without one"
# (gpulab_jupyter/diagnosis.py).
ENV GPULAB_HOST_GPUS=""

# Login shells (JupyterLab's terminals, docker exec bash -l, SSH) read /etc/profile,
# which sets PATH afresh: this puts the notebook's Python environment first again,
# so python, pip and what %gpu_install added are the notebook's in a terminal too.
# (Single quotes: the file expands $PATH when a shell reads it.)
# hadolint ignore=SC2016
RUN printf '%s\n' \
      '# gpulab: the project environment first on PATH, as in notebooks.' \
      'export VIRTUAL_ENV=/opt/gpulab/venv' \
      'export PATH="$VIRTUAL_ENV/bin:$PATH"' \
      > /etc/profile.d/gpulab-env.sh

# A non-root notebook user who owns the Python environment, so installs from a
# notebook need no root (a root-owned venv fails with "Permission denied").
# (Ubuntu-based CUDA images already have uid 1000, "ubuntu": it is renamed.)
RUN if existing=$(id -nu 1000 2>/dev/null); then \
      usermod --login jovyan --home /home/jovyan --move-home --gid 100 "$existing"; \
    else \
      useradd --create-home --uid 1000 --gid 100 --shell /bin/bash jovyan; \
    fi \
 && mkdir -p /opt/gpulab /workspace /cache/huggingface /data \
 && chown jovyan:100 /opt/gpulab /workspace /cache/huggingface
COPY --chown=1000:100 wheels/ /opt/gpulab/wheels/
USER 1000:100

# Every dependency is installed and verified in the same RUN. jupyter-collaboration
# makes edits live for everyone in a shared project (gpulab keeps it read-only for
# viewers: gpulab_jupyter/collab.py). jupyter-server-proxy serves TensorBoard inside
# JupyterLab (only to those who may run code: gpulab_jupyter/authorizer.py).
# rfc3987-syntax (jsonschema's optional IRI format checks, pulled in by jupyter-events)
# builds a grammar parser each time a Jupyter server starts: about 2 s of every project
# start on a small host, for checks no Jupyter event schema uses. It is left out.
RUN python3 -m venv /opt/gpulab/venv \
 && pip install --no-cache-dir jupyterhub==6.1.1 jupyterlab==4.6.6 \
      jupyter-collaboration==5.0.4 jupyter-server-nbmodel==0.2.9 jupyter-server-proxy==4.6.0 tensorboard==2.21.0 \
      /opt/gpulab/wheels/gpulab_contract-0.1.0-py3-none-any.whl \
      /opt/gpulab/wheels/gpulab_jupyter-0.1.0-py3-none-any.whl \
 && pip uninstall -y rfc3987-syntax \
 && python -c "import jupyterhub, jupyterlab, jupyter_server_ydoc, jupyter_server_nbmodel, jupyter_server_proxy, tensorboard, gpulab_contract, gpulab_jupyter"

# IPython kernels load gpulab's magics (%gpu_install, %gpu_info, %gpu_diff) by themselves.
# The Jupyter server's settings (jupyter_server_config.json: jupyter_server_config.d only
# enables extensions): JupyterLab's terminals run a login bash (the environment above, a
# prompt, history); the proxy reaches this container's own ports only (host_allowlist).
# The launcher's TensorBoard tile (with its icon) comes from gpulab_jupyter itself
# (gpulab_jupyter/tensorboard.py, a jupyter-server-proxy entry point).
RUN mkdir -p /opt/gpulab/venv/etc/ipython /opt/gpulab/venv/etc/jupyter \
 && echo "c.InteractiveShellApp.extensions.append('gpulab_jupyter.magics')" \
    > /opt/gpulab/venv/etc/ipython/ipython_kernel_config.py \
 && echo '{"ServerApp": {"terminado_settings": {"shell_command": ["/bin/bash", "-l"]}},' \
      '"ServerProxy": {"host_allowlist": ["localhost", "127.0.0.1"]}}' \
    > /opt/gpulab/venv/etc/jupyter/jupyter_server_config.json \
 && python -c "import json; json.load(open('/opt/gpulab/venv/etc/jupyter/jupyter_server_config.json'))"

# JupyterLab asks nobody about Jupyter's news and checks for no updates: no prompt in
# front of the user's work, no request from the project to the internet.
RUN mkdir -p /opt/gpulab/venv/share/jupyter/lab/settings \
 && echo '{"@jupyterlab/apputils-extension:notification":' \
      '{"checkForUpdates": false, "fetchNews": "false"}}' \
    > /opt/gpulab/venv/share/jupyter/lab/settings/overrides.json \
 && python -c "import json; json.load(open('/opt/gpulab/venv/share/jupyter/lab/settings/overrides.json'))"

WORKDIR /workspace
EXPOSE 8888
CMD ["jupyterhub-singleuser"]

# gpulab's database server for compose.yml: Debian's PostgreSQL, holding JupyterHub's
# tables and gpulab's (GPULAB_DB_URL). It has no network (compose.yml: network_mode
# none): the hub reaches it over its socket, in a volume only the two share.
# Build from the repository root: docker build -f images/db.Dockerfile -t gpulab/db .
ARG BASE=debian:bookworm-slim
FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres -m 0700 /var/lib/gpulab-db \
 && install -d -o postgres -g postgres -m 0755 /run/gpulab-db
# (executable in the checkout: the classic builder has no COPY --chmod)
COPY images/db-start.sh /usr/local/bin/gpulab-db-start
# The account Debian's package made (its uid is the package's choice, so by name).
# hadolint ignore=DL3066
USER postgres
ENV PGDATA=/var/lib/gpulab-db/data
HEALTHCHECK --interval=2s --timeout=5s --retries=90 \
  CMD ["pg_isready", "-q", "-h", "/run/gpulab-db", "-d", "gpulab", "-U", "gpulab"]
CMD ["gpulab-db-start"]

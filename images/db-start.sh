#!/bin/bash
# gpulab's database server (images/db.Dockerfile): the cluster made on the first start
# (the role and database "gpulab"), then PostgreSQL in the foreground, on its socket in
# /run/gpulab-db only (no TCP). Who reaches the socket is the hub alone (compose.yml),
# so local connections are trusted.
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  echo "gpulab-db: making the database cluster in $PGDATA (first start)"
  "$bin/initdb" -D "$PGDATA" -U gpulab -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=reject >/dev/null
  echo "CREATE DATABASE gpulab OWNER gpulab;" \
    | "$bin/postgres" --single -D "$PGDATA" -j postgres >/dev/null
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses= -c unix_socket_directories=/run/gpulab-db

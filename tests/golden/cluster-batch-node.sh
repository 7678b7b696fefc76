#!/bin/bash
# gpulab: project container gpulab-alice--vision on Slurm cluster lab.
# Rendered by gpulab_hub.cluster.batch (docs/cluster.md); stopping the job stops
# and removes the container (the trap below; the cluster's Epilog if killed).
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
docker=docker
job=${SLURM_JOB_ID:-}
if [[ ! $job =~ ^[0-9]+$ ]]; then
  echo "gpulab: this script runs as a Slurm batch job (no SLURM_JOB_ID)" >&2; exit 2
fi
node=${SLURMD_NODENAME:-}
if [[ ! $node =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ ]]; then
  echo "gpulab: this job runs on no node gpulab can name (SLURMD_NODENAME)" >&2; exit 1
fi
export DOCKER_HOST=unix:///run/gpulab-nodes/"$node"/docker.sock
gpulab_remove() {
  "$docker" ps -aq --filter label=gpulab.slurm.cluster=lab --filter "label=gpulab.slurm.job=$job" \
    | xargs -r "$docker" rm -f >/dev/null 2>&1 || true
}
trap 'exit 143' TERM
trap 'exit 130' INT
trap gpulab_remove EXIT
gpu_opts=()
case "$node" in
  gpu-01) node_addr=10.0.0.11 ;;
  gpu-02) node_addr=10.0.0.12 ;;
  *) echo "gpulab: node $node has no cluster address in gpulab's list; ask the administrator (docs/cluster.md)" >&2; exit 1 ;;
esac
net=gpulab-net
if ! "$docker" network inspect "$net" >/dev/null 2>&1; then
  "$docker" network create --driver bridge --opt com.docker.network.bridge.enable_icc=false --label gpulab.network=projects "$net" >/dev/null 2>&1 || true
fi
have=$("$docker" network inspect --format '{{.Driver}} {{index .Options "com.docker.network.bridge.enable_icc"}}' "$net" 2>/dev/null || true)
if [ "$have" != 'bridge false' ]; then
  if [ -z "$have" ]; then
    echo "gpulab: the Docker engine of node $node does not answer or cannot make the project network $net; ask the administrator (docs/cluster.md)" >&2
  else
    echo "gpulab: the network $net on node $node is not gpulab's (a bridge with traffic between containers off); ask the administrator to remove it" >&2
  fi
  exit 1
fi
echo "gpulab-progress: Fetching the project's image on node $node"
if ! pulled=$("$docker" --config /etc/gpulab/docker pull -q 10.0.0.1:5001/gpulab/project@sha256:abababababababababababababababababababababababababababababababab 2>&1); then
  echo "gpulab: node $node could not fetch the project's image from the cluster's registry: $(printf '%s\n' "$pulled" | tail -n 1 | cut -c1-300)" >&2
  exit 1
fi
echo "gpulab-progress: Starting the project's container on node $node"
out=$(mktemp)  # the container's output: never in the job's log
trap 'gpulab_remove; rm -f -- "$out"' EXIT
"$docker" run --rm --env-file /dev/stdin \
  --name gpulab-alice--vision \
  --label gpulab.instance=gpulab \
  --label gpulab.owner=alice \
  --label gpulab.project=vision \
  --label gpulab.slurm.cluster=lab \
  --hostname vision \
  --user 1000:100 \
  --workdir /workspace \
  --expose 8888/tcp \
  --network gpulab-net \
  --mount type=bind,source=/srv/gpulab/projects/alice/vision,target=/workspace \
  --mount type=bind,source=/srv/gpulab/data/datasets,target=/data/datasets,readonly \
  --mount type=bind,source=/srv/gpulab/data/projects/alice/vision/models,target=/data/models \
  --mount type=bind,source=/srv/gpulab/data/projects/alice/vision/outputs,target=/data/outputs \
  --mount type=bind,source=/srv/gpulab/data/projects/alice/vision/huggingface,target=/cache/huggingface \
  --shm-size 8g \
  --cap-drop ALL \
  --security-opt no-new-privileges \
  --pids-limit 4096 \
  --memory 8589934592 \
  --cpu-period 100000 \
  --cpu-quota 200000 \
  --label "gpulab.slurm.job=$job" \
  -p "$node_addr::8888" \
  "${gpu_opts[@]}" \
  10.0.0.1:5001/gpulab/project@sha256:abababababababababababababababababababababababababababababababab jupyterhub-singleuser --notebook-dir=/workspace <<'GPULAB_ENV' >"$out" 2>&1 &
JUPYTERHUB_API_TOKEN=t0k3n-$(touch /tmp/gpulab-pwned)-'quoted'
JUPYTERHUB_SERVICE_URL=http://0.0.0.0:8888/
GPULAB_WORKSPACE=/workspace
GPULAB_PROJECT_DIR=/workspace
GPULAB_DATA=/data
HF_HOME=/cache/huggingface
HF_TOKEN_PATH=/tmp/gpulab-huggingface/token
NVIDIA_VISIBLE_DEVICES=void
CUDA_VISIBLE_DEVICES=
GPULAB_ENV
run_pid=$!
hostport=
for ((i = 0; i < 600; i++)); do
  if ! kill -0 "$run_pid" 2>/dev/null; then
    echo "gpulab: the project's container on node $node stopped before it was ready; its last lines:" >&2
    tail -n 15 -- "$out" | cut -c1-600 | sed 's/^/gpulab:   /' >&2
    exit 1
  fi
  while read -r line; do
    if [[ $line =~ ^([0-9.]+):([0-9]{1,5})$ ]] &&
      [ "${BASH_REMATCH[1]}" = "$node_addr" ]; then
      hostport=${BASH_REMATCH[2]}
    fi
  done < <("$docker" port gpulab-alice--vision 8888/tcp 2>/dev/null || true)
  if [ -n "$hostport" ]; then break; fi
  sleep 0.2
done
if [ -z "$hostport" ]; then
  echo "gpulab: Docker on node $node did not publish the project's port within 120 s" >&2
  exit 1
fi
echo "gpulab-ready $node_addr:$hostport"
wait "$run_pid"

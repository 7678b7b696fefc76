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
gpulab_remove() {
  "$docker" ps -aq --filter label=gpulab.slurm.cluster=lab --filter "label=gpulab.slurm.job=$job" \
    | xargs -r "$docker" rm -f >/dev/null 2>&1 || true
}
trap 'exit 143' TERM
trap 'exit 130' INT
trap gpulab_remove EXIT
gpu_opts=()
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
  "${gpu_opts[@]}" \
  gpulab/project:0123456789abcdef jupyterhub-singleuser --notebook-dir=/workspace <<'GPULAB_ENV' &
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
wait "$!"

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
case "${SLURMD_NODENAME:-}" in
  gpu-01) gres_files=(/dev/nvidia0 /dev/nvidia1) ;;
  gpu-02) gres_files=(/dev/nvidia3 /dev/nvidia2) ;;
  *) echo "gpulab: node ${SLURMD_NODENAME:-?} is not in gpulab's list of GPU nodes; ask the administrator (docs/cluster.md)" >&2; exit 1 ;;
esac
gpulab_uuid() {
  local f
  for f in /proc/driver/nvidia/gpus/*/information; do
    if [ -r "$f" ] && grep -Eq "^Device Minor:[[:space:]]*$1[[:space:]]*$" "$f"; then
      sed -n 's/^GPU UUID:[[:space:]]*//p' "$f" | head -n 1
      return 0
    fi
  done
  return 1
}
IFS=, read -r -a picked <<< "${SLURM_JOB_GPUS:-}"
if [ "${#picked[@]}" -ne 1 ]; then
  echo "gpulab: Slurm gave this job GPUs '${SLURM_JOB_GPUS:-}', not 1" >&2
  exit 1
fi
gpu_opts=()
uuids=()
for i in "${picked[@]}"; do
  if [[ ! $i =~ ^[0-9]+$ ]] || (( i >= ${#gres_files[@]} )); then
    echo "gpulab: GPU index $i is not in node $SLURMD_NODENAME's GRES list" >&2
    exit 1
  fi
  dev=${gres_files[i]}
  if [ ! -c "$dev" ]; then
    echo "gpulab: $dev (GPU index $i on $SLURMD_NODENAME) is not a device" >&2
    exit 1
  fi
  minor=$((16#$(stat -L -c %T -- "$dev")))
  uuid=$(gpulab_uuid "$minor" || true)
  if [[ ! $uuid =~ ^GPU-[0-9A-Za-z-]{1,80}$ ]]; then
    echo "gpulab: no NVIDIA GPU with minor number $minor ($dev) on $SLURMD_NODENAME" >&2
    exit 1
  fi
  uuids+=("$uuid")
  gpu_opts+=(--device "$dev:/dev/nvidia$minor:rwm")
done
ids=$(IFS=,; echo "${uuids[*]}")
gpu_opts+=(--device /dev/nvidiactl:/dev/nvidiactl:rwm --device /dev/nvidia-uvm:/dev/nvidia-uvm:rwm --device /dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rwm --mount type=bind,source=/usr/local/nvidia,target=/usr/local/nvidia,readonly)
gpu_opts+=(-e LD_LIBRARY_PATH=/usr/local/nvidia/lib64)
gpu_opts+=(-e "NVIDIA_VISIBLE_DEVICES=$ids" -e "CUDA_VISIBLE_DEVICES=$ids")
gpu_opts+=(-e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
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
GPULAB_ENV
wait "$!"

#!/bin/bash
# gpulab: multi-node job 20261123-141502-a1b2 of gpulab-alice--vision-job-20261123-141502-a1b2 on Slurm cluster lab:
# 2 nodes, 1 GPUs each; one srun task per node runs torchrun in the
# project's container. Rendered by gpulab_hub.cluster.multinode (docs/cluster.md);
# stopping the job removes its containers on every node (each task's trap; the
# cluster's Epilog if a task is killed).
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
job=${SLURM_JOB_ID:-}
if [[ ! $job =~ ^[0-9]+$ ]]; then
  echo "gpulab: this script runs as a Slurm batch job (no SLURM_JOB_ID)" >&2; exit 2
fi
echo "gpulab-progress: Starting on nodes $SLURM_JOB_NODELIST"
read -r -d '' task <<'GPULAB_TASK' || true
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
docker=docker
job=${SLURM_JOB_ID:-}
if [[ ! $job =~ ^[0-9]+$ ]]; then
  echo "gpulab: this task runs in a Slurm job (no SLURM_JOB_ID)" >&2; exit 2
fi
rank=${SLURM_NODEID:-}
if [[ ! $rank =~ ^(0|[1-9][0-9]{0,3})$ ]] || (( rank > 1 )); then
  echo "gpulab: this task has no node index of this job (SLURM_NODEID=$rank)" >&2; exit 1
fi
node=${SLURMD_NODENAME:-}
if [[ ! $node =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ ]]; then
  echo "gpulab: this task runs on no node gpulab can name (SLURMD_NODENAME)" >&2; exit 1
fi
export DOCKER_HOST=unix:///run/gpulab-nodes/"$node"/docker.sock
# In an srun task SLURM_JOB_GPUS is the first node's; the step's are this node's.
SLURM_JOB_GPUS=${SLURM_STEP_GPUS:-}
env_file=$(cat)
gpulab_remove() {
  "$docker" ps -aq --filter label=gpulab.slurm.cluster=lab --filter "label=gpulab.slurm.job=$job" \
    | xargs -r "$docker" rm -f >/dev/null 2>&1 || true
}
trap 'exit 143' TERM
trap 'exit 130' INT
trap gpulab_remove EXIT
case "${SLURMD_NODENAME:-}" in
  gpu-01) gres_files=(/dev/nvidia0) ;;
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
done
ids=$(IFS=,; echo "${uuids[*]}")
gpu_opts+=(--gpus "\"driver=nvidia\",\"device=$ids\",\"capabilities=compute,utility\"")
gpu_opts+=(-e "NVIDIA_VISIBLE_DEVICES=$ids" -e "CUDA_VISIBLE_DEVICES=$ids")
gpu_opts+=(-e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
addresses=(10.0.0.129 10.0.0.130)
address=${addresses[rank]}
jobnet=gpulab-jobnet
if ! "$docker" network inspect "$jobnet" >/dev/null 2>&1; then
  "$docker" network create --driver macvlan --subnet 10.0.0.0/24 --ip-range 10.0.0.128/30 --gateway 10.0.0.1 --opt parent=eth0 --label gpulab.network=jobs --label gpulab.slurm.cluster=lab "$jobnet" >/dev/null 2>&1 || true
fi
have=$("$docker" network inspect --format '{{.Driver}} {{index .Options "parent"}}{{range .IPAM.Config}} {{.Subnet}} {{.IPRange}} {{.Gateway}}{{end}}' "$jobnet" 2>/dev/null || true)
if [ "$have" != 'macvlan eth0 10.0.0.0/24 10.0.0.128/30 10.0.0.1' ]; then
  if [ -z "$have" ]; then
    echo "gpulab: node $node cannot make the job network $jobnet (macvlan on eth0); ask the administrator (docs/cluster.md)" >&2
  else
    echo "gpulab: the network $jobnet on node $node is not the job network gpulab makes (macvlan eth0 10.0.0.0/24 10.0.0.128/30 10.0.0.1); ask the administrator to remove it" >&2
  fi
  exit 1
fi
echo "gpulab-progress: Fetching the project's image on node $node"
if ! pulled=$("$docker" --config /etc/gpulab/docker pull -q 10.0.0.1:5001/gpulab/project@sha256:abababababababababababababababababababababababababababababababab 2>&1); then
  echo "gpulab: node $node could not fetch the project's image from the cluster's registry: $(printf '%s\n' "$pulled" | tail -n 1 | cut -c1-300)" >&2
  exit 1
fi
echo "gpulab-progress: Starting torchrun on node $node (node $rank of 2, $address)"
out=$(mktemp)  # Docker's own output; the job's goes to the project's jobs folder
trap 'gpulab_remove; rm -f -- "$out"' EXIT
rc=0
"$docker" run --rm --env-file /dev/stdin \
  --name gpulab-alice--vision-job-20261123-141502-a1b2-n"$rank" \
  --label gpulab.instance=gpulab \
  --label gpulab.owner=alice \
  --label gpulab.project=vision \
  --label gpulab.slurm.cluster=lab \
  --hostname vision \
  --user 1000:100 \
  --workdir /workspace \
  --expose 8888/tcp \
  --network gpulab-jobnet \
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
  --cpu-quota 400000 \
  --ip "$address" \
  --label gpulab.job=20261123-141502-a1b2 \
  --label "gpulab.slurm.job=$job" \
  "${gpu_opts[@]}" \
  10.0.0.1:5001/gpulab/project@sha256:abababababababababababababababababababababababababababababababab python3 -m gpulab_jupyter.jobs.node --job 20261123-141502-a1b2 --rank "$rank" --nodes 2 -- python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=1 --node-rank="$rank" --master-addr=10.0.0.129 --master-port=29500 train.py --epochs 3 >"$out" 2>&1 <<< "$env_file" &
wait "$!" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "gpulab: torchrun on node $node (node $rank) ended with exit code $rc; the job's output is in jobs/20261123-141502-a1b2/" >&2
  tail -n 5 -- "$out" | cut -c1-300 | sed 's/^/gpulab:   /' >&2
fi
exit "$rc"
GPULAB_TASK
trap 'exit 143' TERM
trap 'exit 130' INT
srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 --input=all --label \
  /bin/bash -c "$task" gpulab-task <<'GPULAB_ENV' &
GPULAB_PROJECT=vision
GPULAB_OWNER=alice
GPULAB_JOB_ID=20261123-141502-a1b2
GPULAB_JOB_NODES=2
PYTHONUNBUFFERED=1
OMP_NUM_THREADS=4
NCCL_SOCKET_IFNAME=eth0
GLOO_SOCKET_IFNAME=eth0
TORCH_NCCL_ASYNC_ERROR_HANDLING=1
GPULAB_WORKSPACE=/workspace
GPULAB_PROJECT_DIR=/workspace
GPULAB_DATA=/data
HF_HOME=/cache/huggingface
HF_TOKEN_PATH=/tmp/gpulab-huggingface/token
GPULAB_ENV
wait "$!"

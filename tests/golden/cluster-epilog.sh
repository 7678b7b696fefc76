#!/bin/bash
# gpulab Epilog of Slurm cluster lab: removes the containers a job's batch
# script started when the job ended without its trap (SIGKILL, a lost step).
# Rendered by gpulab_hub.cluster.batch (docs/cluster.md).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
docker=docker
job=${SLURM_JOB_ID:-}
if [[ ! $job =~ ^[0-9]+$ ]]; then
  exit 0
fi
gpulab_remove() {
  "$docker" ps -aq --filter label=gpulab.slurm.cluster=lab --filter "label=gpulab.slurm.job=$job" \
    | xargs -r "$docker" rm -f >/dev/null 2>&1 || true
}
gpulab_remove
exit 0

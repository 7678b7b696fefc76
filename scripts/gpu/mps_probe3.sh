#!/bin/bash
# Probe 3: two MPS control daemons (one per slice, own pipe dirs) on the same GPU:
# do both serve at once, each with its own pinned memory cap?
set -u
PY=${PY:-/opt/torch/.venv/bin/python}
export PATH=/usr/local/nvidia/bin:$PATH LD_LIBRARY_PATH=/usr/local/nvidia/lib64 CUDA_VISIBLE_DEVICES=0
cat > /tmp/mm.py <<'PYEOF'
import sys, time, torch
cap = int(sys.argv[1]); tag = sys.argv[2]
free, total = torch.cuda.mem_get_info(); print(f"{tag}: free={free/2**30:.1f} GiB")
try:
    x = torch.empty((cap + 2) * 2**30, dtype=torch.uint8, device="cuda"); print(f"{tag}: {cap+2} GiB OK (NOT capped)")
except torch.OutOfMemoryError: print(f"{tag}: {cap+2} GiB OOM (capped)")
x = torch.empty((cap - 2) * 2**30, dtype=torch.uint8, device="cuda"); print(f"{tag}: {cap-2} GiB OK")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); t0 = time.time(); n = 0
while time.time() - t0 < 8:
    a @ a; n += 1
torch.cuda.synchronize(); dt = time.time() - t0
print(f"{tag}: {n} matmuls in {dt:.1f}s = {n*2*8192**3/dt/1e12:.0f} TFLOPS")
PYEOF
start() { # $1 dir $2 limit
  mkdir -p $1/pipe $1/log
  CUDA_MPS_PIPE_DIRECTORY=$1/pipe CUDA_MPS_LOG_DIRECTORY=$1/log nvidia-cuda-mps-control -d
  sleep 0.5
  echo "set_default_device_pinned_mem_limit 0 $2" | CUDA_MPS_PIPE_DIRECTORY=$1/pipe nvidia-cuda-mps-control
}
A=$(mktemp -d); B=$(mktemp -d)
start $A 20G; start $B 10G
echo "== alone (no MPS)"; timeout 60 $PY /tmp/mm.py 70 plain
echo "== two slices at once"
CUDA_MPS_PIPE_DIRECTORY=$A/pipe timeout 120 $PY /tmp/mm.py 20 sliceA &
CUDA_MPS_PIPE_DIRECTORY=$B/pipe timeout 120 $PY /tmp/mm.py 10 sliceB &
wait
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
for d in $A $B; do echo quit | CUDA_MPS_PIPE_DIRECTORY=$d/pipe nvidia-cuda-mps-control; done; sleep 1
for d in $A $B; do echo "== log $d"; grep -v "Accepting connection" $d/log/control.log | grep -i "server\|error\|fail" | tail -6; done
pgrep -a mps || echo "no MPS left"

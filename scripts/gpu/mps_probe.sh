#!/bin/bash
# Probe: does an MPS per-client pinned memory limit hold against a client that tries
# to raise it? Runs on the GPU machine; starts and stops its own MPS control daemon.
set -u
PY=${PY:-/opt/torch/.venv/bin/python}
export PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
echo "== binaries"; command -v nvidia-cuda-mps-control nvidia-cuda-mps-server nvidia-smi; ls /usr/local/nvidia/bin 2>&1 | head
nvidia-smi --query-gpu=index,name,memory.total,compute_mode --format=csv
D=$(mktemp -d); export CUDA_MPS_PIPE_DIRECTORY=$D/pipe CUDA_MPS_LOG_DIRECTORY=$D/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
export CUDA_VISIBLE_DEVICES=0
nvidia-cuda-mps-control -d || { echo "MPS control daemon did not start"; exit 0; }
sleep 1
echo "set_default_device_pinned_mem_limit 0 8G" | nvidia-cuda-mps-control; echo "set rc=$?"
echo "get_default_device_pinned_mem_limit 0" | nvidia-cuda-mps-control
cat > $D/alloc.py <<'PYEOF'
import os, sys, torch
want = int(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "setenv":
    os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=70G"  # after start, before CUDA init
free, total = torch.cuda.mem_get_info()
print(f"{sys.argv[1:]} env={os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')} mem_get_info free={free/2**30:.1f} total={total/2**30:.1f} GiB")
try:
    x = torch.empty(want * 2**30, dtype=torch.uint8, device="cuda")
    print(f"allocated {want} GiB: OK")
except torch.OutOfMemoryError as e:
    print(f"allocated {want} GiB: OOM ({str(e).splitlines()[0][:150]})")
y = torch.randn(2048, 2048, device="cuda"); print("matmul ok", float((y @ y).sum()) != 0)
PYEOF
echo "== client, no env, 6 GiB (under 8G)"; timeout 120 $PY $D/alloc.py 6
echo "== client, no env, 12 GiB (over 8G)"; timeout 120 $PY $D/alloc.py 12
echo "== client raises its own limit by env 0=70G, 12 GiB"; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=70G timeout 120 $PY $D/alloc.py 12
echo "== client sets env inside the process, 12 GiB"; timeout 120 $PY $D/alloc.py 12 setenv
echo "== client lowers its own limit 0=2G, 4 GiB"; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G timeout 120 $PY $D/alloc.py 4
echo "== two clients at once, 6 GiB each"; ( timeout 120 $PY $D/alloc.py 6 & timeout 120 $PY $D/alloc.py 6 & wait )
echo "== server list"; echo get_server_list | nvidia-cuda-mps-control
echo "== as another uid (nobody), 12 GiB"; chmod -R a+rwx $D; su -s /bin/bash nobody -c "CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$LD_LIBRARY_PATH HOME=/tmp timeout 120 $PY $D/alloc.py 12" 2>&1 | tail -3
echo quit | nvidia-cuda-mps-control; sleep 1
echo "== after quit"; pgrep -a nvidia-cuda-mps || echo "no MPS processes left"
echo "== log"; tail -20 $CUDA_MPS_LOG_DIRECTORY/control.log 2>/dev/null

#!/bin/bash
# Probe 4: does a slice's cap hold against a client that leaves MPS (points
# CUDA_MPS_PIPE_DIRECTORY elsewhere)? And does an MPS client inside a container
# (uid 1000, pipe dir mounted, with and without the host's /dev/shm) get the cap?
# Run on the GPU machine from the project root after `bash .device-kit/start-docker.sh`.
set -u
PY=/opt/torch/.venv/bin/python
export PATH=/opt/dk/bin:/usr/local/nvidia/bin:$PATH LD_LIBRARY_PATH=/usr/local/nvidia/lib64
nvidia-smi --query-gpu=index,name,compute_mode --format=csv
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
W=/tmp/mps4; rm -rf $W; mkdir -p $W/pipe $W/log $W/shm; chmod 755 $W $W/pipe $W/log
cat > $W/alloc.py <<'PYEOF'
import os, sys, torch
tag = sys.argv[1]; want = int(sys.argv[2])
free, total = torch.cuda.mem_get_info()
print(f"{tag}: pipe={os.environ.get('CUDA_MPS_PIPE_DIRECTORY','(unset)')} uid={os.getuid()} free={free/2**30:.1f} GiB", flush=True)
try:
    x = torch.empty(want * 2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
    print(f"{tag}: {want} GiB OK", flush=True)
except torch.OutOfMemoryError:
    print(f"{tag}: {want} GiB OOM", flush=True)
except RuntimeError as e:
    print(f"{tag}: {want} GiB error {str(e)[:160]}", flush=True)
import time; time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
PYEOF
chmod 644 $W/alloc.py
env CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log nvidia-cuda-mps-control -d
sleep 0.5
echo "set_default_device_pinned_mem_limit 0 8G" | CUDA_MPS_PIPE_DIRECTORY=$W/pipe nvidia-cuda-mps-control
echo "== host, MPS client, 12 GiB (expect OOM)"
CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=$W/pipe timeout 60 $PY $W/alloc.py host-mps 12
echo "== host, MPS client holding the server + a client that leaves MPS, 20 GiB"
CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=$W/pipe timeout 60 $PY $W/alloc.py host-mps-hold 4 15 &
sleep 6
CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=/nonexistent timeout 60 $PY $W/alloc.py host-leaves 20
CUDA_VISIBLE_DEVICES=$UUID env -u CUDA_MPS_PIPE_DIRECTORY timeout 60 $PY $W/alloc.py host-unset 20
wait
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  R=$W/root; mkdir -p $R/{etc,tmp,dev,proc,sys,home/jovyan,usr,opt/torch,run}
  for l in bin lib lib64 sbin; do ln -s usr/$l $R/$l; done
  echo "jovyan:x:1000:1000::/home/jovyan:/bin/sh" > $R/etc/passwd; echo "root:x:0:0::/root:/bin/sh" >> $R/etc/passwd
  chmod 1777 $R/tmp
  tar -C $R -c . | docker import - gpulab-mps-probe:1 >/dev/null
  IDX=$(nvidia-smi --query-gpu=index --format=csv,noheader | head -1)
  base=(docker run --rm --network host --user 1000:1000 --device /dev/nvidia$IDX --device /dev/nvidiactl
        --device /dev/nvidia-uvm --device /dev/nvidia-uvm-tools -v /usr:/usr:ro -v /opt/torch:/opt/torch:ro
        -v $W/alloc.py:/alloc.py:ro -e LD_LIBRARY_PATH=/usr/local/nvidia/lib64 -e HOME=/tmp)
  echo "== container, pipe at the default /tmp/nvidia-mps, own /dev/shm, 12 GiB"
  timeout 90 "${base[@]}" -v $W/pipe:/tmp/nvidia-mps gpulab-mps-probe:1 $PY /alloc.py ctr-ownshm 12
  echo "== container, pipe mounted, slice's shm as /dev/shm, 12 GiB then 6 GiB"
  timeout 90 "${base[@]}" -v $W/pipe:/tmp/nvidia-mps -v /dev/shm:/dev/shm gpulab-mps-probe:1 $PY /alloc.py ctr-hostshm 12
  timeout 90 "${base[@]}" -v $W/pipe:/tmp/nvidia-mps -v /dev/shm:/dev/shm gpulab-mps-probe:1 $PY /alloc.py ctr-hostshm-ok 6
  echo "== container --ipc=host, 12 GiB"
  timeout 90 "${base[@]}" --ipc host -v $W/pipe:/tmp/nvidia-mps gpulab-mps-probe:1 $PY /alloc.py ctr-ipchost 12
  echo "== container leaves MPS (CUDA_MPS_PIPE_DIRECTORY=/nope) while an MPS client holds the server, 20 GiB"
  CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=$W/pipe timeout 60 $PY $W/alloc.py host-mps-hold2 4 20 &
  sleep 6
  timeout 90 "${base[@]}" -e CUDA_MPS_PIPE_DIRECTORY=/nope -v $W/pipe:/tmp/nvidia-mps -v /dev/shm:/dev/shm gpulab-mps-probe:1 $PY /alloc.py ctr-leaves 20
  wait
  docker rmi gpulab-mps-probe:1 >/dev/null
else
  echo "no docker here: container cases not run"
fi
echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$W/pipe nvidia-cuda-mps-control
echo quit | CUDA_MPS_PIPE_DIRECTORY=$W/pipe nvidia-cuda-mps-control; sleep 1
grep -iv "accepting connection" $W/log/control.log | tail -15
pgrep -a mps || echo "no MPS left"

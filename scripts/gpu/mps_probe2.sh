#!/bin/bash
# Probe 2: can a non-root MPS client change the limits through the control pipe?
set -u
PY=${PY:-/opt/torch/.venv/bin/python}
export PATH=/usr/local/nvidia/bin:$PATH LD_LIBRARY_PATH=/usr/local/nvidia/lib64
D=$(mktemp -d); export CUDA_MPS_PIPE_DIRECTORY=$D/pipe CUDA_MPS_LOG_DIRECTORY=$D/log CUDA_VISIBLE_DEVICES=0
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
echo "set_default_device_pinned_mem_limit 0 8G" | nvidia-cuda-mps-control
ls -la $CUDA_MPS_PIPE_DIRECTORY
chmod 755 $D; chmod -R a+rwX $CUDA_MPS_PIPE_DIRECTORY 2>/dev/null; ls -la $CUDA_MPS_PIPE_DIRECTORY
cat > $D/alloc.py <<'PYEOF'
import sys, torch
want = int(sys.argv[1])
free, total = torch.cuda.mem_get_info(); print(f"free={free/2**30:.1f}")
try:
    x = torch.empty(want * 2**30, dtype=torch.uint8, device="cuda"); print(f"{want} GiB OK")
except torch.OutOfMemoryError: print(f"{want} GiB OOM")
PYEOF
run_nobody() { su -s /bin/bash nobody -c "export CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$LD_LIBRARY_PATH PATH=$PATH HOME=/tmp; $1" 2>&1; }
echo "== nobody: client 12 GiB before"; run_nobody "timeout 60 $PY $D/alloc.py 12"
echo "== nobody: control commands"
run_nobody "echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control; echo rc=\$?"
run_nobody "echo set_default_device_pinned_mem_limit 0 70G | nvidia-cuda-mps-control; echo rc=\$?"
run_nobody "echo get_server_list | nvidia-cuda-mps-control; echo rc=\$?"
echo "== root reads the default after nobody's try"; echo "get_default_device_pinned_mem_limit 0" | nvidia-cuda-mps-control
echo "== nobody: set limit of its running server"
run_nobody "( timeout 60 $PY -c 'import torch,time; torch.zeros(1,device=\"cuda\"); time.sleep(20)' & ); sleep 6; S=\$(echo get_server_list | nvidia-cuda-mps-control); echo server=\$S; echo set_device_pinned_mem_limit \$S 0 70G | nvidia-cuda-mps-control; echo rc=\$?; timeout 60 $PY $D/alloc.py 12"
echo "== nobody: client 12 GiB after"; run_nobody "timeout 60 $PY $D/alloc.py 12"
echo "== root: client 12 GiB after"; timeout 60 $PY $D/alloc.py 12
echo quit | nvidia-cuda-mps-control; sleep 1
echo "== log"; grep -v "Accepting connection" $CUDA_MPS_LOG_DIRECTORY/control.log | tail -25

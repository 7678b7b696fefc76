#!/bin/sh
# gpulab's stand-in for nvidia-smi, installed at /usr/local/bin/nvidia-smi by gpulab's
# base images (images/_base.Dockerfile.j2). Where the project was given a GPU, it runs
# the driver's own nvidia-smi with the same arguments: the NVIDIA runtime puts it in
# /usr/bin, gpulab's device path mounts the driver's folder (default /usr/local/nvidia,
# its lib64/ on LD_LIBRARY_PATH). Otherwise it says in plain words why there is no GPU
# here and exits 9, as nvidia-smi does when it finds no device. It never runs itself.
me=$(readlink -f "$0" 2>/dev/null || echo "$0")
candidates="/usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi /bin/nvidia-smi /usr/lib/wsl/lib/nvidia-smi"
# the driver's folder as gpulab mounted it: <driver_dir>/lib64 on LD_LIBRARY_PATH
old_ifs=$IFS
IFS=:
for lib in ${LD_LIBRARY_PATH:-}; do
  case "$lib" in
    /*/lib64) candidates="${lib%/lib64}/bin/nvidia-smi $candidates" ;;
  esac
done
for dir in ${PATH:-}; do
  case "$dir" in
    /*) candidates="$candidates $dir/nvidia-smi" ;;
  esac
done
IFS=$old_ifs
for real in $candidates; do
  [ -f "$real" ] && [ -x "$real" ] || continue
  resolved=$(readlink -f "$real" 2>/dev/null || echo "$real")
  [ "$resolved" = "$me" ] && continue
  # a copy of this stand-in elsewhere is no driver either
  grep -q "gpulab's stand-in for nvidia-smi" "$resolved" 2>/dev/null && continue
  exec "$real" "$@"
done

if [ -z "${GPULAB_HOST_GPUS:-}" ]; then
  cat >&2 <<'EOF'
nvidia-smi: this project has no GPU because the machine gpulab runs on has none
(gpulab found no NVIDIA GPU on its host when its images were built).
Code here runs on the CPU. Ask your gpulab administrator for a GPU host.
EOF
else
  cat >&2 <<EOF
nvidia-smi: this project has no GPU: it was started without one.
This host has: ${GPULAB_HOST_GPUS}
To use a GPU, stop the project from the gpulab home page (Stop), then start it
again (Start) and choose how many GPUs it gets.
EOF
fi
exit 9

#!/bin/bash
# gpu_modes.py in fresh processes: as they come, pinned to one core, and without CUDA graphs.
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
tar xJf .gpu/mlxcuda13.tar.xz -C "$SITE" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for i in 1 2 3; do echo "plain $i: $(timeout 40 python3 benchmarks/gpu_modes.py 2>&1 | tail -1)"; done
for c in 0 5; do echo "core $c: $(timeout 40 taskset -c $c python3 benchmarks/gpu_modes.py 2>&1 | tail -1)"; done
echo "no graphs: $(MLX_USE_CUDA_GRAPHS=0 timeout 40 python3 benchmarks/gpu_modes.py 2>&1 | tail -1)"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate --format=csv

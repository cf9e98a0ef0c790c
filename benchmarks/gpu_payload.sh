#!/bin/bash
# The files `benchmarks/fidelity_gpu.sh` installs on the device machine, which has no network: MLX's
# CUDA 13 build, mlx-lm, SimPy and Altair (with the parts of its needs the machine lacks) for its
# Python 3.12, as one archive under .gpu/ (ignored by git;
# name it in the run's `carry`). MLX's CUDA library holds kernels for six GPU generations, 86 MiB
# packed, over what a run may carry (64 MiB); the entries an H200 (sm_90) never loads are zeroed
# (`gpu_strip_fatbin.py`), which leaves about 22 MiB packed.
set -eu
HERE="$(cd "$(dirname "$0")/.." && pwd)"; D="$HERE/.gpu"; T=$(mktemp -d)
MLX=${MLX:-0.32.4}; MLX_LM=${MLX_LM:-0.32.2}; SIMPY=${SIMPY:-4.1.2}
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_17_x86_64 -d "$T" "mlx==$MLX" "mlx-cuda-13==$MLX" \
  "mlx-lm==$MLX_LM" "simpy==$SIMPY" altair==6.3.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  referencing==0.37.0 rpds-py==0.30.0
mkdir -p "$T/site" "$D"
for w in "$T"/*.whl; do unzip -q -o "$w" -d "$T/site"; done
python3 "$HERE/benchmarks/gpu_strip_fatbin.py" "$T/site/mlx/lib/libmlx.so" "$T/libmlx.so"
mv "$T/libmlx.so" "$T/site/mlx/lib/libmlx.so"
tar cf - -C "$T/site" . | xz -9 -T0 > "$D/mlxcuda13.tar.xz"
rm -rf "$T"; ls -l "$D"

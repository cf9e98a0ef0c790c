#!/bin/bash
# A fidelity round on a CUDA GPU, in one call of the device machine some sessions are lent (an H200, no
# network, Python 3.12 with PyTorch's CUDA 13 libraries). It installs MLX's CUDA build from the
# files in $PAYLOAD (made by `benchmarks/gpu_payload.sh`), checks that MLX runs on the GPU, then a
# fresh quick calibration (in $DTYPE, default bfloat16: what a GPU user serves) and confirms with it:
# a fresh round's gamma workload (chunked b32 and eager, batch 4; a report each), mlx-lm's
# BatchGenerator likewise (its own quick calibration, one setting on the gamma workload), and the
# tiny-llm and meTile seeds. Every stage runs under what is left of
# BUDGET_S, and the results are packed after each one, so whatever was measured comes back.
# GRAPHS=0 runs every stage without MLX's CUDA graphs (the profile's device id then says so).
# Results: $OUT/fidelity-gpu.tgz (profile, reports, runs, logs); the summary table is printed last.
set -u
OUT=${OUT:-/tmp/pdsim-gpu}; PAYLOAD=${PAYLOAD:-.gpu}; BUDGET_S=${BUDGET_S:-540}
GAMMA_SEED=${GAMMA_SEED:-111}; REPEATS=${REPEATS:-2}; GRID=${GRID:-quick}; SKIP_INSTALL=${SKIP_INSTALL:-0}
DTYPE=${DTYPE:-bfloat16}
W="$OUT/work"; mkdir -p "$W/runs" "$W/profiles"
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
pack() { tar czf "$OUT/fidelity-gpu.tgz" -C "$OUT" work; }
stage() {  # stage NAME MAX_S CMD...: run CMD under min(MAX_S, what is left - 15 s), log it, pack
  local name=$1 max=$2; shift 2
  local t=$(( $(left) - 15 )); (( t > max )) && t=$max
  if (( t < 20 )); then echo "== $name: skipped, $(left) s left"; return 1; fi
  echo "== $name (up to $t s) $(date +%T)"
  timeout -k 5 "$t" "$@" > "$W/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc after $(( $(date +%s) - T0 )) s"; tail -n 4 "$W/$name.log"; pack; return $rc
}
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=5
[ -n "${GRAPHS:-}" ] && export MLX_USE_CUDA_GRAPHS=$GRAPHS

if [ "$SKIP_INSTALL" != 1 ]; then
  SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
  tar xJf "$PAYLOAD/mlxcuda13.tar.xz" -C "$SITE" || exit 1
  # libmlx.so looks for CUDA's libraries beside it ($ORIGIN/../../nvidia/...); name them all anyway
  export LD_LIBRARY_PATH=$(find "$SITE/nvidia" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:):${LD_LIBRARY_PATH:-}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$W/nvidia-smi.txt" 2>&1
SMOKE_N=${SMOKE_N:-4096} python3 - > "$W/smoke.log" 2>&1 <<'EOF'
import os, time, mlx.core as mx
print("device", mx.default_device(), mx.device_info())
n = int(os.environ["SMOKE_N"]); a = mx.random.normal((n, n)); mx.eval(a)
for _ in range(3):
    t = time.perf_counter(); mx.eval(a @ a); dt = time.perf_counter() - t
print(f"fp32 {n}^3 matmul {dt * 1e3:.2f} ms, {2 * n ** 3 / dt / 1e12:.2f} TFLOP/s")
mx.eval(mx.softmax(a, axis=-1).sum(), mx.fast.rms_norm(a, mx.ones((n,)), 1e-6))  # kernels MLX compiles at run time
from calibrate.host.machine import host_info
print("host", host_info())
EOF
rc=$?; cat "$W/smoke.log"; pack; [ $rc = 0 ] || exit 1

P="$W/profiles/qwen3-0.6b-gpu.json"  # PROFILE=FILE: confirm with a calibration already made
if [ -n "${PROFILE:-}" ]; then cp "$PROFILE" "$P"
else stage calibrate 300 python3 -m sim.cli calibrate --model qwen3-0.6b --grid "$GRID" --dtype "$DTYPE" -o "$P"; fi
[ -f "$P" ] || exit 1
python3 -m sim.cli traces gen gamma --num-requests 12 --rate 1.5 --burstiness 1/3 --min-in 9 --max-in 333 \
  --min-out 3 --max-out 21 --seed "$GAMMA_SEED" -o "$W/runs/gamma12.jsonl" > "$W/gen.log" 2>&1
for s in chunked:budget=32,batch_size=4 eager:batch_size=4; do  # one report each: a cut-off run loses one
  stage "gamma-${s%%:*}" 180 python3 -m sim.cli confirm --profile "$P" --trace "$W/runs/gamma12.jsonl" \
    --setting "$s" --repeats "$REPEATS" -o "$W/runs/confirm-gamma-${s%%:*}.json"
done
M="$W/profiles/qwen3-0.6b-gpu-mlx-lm.json"
stage mlxlm-calibrate 150 python3 -m sim.cli calibrate --engine mlx-lm --model qwen3-0.6b --quick --dtype "$DTYPE" -o "$M" \
  && stage gamma-mlxlm 120 python3 -m sim.cli confirm --profile "$M" --trace "$W/runs/gamma12.jsonl" --engine mlx-lm \
    --setting mlx-lm:prefill_step=128,prompt_concurrency=2,decode_concurrency=4 --repeats "$REPEATS" \
    -o "$W/runs/confirm-gamma-mlxlm.json"
stage tinyllm 200 python3 -m sim.cli confirm --profile "$P" --trace tinyllm --min-in 16 --max-in 128 \
  --min-out 8 --max-out 8 --policy chunked --budget 8 32 128 --batch-size 4 --repeats "$REPEATS" \
  -o "$W/runs/confirm-tinyllm.json"
stage metile 150 python3 -m sim.cli confirm --profile "$P" --trace metile --prompt-len 256 --output-len 32 \
  --setting fifo eager chunked:budget=16,order=decode-first --decode single --repeats "$REPEATS" \
  -o "$W/runs/confirm-metile.json"
python3 benchmarks/fidelity_table.py "$W"/runs/confirm-*.json | tee "$W/table.md"; pack

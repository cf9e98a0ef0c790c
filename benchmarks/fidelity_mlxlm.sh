#!/bin/bash
# mlx-lm's BatchGenerator: a fresh quick mlx-lm calibration of qwen3-0.6b, then `pdsim confirm
# --engine mlx-lm` (pipelined, as mlx_lm.server runs it) of three settings (prefill step
# 32/128/512, prompt concurrency 1/4/4) on a Poisson trace (arrivals spread over ~25 s, prompts
# 32..256, longer than two of the steps) and of two on a gamma workload, then the simulator's
# speed on 10,000 Poisson requests. On a quiet machine: anything else running
# slows memory-bound calls by up to 2x. Output under runs/mlxlm/ (not committed).
set -e
cd "$(dirname "$0")/.."
mkdir -p runs/mlxlm
date
pdsim calibrate --engine mlx-lm --model qwen3-0.6b --quick -o runs/mlxlm/qwen3-0.6b-cpu-mlx-lm.json --overwrite
date
pdsim confirm --engine mlx-lm --profile runs/mlxlm/qwen3-0.6b-cpu-mlx-lm.json \
  --trace poisson --num-requests 10 --rate 0.4 --min-in 32 --max-in 256 --min-out 8 --max-out 16 \
  --setting mlx-lm:prefill_step=32,prompt_concurrency=1,decode_concurrency=4 \
            mlx-lm:prefill_step=128,prompt_concurrency=4,decode_concurrency=4 \
            mlx-lm:prefill_step=512,prompt_concurrency=4,decode_concurrency=4 \
  --repeats 3 -o runs/mlxlm/confirm-mlx-lm-$(date +%H%M%S).json
date
# the gamma workload of fidelity_hybrid.sh, two settings (docs/results.md: the first pipelined round)
pdsim traces gen gamma --num-requests 12 --rate 1.5 --burstiness 1/3 --min-in 9 --max-in 333 \
  --min-out 3 --max-out 21 --seed 11 -o runs/mlxlm/gamma12.jsonl --overwrite
pdsim confirm --engine mlx-lm --profile runs/mlxlm/qwen3-0.6b-cpu-mlx-lm.json --trace runs/mlxlm/gamma12.jsonl \
  --setting mlx-lm:prefill_step=128,prompt_concurrency=4,decode_concurrency=4 \
            mlx-lm:prefill_step=32,prompt_concurrency=1,decode_concurrency=4 \
  --repeats 2 -o runs/mlxlm/confirm-gamma-$(date +%H%M%S).json
date
python3 benchmarks/bench_mlxlm.py --requests 10000

"""Simulator speed under the mlx-lm policy against chunked, on the same Poisson trace.

Run: python benchmarks/bench_mlxlm.py [--requests N ...]. Prints figures; asserts nothing. The
mlx-lm policy follows two batch caches by sizes and is priced call by call except in stretches of
generation-only iterations (`sim.steady`); the target is to stay within 2x of chunked's wall time.
"""
from speed import main

SETTINGS = (
    {"policy": "chunked", "budget": 128, "batch_size": 8},
    {"policy": "mlx-lm"},  # mlx_lm.server's defaults: step 2048, 8 prompts, 32 generating
    {"policy": "mlx-lm", "prefill_step": 128, "prompt_concurrency": 4, "decode_concurrency": 8},
)


if __name__ == "__main__":
    main(SETTINGS)

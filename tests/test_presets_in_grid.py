"""What `pdsim tune` sweeps on each device kind stays inside the quick grid it calibrates there:
no pick rests on a price extrapolated beyond the shapes the calibration timed."""
import pytest

from calibrate.measure.grid import QUICK_FOR
from sim.commands.tune_capacity import BATCH_SIZE, BUDGETS, TRAFFIC, VLLM_GRID


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_tunes_settings_and_traffic_stay_inside_the_quick_grid(kind):
    grid, traffic = QUICK_FOR[kind], TRAFFIC[kind]
    longest_prefill = max(grid.chunks + grid.odd_chunks + grid.odd_prompts)
    context = traffic["max_in"] + traffic["max_out"]  # the longest context a decode attends
    # pdsim's engine: whole prompts (fifo, eager) and chunks of every budget; batches of BATCH_SIZE
    assert longest_prefill >= traffic["max_in"] and longest_prefill >= min(max(BUDGETS[kind]), traffic["max_in"])
    assert max(grid.batches) >= BATCH_SIZE and max(grid.contexts) >= context
    # vLLM's forwards: up to max_num_seqs rows (decodes beside a prompt row), a prompt row of up
    # to the token budget, decode rows at the longest context
    rows = max(b for b, _, _, _ in grid.fused)
    prompt = max(n for _, _, n, _ in grid.fused)
    assert rows >= max(VLLM_GRID[kind]["max_num_seqs"])
    assert prompt >= min(max(VLLM_GRID[kind]["max_num_batched_tokens"]), traffic["max_in"])
    assert max(c for _, c, _, _ in grid.fused) >= context


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_the_mlx_lm_tunes_flags_and_traffic_stay_inside_its_quick_grid(kind):
    from calibrate.measure.grid import MLX_QUICK_FOR
    from sim.commands.tune import MLX_LM_PRESETS
    grid, preset = MLX_QUICK_FOR[kind], MLX_LM_PRESETS[kind]
    traffic, flags = preset["trace"], preset["grid"]
    rows = max(flags["prompt_concurrency"])
    # a prompt call: up to prompt_concurrency rows, each padded to the longest chunk (row-tokens)
    assert max(len(p) for p in grid.prompts) >= rows
    assert max(len(p) * max(p) for p in grid.prompts) >= rows * min(max(flags["prefill_step"]), traffic["max_in"])
    # the generation batch may pass decode_concurrency by up to prompt_concurrency - 1 rows
    batch = min(max(flags["decode_concurrency"]) + rows - 1, traffic["num_requests"])
    assert max(grid.batches) >= batch and max(grid.contexts) >= traffic["max_in"] + traffic["max_out"]

"""vLLM's one forward per iteration on MLX (qwen3-tiny): the mixed forward computes what the rows
run apart compute, and the executor under the `vllm` policy makes the simulator's calls."""
import numpy as np
import pytest

import policies
from calibrate.engine.executor import RealEngine
from calibrate.engine.gate import mixed_logits_match, tolerance
from calibrate.engine.kernels import new_cache, prefill_chunk
from calibrate.engine.mixed import mixed_forward
from calibrate.engine.model import build_model
from sim.cost.model import LinearCostModel
from sim.replay import simulate
from traces.generators import tinyllm


@pytest.fixture(scope="module")
def lm():
    return build_model("qwen3-tiny")


def test_a_mixed_forward_matches_its_rows_run_apart(lm):
    gate = mixed_logits_match(lm, tolerance())
    assert gate["ok"] and gate["max_abs_diff"] <= gate["tolerance"]


def test_a_row_at_the_wrong_offset_fails_the_comparison(lm):
    """The gate's comparison can fail: a prompt chunk run on a cache that already holds 5 other
    tokens (a wrong offset) gives other logits than the chunk run on its own."""
    prompt = list(range(100, 113))
    clean = np.array(prefill_chunk(lm, new_cache(lm), prompt)[1])
    shifted = new_cache(lm)
    prefill_chunk(lm, shifted, list(range(300, 305)))
    [(_, logits)] = mixed_forward(lm, [shifted], [prompt])
    assert not np.allclose(np.array(logits), clean, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("setting", [
    {"max_num_batched_tokens": 16, "max_num_seqs": 3},
    {"max_num_batched_tokens": 48, "max_num_seqs": 8, "long_prefill_token_threshold": 12},
])
def test_the_executor_makes_the_simulators_calls_and_chunked_engines_tokens(lm, setting):
    """Every request at t=0: the decisions depend on the state alone, so the real engine's mixed
    forwards are the simulator's, row for row; and the tokens are the chunked engine's."""
    trace = tinyllm(5, 10, 70, 4, 7, seed=3, vocab=1024)
    run = RealEngine(lm).run(trace, policies.make("vllm", **setting))
    sim = simulate(trace, policies.make("vllm", **setting), LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 0.0)))
    shape = lambda log: [(c.kind, c.rids, c.chunks, c.contexts, c.batched) for c in log.calls]
    assert shape(run.log) == shape(sim) and all(c.kind == "mixed" for c in sim.calls)
    assert any(c.batched and max(c.chunks) > 1 for c in sim.calls)  # decodes and prompt tokens in one forward
    chunked = RealEngine(lm).run(trace, policies.make("chunked", 8, 4)).outputs
    assert run.outputs == chunked

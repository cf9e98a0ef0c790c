"""Hybrid models (Qwen3.5: Gated DeltaNet layers, three to each full-attention layer) on
qwen3.5-tiny, built from mlx-lm's own `qwen3_5.TextModel`: both real engines make the simulator's
calls, the correctness gate holds, and memory counts the attention layers' KV and each request's
fixed linear-layer state as mlx-lm's caches hold them."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from mlx_lm.models.cache import ArraysCache

import policies
from calibrate.engine.batchgen import run_batch_generator
from calibrate.engine.executor import RealEngine
from calibrate.engine.gate import chunked_logits_match
from calibrate.engine.kernels import new_cache, prefill_chunk
from calibrate.engine.model import HYBRID_CONFIGS, ModelError, build_model
from calibrate.measure.grid import MLX_TINY
from calibrate.mlxlm_calibration import calibrate_mlx_lm
from sim.cost.model import LinearCostModel
from sim.cost.profile import cost_model, load_profile
from sim.engine.memory import attention_layers, kv_bytes_per_token, state_bytes_per_request, state_tokens
from sim.engine.relog import relog
from sim.replay import simulate
from tests.test_engine_real import SETTINGS  # the dense model's settings, run on the hybrid
from traces.generators import tinyllm

COST = LinearCostModel((1e-3, 1e-5, 1e-8), (1e-3, 1e-4, 1e-7), copy=1e-6, fresh=1e-6,
                       state_tokens=state_tokens(HYBRID_CONFIGS["qwen3.5-tiny"]))  # a hybrid's profile says it


@pytest.fixture(scope="module")
def lm():
    return build_model("qwen3.5-tiny")


def test_the_model_is_mlx_lms_hybrid_in_its_published_layout(lm):
    layers = lm.model.layers
    assert [layer.is_linear for layer in layers] == [True, True, True, False]  # full_attention_interval 4
    cfg = HYBRID_CONFIGS["qwen3.5-0.8b"]
    assert attention_layers(cfg) == 6 and cfg["num_hidden_layers"] == 24
    assert kv_bytes_per_token(cfg) == 6 * 2 * 256 * 2 * 4
    assert state_tokens(cfg) == 822  # the state of a request is the KV of 822 tokens (float32)
    with pytest.raises(ModelError, match="random weights"):
        build_model("qwen3.5-tiny", weights="/nonexistent")


def test_memory_counts_what_mlx_lms_caches_hold(lm):
    """After a prefill of n tokens, the linear layers' `ArraysCache`s hold the state bytes and the
    attention layer's `KVCache` n token-rows at `kv_bytes_per_token` (the bytes its arrays take up to
    the offset)."""
    cache = new_cache(lm)
    prefill_chunk(lm, cache, list(range(1, 40)))
    linear = [c for c in cache if type(c).__name__ == "ArraysCache"]
    attn = [c for c in cache if type(c).__name__ == "KVCache"]
    assert len(linear) == 3 and len(attn) == 1
    assert sum(c.nbytes for c in linear) == state_bytes_per_request(lm.config)
    c = attn[0]
    rows = c.keys[..., :c.offset, :].nbytes + c.values[..., :c.offset, :].nbytes
    assert c.offset == 39 and rows == 39 * kv_bytes_per_token(lm.config)


def test_chunked_prefill_matches_one_shot_and_every_policy_gives_the_same_tokens(lm):
    prompt = [(7 * i) % 1000 + 3 for i in range(45)]
    for budget in (4, 16, 32):
        gate = chunked_logits_match(lm, prompt, budget)
        assert gate["ok"] and gate["same_token"], gate
    trace = tinyllm(6, 10, 70, 5, 9, seed=1, vocab=1024)
    engine = RealEngine(lm)
    outputs = [engine.run(trace, policies.make(**s)).outputs for s in SETTINGS]
    assert all(out == outputs[0] for out in outputs[1:])
    assert len({tuple(t) for t in outputs[0].values()}) > 1  # requests differ: the model is not degenerate


@pytest.mark.parametrize("setting", SETTINGS + [{"policy": "chunked", "budget": 16, "batch_size": 4, "kv_limit": 360}])
def test_the_simulator_makes_the_real_engines_calls(lm, setting):
    """Every request at t=0: the policy's decisions do not depend on time, so the simulator makes
    pdsim's executor's calls on the hybrid model, with the same KV rows written (the attention
    layer's buffers grow as a dense model's, and a sync copies each row's state with its KV row) and,
    under a KV limit that counts each request's state, the same preemptions."""
    trace = tinyllm(5, 20, 120, 2, 12, seed=6, vocab=1024) if "kv_limit" not in setting else \
        tinyllm(5, 20, 60, 20, 40, seed=6, vocab=1024)  # decodes long enough to outgrow the limit
    policy = policies.make(**setting)
    real = RealEngine(lm).run(trace, policy).log.calls
    cost = COST if "kv_limit" not in setting else replace(COST, kv_bytes=kv_bytes_per_token(lm.config))
    sim = simulate(trace, policy, cost).calls
    shape = lambda c: (c.kind, c.rids, c.tokens, c.prefix, c.contexts, c.joined, c.left, c.written, c.batched)
    assert [shape(c) for c in sim] == [shape(c) for c in real]
    if "kv_limit" in setting:
        preempted = sum(c.kind == "preempt" for c in real)
        blind = LinearCostModel(COST.prefill_coef, COST.decode_coef, kv_bytes=kv_bytes_per_token(lm.config))
        assert preempted > sum(c.kind == "preempt" for c in simulate(trace, policy, blind).calls)  # the states' share


def test_batch_generator_runs_the_hybrid_as_the_policy_says(lm, monkeypatch):
    """mlx-lm's BatchGenerator on the hybrid model, call by call against the mlx-lm policy; the
    rows' states its `ArraysCache`s gather (`filter`) and concatenate (`extend`) are the ones
    pdsim's model of its batches counts (`sim.engine.batchcache.BatchCache.states`)."""
    copied = []
    filter_, extend = ArraysCache.filter, ArraysCache.extend

    def counted_filter(self, batch_indices):
        if any(c is not None for c in self.cache):
            copied.append(len(batch_indices))
        return filter_(self, batch_indices)

    def counted_extend(self, other):
        if any(c is not None for c in self.cache + other.cache):
            copied.append(self.batch_size + other.batch_size)
        return extend(self, other)

    monkeypatch.setattr(ArraysCache, "filter", counted_filter)
    monkeypatch.setattr(ArraysCache, "extend", counted_extend)
    trace = tinyllm(7, 1, 70, 1, 9, seed=3, vocab=1024)
    run, check, _ = run_batch_generator(lm, trace, {"policy": "mlx-lm", "prefill_step": 16, "prompt_concurrency": 3,
                                                    "decode_concurrency": 5})
    assert check.ok, (check.policy_mismatches + check.shape_mismatches)[:3]
    assert {rid: len(t) for rid, t in run.outputs.items()} == {r.id: r.output_len for r in trace.requests}
    linear = lm.config["num_hidden_layers"] - attention_layers(lm.config)  # each linear layer copies its own
    states = sum(c.written for c in run.log.calls) - sum(c.written for c in relog(trace, run.log).calls)
    assert sum(copied) % linear == 0 and sum(copied) // linear > 0
    assert states == sum(copied) // linear * state_tokens(lm.config)


def test_vllms_fused_forward_refuses_a_hybrid(lm):
    from calibrate.engine.mixed import mixed_forward
    with pytest.raises(ModelError, match="dense Qwen3 models only"):
        mixed_forward(lm, [new_cache(lm)], [[1, 2, 3]])


def test_a_calibration_of_the_hybrid_prices_its_state(tmp_path, capsys):
    """`pdsim calibrate --model qwen3.5-tiny`: the heap model follows the attention layer's arrays
    only, the memory model holds each request's state, a KV limit counts it, and the grid times no
    vLLM forward (its fused forward runs dense models only)."""
    from calibrate.calibration import calibrate
    from calibrate.measure.grid import TINY
    out = tmp_path / "hybrid.json"
    calibrate("qwen3.5-tiny", TINY, out, progress=False)
    prof = load_profile(out)
    cfg = HYBRID_CONFIGS["qwen3.5-tiny"]
    cost = cost_model(prof)
    assert prof["cost"]["heap_groups"] == attention_layers(cfg) == 1
    assert cost.state_tokens == state_tokens(cfg) and cost.kv_bytes == kv_bytes_per_token(cfg)
    assert prof["memory"]["state_bytes_per_request"] == state_bytes_per_request(cfg)
    assert not any(s["step"] == "mixed" for s in prof["samples"])
    trace = tinyllm(4, 20, 60, 4, 8, seed=2, vocab=1024)
    log = simulate(trace, policies.make("chunked", 16, 2), cost)
    assert sum(c.tokens for c in log.calls if c.kind == "prefill") == sum(r.prompt_len for r in trace.requests)
    # the peak holds every state alive: at least two requests' (one decoding, one prefilling)
    stateless = replace(cost, memory=replace(cost.memory, state=0.0))
    held = log.peak_memory - simulate(trace, policies.make("chunked", 16, 2), stateless).peak_memory
    assert held >= 2 * state_bytes_per_request(cfg)
    # vLLM's policy on it is priced from the prefill and decode forms, and the user is told so
    from sim.cli import main
    assert main(["simulate", "--profile", str(out), "--trace", "tinyllm", "--num-seqs", "4", "--policy", "vllm",
                 "--force"]) == 0
    assert "qwen3.5-tiny is a hybrid model" in capsys.readouterr().out


def test_batch_generators_calls_on_the_hybrid_are_calibrated_and_confirmed(tmp_path):
    """`pdsim calibrate --engine mlx-lm` times BatchGenerator's calls on the hybrid (its prepared batch
    caches hold each row's linear-layer state beside the attention layer's KV), the held-out
    BatchGenerator run is priced call by call, and a confirm on BatchGenerator runs the policy's calls."""
    path = tmp_path / "hybrid-mlx-lm.json"
    calibrate_mlx_lm("qwen3.5-tiny", MLX_TINY, path, progress=False)
    prof = load_profile(path)
    assert prof["engine"] == "mlx-lm" and prof["cost"]["heap_groups"] == attention_layers(HYBRID_CONFIGS["qwen3.5-tiny"])
    grid = [s for s in prof["samples"] if "source" not in s]
    assert {s["call"] for s in grid if s["step"] == "generate"} == {"first", "generate", "merge"}
    replay = prof["fit"]["replay"]
    assert {r["kind"] for r in replay["by_kind"]} >= {"prompt", "first", "generate"} and replay["calls"] > 0
    out = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "sim.cli", "confirm", "--engine", "mlx-lm", "--profile", str(path),
                        "--trace", "poisson", "--num-requests", "5", "--rate", "60", "--min-in", "5", "--max-in", "50",
                        "--min-out", "3", "--max-out", "8", "--seed", "4", "--setting",
                        "mlx-lm:prefill_step=16,prompt_concurrency=2,decode_concurrency=3", "--repeats", "1",
                        "-o", str(out)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["gate"]["ok"] and rep["gate"]["policy_calls_identical"]
    assert rep["runs"][0]["check"] == {"policy_mismatches": [], "shape_mismatches": []}
    assert {c["kind"] for c in rep["results"][0]["calls_by_kind"]} >= {"prompt", "first", "generate"}

"""Peak memory (`sim.engine.memory`): the KV term against the real caches, the fitted model against real
runs' measured peaks (qwen3-tiny), the profile section, and invariants over random traces."""
import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

import policies
from calibrate.engine.executor import RealEngine
from calibrate.measure.grid import TINY
from calibrate.engine.model import build_model
from sim.cost.model import LinearCostModel
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.engine.memory import GB, MemoryModel, kv_bytes_per_token, memory_model
from sim.metrics.scoring import score
from sim.replay import simulate
from sim.metrics.scored_log import simulate_scored
from traces.generators import tinyllm
from traces.trace import Request, Trace

COST = LinearCostModel((1e-3, 1e-5, 1e-8), (1e-3, 1e-4, 1e-7), copy=1e-6, fresh=1e-6)
MEM = MemoryModel(1e8, 229376.0, (1e6, 6e5, 64.0, 1e3), (2e6, 6e5, 64.0))


def pdsim(*args):
    p = subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def engine():
    return RealEngine(build_model("qwen3-tiny"))


def _kv_bytes(engine) -> int:
    """Bytes the real engine's KV buffers hold: every own cache and the batch cache."""
    caches = list(engine.caches.values()) + ([engine.batch.cache] if engine.batch.cache else [])
    return sum(c.keys.nbytes + c.values.nbytes for cache in caches for c in cache if c.keys is not None)


@pytest.mark.parametrize("setting", [{"policy": "chunked", "budget": 8, "batch_size": 4},
                                     {"policy": "eager", "batch_size": 3},
                                     {"policy": "chunked", "budget": 32, "batch_size": 2, "decode": "single"}])
def test_kv_term_is_the_followed_capacities_times_bytes_per_token(engine, setting):
    """After every call the real caches hold exactly kv_bytes_per_token x the token-rows
    `sim.engine.kvcache` says are resident (capacities, not tokens), over growth, joins and leaves."""
    per_token = kv_bytes_per_token(dict(engine.lm.config, dtype=engine.lm.dtype))
    trace = tinyllm(6, 30, 300, 3, 40, seed=4, vocab=1024)
    seen = []

    def check(state):
        assert _kv_bytes(engine) == per_token * state.kv.resident()
        seen.append(state.kv.resident())

    engine.run(trace, policies.make(**setting), on_call=check)
    tokens = [r.prompt_len for r in trace.requests]
    assert max(seen) >= 256 and max(seen) > max(tokens)  # buffers, not tokens: capacities round up


def test_kv_bytes_per_token_of_qwen3_shapes():
    shapes = {"num_hidden_layers": 28, "num_key_value_heads": 8, "head_dim": 128, "num_attention_heads": 16,
              "hidden_size": 1024}
    assert kv_bytes_per_token(dict(shapes, dtype="float32")) == 229_376  # README: 229 KB a token-row
    assert kv_bytes_per_token(dict(shapes, dtype="bfloat16")) == 114_688


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    from calibrate.calibration import calibrate
    out = tmp_path_factory.mktemp("mem") / "tiny.json"
    calibrate("qwen3-tiny", TINY, out, progress=False)
    return load_profile(out)


def test_calibration_measures_peaks_and_fits_the_activations(tiny_profile):
    m = tiny_profile["memory"]
    grid = [s for s in tiny_profile["samples"] if "source" not in s and s["step"] in ("prefill", "decode")]
    assert all(s["peak_extra"] > 0 for s in grid)  # MLX's CPU counter works (MLX 0.32)
    assert m["kv_bytes_per_token"] == kv_bytes_per_token(dict(tiny_profile["model"]["shapes"], dtype="float32"))
    assert m["weights_bytes"] > 0 and len(m["prefill"]) == 4 and len(m["decode"]) == 3
    for step in ("prefill", "decode"):
        assert 0 <= m["errors"][step]["cv_form_mean"] < 1.0
    assert {r["part"] for r in m["errors"]["runs"]} == {"train", "held_out"}


def test_predicted_peak_of_real_runs_is_close_to_measured(engine, tiny_profile):
    """Real runs on qwen3-tiny: mx.get_peak_memory over the run against the profile's prediction
    for the same trace and setting (simulated, not replayed from the real run's calls), with
    chunks the tiny grid measured (up to 32 tokens; a whole 279-token prompt, 9x past the grid,
    was predicted 19% high: the per-token term extrapolated)."""
    cost = cost_model(tiny_profile)
    trace = tinyllm(6, 30, 300, 3, 20, seed=8, vocab=1024)
    errors = []
    for s in ({"policy": "chunked", "budget": 8, "batch_size": 2}, {"policy": "chunked", "budget": 32, "batch_size": 4},
              {"policy": "chunked", "budget": 16, "batch_size": 3, "decode": "single"}):
        measured = score(engine.run(trace, policies.make(**s)).log)["peak_memory_gb"]
        predicted = score(simulate(trace, policies.make(**s), cost))["peak_memory_gb"]
        errors.append(abs(predicted - measured) / measured)
    assert max(errors) < 0.10, errors


@pytest.mark.parametrize("seed, setting", [
    (8, {"policy": "mlx-lm", "prefill_step": 32, "prompt_concurrency": 2, "decode_concurrency": 4}),
    (3, {"policy": "mlx-lm", "prefill_step": 16, "prompt_concurrency": 3, "decode_concurrency": 3})])
def test_batch_generator_runs_measure_their_peak_and_the_model_prices_it(engine, tiny_profile, seed, setting):
    """mlx-lm's BatchGenerator run (`calibrate.engine.batchgen`) keeps its measured peak as pdsim's runs do,
    and the memory model predicts the mlx-lm policy's peak from the simulated calls: a lazy
    rebuild holds the old buffers and the largest array it builds (the sum of its arrays priced
    these runs' peaks 1.3x and more, and failed here). 15%: the same run's measured peak moves
    8% within one process (seed 8: 2.30 MB first, 2.49 after), and the fitted activations with
    the calibration (seed 3 came out 1.00x and 1.11x in two)."""
    from calibrate.engine.batchgen import run_batch_generator
    trace = tinyllm(6, 30, 200, 3, 12, seed=seed, vocab=1024)
    run, check, _ = run_batch_generator(engine.lm, trace, setting)
    assert not check.policy_mismatches
    measured = score(run.log)["peak_memory_gb"]
    predicted = score(simulate(trace, policies.make(**setting), cost_model(tiny_profile)))["peak_memory_gb"]
    weights = memory_model(tiny_profile).weights / GB
    assert measured > weights and predicted > weights
    assert abs(predicted - measured) / measured < 0.15, (predicted, measured)


@pytest.mark.parametrize("setting", [{"policy": "chunked", "budget": 16, "batch_size": 3},
                                     {"policy": "mlx-lm", "prefill_step": 32, "prompt_concurrency": 2,
                                      "decode_concurrency": 4}])
def test_a_runs_peak_is_its_own_not_what_the_process_held_before(engine, setting):
    """A 16 MB array alive before the run (another model, a test's caches) is not the run's: both
    executors read the same peak with it and without it (run after mlx-lm's tests in one process,
    qwen3-tiny's runs read 1.35x their peak). The peaks are ~2.5 MB, so counting the array fails."""
    import mlx.core as mx
    from calibrate.engine.batchgen import run_batch_generator
    trace = tinyllm(5, 20, 120, 3, 8, seed=4, vocab=1024)

    def peak() -> float:
        if setting["policy"] == "mlx-lm":
            return run_batch_generator(engine.lm, trace, setting)[0].log.peak_memory
        return engine.run(trace, policies.make(**setting)).log.peak_memory

    alone = peak()
    ballast = mx.zeros((4, 1 << 20))
    mx.eval(ballast)
    held = peak()
    del ballast
    assert abs(held - alone) < 0.2 * alone, (held, alone)

def test_profile_round_trip_and_profiles_without_memory(tmp_path):
    prof = load_profile(BUILTIN)
    assert memory_model(prof) is None  # before the memory model: no prediction
    m = score(simulate(tinyllm(), policies.make("chunked", 64, 4), cost_model(prof)))
    assert math.isnan(m["peak_memory_gb"])
    prof.pop("_path")
    prof["memory"] = dict(MEM.to_dict(), errors={})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    again = load_profile(path)
    assert memory_model(again) == MEM and cost_model(again).memory == MEM
    prof["memory"]["prefill"] = [1.0, -2.0, 0.0, 0.0]
    path.write_text(json.dumps(prof))
    code, out, err = pdsim("simulate", "--profile", str(path))
    assert code == 2 and "memory.prefill[1]" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_sweep_and_simulate_report_peak_memory(tmp_path):
    prof = load_profile(BUILTIN)
    prof.pop("_path")
    prof["memory"] = MEM.to_dict()
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    code, out, err = pdsim("simulate", "--profile", str(path), "--policy", "chunked", "--budget", "64")
    assert code == 0 and "peak_memory_gb" in out, err
    code, out, err = pdsim("sweep", "--profile", str(path), "--policy", "chunked", "--budget", "16", "256",
                           "--no-progress", "--slo", "peak_memory_gb<=100", "-o", str(tmp_path / "sw"))
    assert code == 0, err
    rows = json.loads((tmp_path / "sw" / "results.json").read_text())["rows"]
    assert all(r["peak_memory_gb"] > 0.1 for r in rows)


@st.composite
def traces(draw):
    n = draw(st.integers(1, 7))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.floats(0, 3, allow_nan=False))
        reqs.append(Request(str(i), t, draw(st.integers(1, 600)), draw(st.integers(1, 12))))
    return Trace(reqs)


def _peak(trace, setting, steady=True) -> float:
    return simulate(trace, policies.make(**setting), replace(COST, memory=MEM), steady=steady).peak_memory


coef = st.floats(0, 1e7)


@settings(max_examples=200, deadline=None)
@given(st.builds(MemoryModel, st.floats(0, 1e10), st.floats(0, 1e6), st.tuples(coef, coef, coef, coef),
                 st.tuples(coef, coef, coef)),
       st.sampled_from(["prefill", "decode", "prompt", "first", "generate"]),
       st.tuples(*[st.integers(0, 5000)] * 6), st.tuples(*[st.integers(0, 5000)] * 6))
def test_a_calls_peak_is_monotone_in_its_chunk_batch_context_and_buffers(model, kind, a, b):
    """The model's coefficients are non-negative (the fit is an NNLS), so a call's predicted peak
    never falls when its chunk, offset, batch, contexts, KV held or KV written grow."""
    lo, hi = (tuple(min(x, y) for x, y in zip(a, b)), tuple(max(x, y) for x, y in zip(a, b)))
    peak = lambda t: model.call_peak(t[0], t[1], kind, max(1, t[2]), t[3], (t[4],) * max(1, min(t[5], 8)))
    assert peak(lo) <= peak(hi) * (1 + 1e-12)


# A run's peak is not monotone in chunk size or batch size, on the real engine as in the model:
# the two tests below pin why, on buffers `sim.engine.kvcache` follows exactly (tests/test_engine_real.py).

def test_unaligned_chunks_can_hold_a_larger_buffer():
    """A buffer grows to `offset + 256` when the chunk that overflows it starts off a 256-token
    boundary: a 1-token budget (growth at offset 256: 512 rows) holds one row more than a 3-token
    one (growth at offset 255: 511 rows), as mlx-lm computes it (`sim.engine.batchcache.write`)."""
    trace = Trace([Request("0", 0.0, 257, 2)])
    one, three = (_peak(trace, {"policy": "chunked", "budget": b, "batch_size": 1}) for b in (1, 3))
    assert one - three == MEM.kv_token  # the peak is the first decode's, over the request's own buffer


def test_smaller_chunks_peak_lower_by_their_activations():
    """One 1,024-token prompt: a 256-token budget grows the cache at offsets 256, 512 and 768, each
    growth adding 256 rows to what is held (memory rises by the growth, as the calibration's grid
    measures it: 62.5 MB for a chunk of 8 growing a 256-row buffer to 506 rows, not the 506 rows
    copied); a 1,024-token budget allocates 1,024 rows at once. Both end holding 1,024 rows, so the
    smaller chunk peaks lower by exactly its smaller activations."""
    trace = Trace([Request("0", 0.0, 1024, 1)])
    small, big = (_peak(trace, {"policy": "chunked", "budget": b, "batch_size": 1}) for b in (256, 1024))
    assert small - big == MEM.prefill[1] * (256 - 1024) + MEM.prefill[2] * (256 * 1024 - 1024 * 1024) \
        + MEM.prefill[3] * 768


@settings(max_examples=60, deadline=None)
@given(traces(), st.sampled_from(["chunked", "eager", "fifo"]), st.integers(1, 256), st.integers(1, 5),
       st.sampled_from(["batched", "single"]))
def test_peak_is_the_same_call_by_call_in_stretches_and_tallied(trace, policy, budget, batch, decode):
    """Steady stretches (`sim.steady`) price the same peak as the call-by-call replay; a tallied
    replay (`sim.metrics.scored_log`) reports it too; twice the same run, the same figure."""
    s = {"policy": policy, "budget": budget, "batch_size": batch, "decode": decode}
    a, b = _peak(trace, s), _peak(trace, s, steady=False)
    assert a == b == _peak(trace, s) and a >= MEM.weights
    cost = replace(COST, memory=MEM)
    assert simulate_scored(trace, policies.make(**s), cost).result()["peak_memory_gb"] == a / GB

"""mlx-lm's BatchGenerator on qwen3-tiny: the mlx-lm policy makes its decisions call by call, the
KV model follows its caches, and both real engines give the same tokens.

A change in mlx-lm's behaviour (another admission rule, another split, another padding) fails
here: the installed `mlx_lm.generate.BatchGenerator` itself is driven (`calibrate.engine.batchgen`)."""
import pytest

import policies
from calibrate.engine.batchgen import run_batch_generator
from calibrate.engine.executor import RealEngine
from calibrate.engine.model import build_model
from sim.cost.model import LinearCostModel
from sim.replay import simulate
from traces.generators import fixed, poisson, tinyllm
from traces.trace import Request, Trace

SETTINGS = [
    {"prefill_step": 8, "prompt_concurrency": 2, "decode_concurrency": 2},
    {"prefill_step": 16, "prompt_concurrency": 3, "decode_concurrency": 5},
    {"prefill_step": 32, "prompt_concurrency": 1, "decode_concurrency": 1},
    {"prefill_step": 2048, "prompt_concurrency": 8, "decode_concurrency": 32},  # mlx_lm.server's defaults
]
AT_ZERO = tinyllm(7, 1, 70, 1, 9, seed=3, vocab=1024)  # prompts from 1 token to several steps long


def spread(seed: int) -> Trace:
    """Arrivals over time (the tiny model serves a call in milliseconds), prompts around the steps."""
    return poisson(num_requests=9, rate=150.0, min_in=1, max_in=60, min_out=1, max_out=10, seed=seed)


@pytest.fixture(scope="module")
def lm():
    return build_model("qwen3-tiny")


def shape(c):
    return (c.iteration, c.kind, c.rids, c.tokens, c.prefix, c.contexts, c.chunks, c.written, c.fresh)


# every iteration one second, calls (next to) nothing; fresh memory priced, so the heap is followed
FREE = LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), 1.0, fresh=1e-12)


def assigned(trace: Trace, inserted: dict[str, int]) -> Trace:
    """The trace with each request arriving just before the iteration the real run inserted it
    before, on a clock where an iteration takes a second (FREE): the same arrival-to-call assignment."""
    return Trace([Request(r.id, float(inserted[r.id] - 1), r.prompt_len, r.output_len, r.prompt_ids)
                  for r in trace.requests])


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("trace", [AT_ZERO, spread(1), spread(2)], ids=["t0", "spread1", "spread2"])
def test_the_policy_makes_batch_generators_calls(lm, trace, setting):
    """The real BatchGenerator, call by call: before every next(), the mlx-lm policy shown the same
    state asks for exactly the calls it makes, and the KV model expects each call's input shape and
    cache position; the simulator, with the same arrival-to-call assignment, logs the same calls."""
    run, check, _ = run_batch_generator(lm, trace, dict(policy="mlx-lm", **setting))
    assert check.ok, (check.policy_mismatches + check.shape_mismatches)[:3]
    assert {rid: len(t) for rid, t in run.outputs.items()} == {r.id: r.output_len for r in trace.requests}
    kinds = {c.kind for c in run.log.calls}
    assert kinds <= {"prompt", "first", "generate"} and "first" in kinds
    sim = simulate(assigned(trace, run.inserted), policies.make("mlx-lm", **setting), FREE)
    assert [shape(c) for c in sim.calls] == [shape(c) for c in run.log.calls]


def test_spread_arrivals_meet_a_busy_generator(lm):
    """The spread traces are not all at t=0 in the generator's eyes: some requests are inserted
    while others are generating, and some prompt calls mix rows of different ages."""
    run, check, _ = run_batch_generator(lm, spread(1), dict(policy="mlx-lm", **SETTINGS[1]))
    assert check.ok and len(set(run.inserted.values())) > 2
    assert any(len(c.rids) > 1 and len(set(c.contexts)) > 1 for c in run.log.calls if c.kind == "prompt")
    assert any(c.kind == "generate" and c.joined and c.written for c in run.log.calls)  # a paid merge


@pytest.mark.parametrize("trace", [AT_ZERO, spread(2)], ids=["t0", "spread2"])
def test_pipelined_as_the_server_runs_it(lm, trace):
    """Nothing synchronized (`pipelined`): the policy still asks for every call the generator
    makes, and the tokens are a synchronized run's. A synchronized run measures the host's part
    of each kind of call (`sim.engine.pipeline`): some of its span, not all, and the call's time
    left when queued; mlx's `async_eval` is its own again after either run."""
    import statistics

    import mlx.core as mx
    own = mx.async_eval
    setting = dict(policy="mlx-lm", **SETTINGS[1])
    piped, check, _ = run_batch_generator(lm, trace, setting, pipelined=True)
    synced, synced_check, _ = run_batch_generator(lm, trace, setting)
    assert check.ok and synced_check.ok, (check.policy_mismatches + check.shape_mismatches)[:3]
    assert piped.outputs == synced.outputs
    assert piped.log.pipelined and not synced.log.pipelined and mx.async_eval is own
    host = synced.log.host_parts
    assert set(host) == {c.kind for c in synced.log.calls} >= {"prompt", "first", "generate"}
    for kind, part in host.items():
        span = statistics.median(c.end - c.start for c in synced.log.calls if c.kind == kind)
        assert 0 < part < span, (kind, part, span)
    # and what was left of a step or first forward when it was queued (a prompt call waits for all)
    tails = synced.log.queue_tails
    assert set(tails) == {"generate", "first"} and all(0 <= v < 1 for v in tails.values())
    assert piped.log.queue_tails == {}  # pipelined, a call's span is not its own time


def _real_sizes(gen) -> dict:
    out = {}
    for name, b in (("prompt", gen._prompt_batch), ("gen", gen._generation_batch)):
        c = b.prompt_cache[0] if b.prompt_cache else None
        out[name] = (list(b.uids), c.left_padding.tolist() if c is not None else [], c._idx if c is not None else 0,
                     c.keys.shape[2] if c is not None and c.keys is not None else 0)
    return out


def _model_sizes(state, rid_of=None) -> dict:
    out = {}
    for name, c in (("prompt", state.kv.prompt), ("gen", state.kv.gen)):
        rows = [rid_of[r] for r in c.rows] if rid_of else list(c.rows)
        out[name] = (rows, list(c.pad), c.idx if c.rows else 0, c.cap if c.keys else 0)
    return out


@pytest.mark.parametrize("setting", SETTINGS[:3])
def test_kv_sizes_follow_batch_generators_caches(lm, setting):
    """After every next(): both batch caches' rows, left padding, write position and capacity are
    what pdsim's KV model says (prompts crossing the 256-token step, padded chunks, splits, merges)."""
    trace = fixed([0.0, 0.0, 0.0, 0.002, 0.004], [300, 9, 1, 270, 40], [3, 12, 2, 4, 6], seed=5, vocab=1024)
    seen = []

    def compare(state, gen):
        uid_of = {rid: i for i, rid in enumerate(r.id for r in trace.requests)}
        real = _real_sizes(gen)
        model = _model_sizes(state)
        model = {k: ([uid_of[r] for r in v[0]],) + v[1:] for k, v in model.items()}
        assert real == model, state.iteration
        seen.append(state.log.calls[-1].written)

    run, check, _ = run_batch_generator(lm, trace, dict(policy="mlx-lm", **setting), on_call=compare)
    assert check.ok and any(seen) and len(seen) > 5


def test_pdsim_executor_runs_the_policy_on_mlx_lm_batches(lm):
    """pdsim's own executor under the mlx-lm policy runs mlx-lm's batch classes: with every request
    at t=0, the simulator's calls and KV rows, the caches' sizes after every call, and the greedy
    tokens of BatchGenerator and of pdsim's chunked engine."""
    setting = SETTINGS[1]
    policy = policies.make("mlx-lm", **setting)
    engine = RealEngine(lm)
    seen = []

    def compare(state):
        assert _model_sizes(state) == engine.mlx.sizes()
        seen.append(1)

    run = engine.run(AT_ZERO, policy, on_call=compare)
    sim = simulate(AT_ZERO, policy, LinearCostModel((1e-3, 1e-5, 1e-8), (1e-3, 1e-4, 1e-7), fresh=1e-9))
    assert [shape(c) for c in sim.calls] == [shape(c) for c in run.log.calls] and seen
    real, _, _ = run_batch_generator(lm, AT_ZERO, dict(policy="mlx-lm", **setting))
    assert run.outputs == real.outputs
    chunked = RealEngine(lm).run(AT_ZERO, policies.make("chunked", 16, 4)).outputs
    assert chunked == real.outputs
    assert len({tuple(t) for t in real.outputs.values()}) > 1


def test_batch_generators_calls_count_their_own_page_faults(lm):
    """Driven through mlx-lm's BatchGenerator, every model call counts its minor page faults too
    (`EventLog.faults`, one per call): here each prompt call first maps 8 MiB of fresh memory, so
    each logged prompt call has at least a fault per (huge) page of it, and the other calls,
    which map nothing of the kind, fewer."""
    from dataclasses import replace

    from calibrate.measure.speed_probe import allocation_seconds

    class FaultingPrompts:
        """The model, but a prompt call (more than one token a row) maps 8 MiB first."""
        def __getattr__(self, name):
            return getattr(lm.model, name)

        def __call__(self, inputs, cache=None):
            if inputs.shape[1] > 1:
                allocation_seconds(8 << 20)
            return lm.model(inputs, cache=cache)

    run, check, _ = run_batch_generator(replace(lm, model=FaultingPrompts()), AT_ZERO,
                                        dict(policy="mlx-lm", **SETTINGS[0]))
    calls, faults = run.log.calls, run.log.faults
    assert check.ok and len(faults) == len(calls) and min(faults) >= 0
    pages = (8 << 20) // (2 << 20)  # a fault per page at least, huge pages included
    prompts = [n for c, n in zip(calls, faults) if c.kind == "prompt" and c.tokens > 1]
    steps = [n for c, n in zip(calls, faults) if c.kind == "generate"]
    assert prompts and min(prompts) >= pages
    assert steps and sorted(steps)[len(steps) // 2] < min(prompts)

"""The KV-cache limit on the real engine (MLX, qwen3-tiny): the state machine the simulator runs
admits, preempts and recomputes the same requests, and a recomputed request's greedy tokens are
the ones it would have generated without a preemption."""
import pytest

import policies
from calibrate.engine.executor import RealEngine
from calibrate.engine.model import build_model
from sim.cost.model import LinearCostModel
from sim.engine.memory import kv_bytes_per_token
from sim.engine.kvcache import Heap
from sim.metrics.scoring import score
from sim.replay import simulate, warmed
from sim.engine.relog import relog
from traces.generators import tinyllm

# long outputs on short prompts: decodes outgrow a limit that admitted every request
TRACE = dict(num_seqs=5, min_in=10, max_in=40, min_out=20, max_out=40, seed=3)
SETTINGS = [
    {"policy": "chunked", "budget": 16, "batch_size": 4, "kv_limit": 100},
    {"policy": "eager", "batch_size": 4, "kv_limit": 120},
    {"policy": "chunked", "budget": 16, "batch_size": 3, "decode": "single", "order": "decode-first",
     "kv_limit": 120},  # preempts a request in the middle of its prefill
    # sjf: a preempted request resumes before the shorter prompts waiting
    {"policy": "chunked", "budget": 16, "batch_size": 4, "kv_limit": 100, "queue": "sjf"},
]
COST = LinearCostModel((1e-3, 1e-5, 1e-8), (1e-3, 1e-4, 1e-7), copy=1e-6, fresh=1e-6)


def shape(c):
    return c.kind, c.rids, c.tokens, c.prefix, c.contexts, c.joined, c.left, c.written, c.fresh, c.batched


@pytest.fixture(scope="module")
def engine():
    return RealEngine(build_model("qwen3-tiny"))


@pytest.fixture(scope="module")
def trace():
    return tinyllm(**TRACE, vocab=1024)


@pytest.fixture(scope="module")
def unlimited(engine, trace):
    return engine.run(trace, policies.make("eager", batch_size=4)).outputs


@pytest.mark.parametrize("setting", SETTINGS,
                         ids=lambda s: f"{s['policy']}-{s.get('decode', 'batched')}-{s.get('queue', 'fcfs')}")
def test_preemptions_are_the_simulators_and_recompute_keeps_the_tokens(engine, trace, unlimited, setting):
    """Every request at t=0: the decisions do not depend on time, so the real engine makes the
    simulator's calls, preemptions included, with the same tokens freed; the real log relogged
    derives them again; and every request's greedy tokens equal an unlimited run's."""
    policy = policies.make(**setting)
    warm = tinyllm(2, 10, 20, 3, 3, seed=7, vocab=1024)
    engine.heap = Heap()  # a process that has freed nothing yet
    engine.run(warm, policy)
    held = []
    run = engine.run(trace, policy, on_call=lambda state: held.append(state.kv_used))
    sim = simulate(trace, policy, COST, warmup=warm).calls
    real = run.log.calls
    assert [shape(c) for c in sim] == [shape(c) for c in real]
    preempted = [c for c in real if c.kind == "preempt"]
    assert len(preempted) >= 2
    assert score(run.log)["preemptions"] == len(preempted) == score(simulate(trace, policy, COST))["preemptions"]
    assert max(held) <= setting["kv_limit"]
    assert run.outputs == unlimited  # recomputed caches give the tokens an unpreempted run gives
    assert any(o != unlimited[next(iter(unlimited))] for o in unlimited.values())  # not a degenerate model
    again = relog(trace, run.log, heap=warmed(warm, policy, COST))
    assert [shape(c) for c in again.calls] == [shape(c) for c in real]


def test_kv_buffers_follow_the_real_caches_through_preemptions(engine, trace):
    """After every call the batch cache's rows (a preempted row marked freed until the next sync
    drops it), `_idx` and capacity and every own cache's capacity are what the state follows."""
    seen = []

    def check(state):
        b = engine.batch.cache[0] if engine.batch.cache else None
        own = {rid: c[0].keys.shape[2] for rid, c in engine.caches.items() if c[0].keys is not None}
        kv = state.kv
        assert tuple(engine.batch.ids) == kv.rows
        assert ((b._idx, b.keys.shape[2]) if b is not None else (0, 0)) == (kv.idx, kv.cap)
        assert own == {rid: kv.own[rid] for rid in own}
        seen.append(state.log.calls[-1].kind)

    run = engine.run(trace, policies.make(**SETTINGS[0]), on_call=check)
    assert score(run.log)["preemptions"] >= 2 and len(seen) > 50
    assert any(c.kind == "sync" and c.left for c in run.log.calls)  # freed rows filtered out


def test_a_limit_in_gb_is_the_models_tokens(engine, trace):
    lm = engine.lm
    per_token = kv_bytes_per_token(lm.config, lm.dtype)
    assert per_token == 2 * 2 * 16 * 2 * 4  # qwen3-tiny: 2 layers, 2 KV heads, head_dim 16, K and V, float32
    gb = f"{100.5 * per_token / 1e9:.12g}GB"  # 100 tokens and a half: the limit is whole tokens
    a = engine.run(trace, policies.make("eager", batch_size=4, kv_limit=gb)).log.calls
    b = engine.run(trace, policies.make("eager", batch_size=4, kv_limit=100)).log.calls
    assert [shape(c)[:4] for c in a] == [shape(c)[:4] for c in b]

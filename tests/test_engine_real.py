"""The real engine on MLX (qwen3-tiny): same state machine, same log, same metrics as the simulator."""
import pytest

import policies
from calibrate.engine.executor import RealEngine
from calibrate.engine.model import build_model
from sim.engine.kvcache import Heap
from sim.metrics.scoring import score
from traces.generators import metile_ab, tinyllm

SETTINGS = [
    {"policy": "chunked", "budget": 8, "batch_size": 4},
    {"policy": "chunked", "budget": 32, "batch_size": 2},
    {"policy": "eager", "batch_size": 4},
    {"policy": "fifo"},
    {"policy": "chunked", "budget": 8, "batch_size": 4, "decode": "single", "order": "decode-first"},
]


@pytest.fixture(scope="module")
def engine():
    return RealEngine(build_model("qwen3-tiny"))


def test_every_policy_gives_the_same_greedy_tokens(engine):
    trace = tinyllm(6, 10, 70, 5, 9, seed=1, vocab=1024)
    outputs = [engine.run(trace, policies.make(**s)).outputs for s in SETTINGS]
    for out in outputs[1:]:
        assert out == outputs[0]
    assert {rid: len(t) for rid, t in outputs[0].items()} == {r.id: r.output_len for r in trace.requests}
    assert len({tuple(t) for t in outputs[0].values()}) > 1  # requests differ: the model is not degenerate


def test_real_log_is_scored_by_the_simulator_metrics(engine):
    trace = tinyllm(4, 10, 40, 6, 6, seed=2, vocab=1024)
    run = engine.run(trace, policies.make("chunked", 8, 2))
    log = run.log
    assert [len(t) for t in log.tokens.values()] == [6] * 4
    starts = [c.start for c in log.calls]
    assert starts == sorted(starts) and all(c.end >= c.start for c in log.calls)
    chunks = [c for c in log.calls if c.kind == "prefill"]
    assert all(c.tokens <= 8 for c in chunks)
    assert sum(c.tokens for c in chunks) == sum(r.prompt_len for r in trace.requests)
    m = score(log)
    assert m["completed"] == 4 and m["total_output_tokens"] == 24
    assert m["decode_gap_max_ms"] > 0 and m["output_throughput"] > 0


def test_metile_ab_runs_with_a_prefilled_request(engine):
    trace = metile_ab(48, 6)
    for name, order in (("fifo", "chunk-first"), ("eager", "chunk-first"), ("chunked", "decode-first")):
        run = engine.run(trace, policies.make(name, 16, 2, "single", order))
        assert [len(run.outputs[r]) for r in ("A", "B")] == [6, 6]
        prefills = [c for c in run.log.calls if c.kind == "prefill"]
        assert all(c.rids == ("B",) for c in prefills)  # A's prefill happened before the clock
        m = score(run.log)
        assert m["total_output_tokens"] == 11 and m["resume_gap_max_ms"] > 0


def _buffers(engine) -> tuple:
    """The real caches' buffer sizes: the batch's rows, `_idx` and capacity, each own cache's capacity."""
    b = engine.batch.cache[0] if engine.batch.cache else None
    own = {rid: c[0].keys.shape[2] for rid, c in engine.caches.items() if c[0].keys is not None}
    return tuple(engine.batch.ids), (b._idx, b.keys.shape[2]) if b is not None else (0, 0), own


@pytest.mark.parametrize("setting", SETTINGS + [{"policy": "eager", "batch_size": 3, "order": "decode-first"}])
def test_kv_buffer_sizes_follow_mlx_lm_call_by_call(engine, setting):
    """sim.engine.kvcache follows mlx-lm's buffers exactly: after every call the batch cache's rows,
    `_idx` and capacity and every request's own capacity are what the engine state says, over
    prompts that cross the 256-token growth step, joins, leaves and single decodes."""
    trace = tinyllm(6, 30, 300, 3, 40, seed=4, vocab=1024)
    seen = []

    def check(state):
        rows, batch, own = _buffers(engine)
        kv = state.kv
        assert (rows, batch) == (kv.rows, (kv.idx, kv.cap))
        assert own == {rid: kv.own[rid] for rid in own}
        seen.append(state.log.calls[-1].written)

    engine.run(trace, policies.make(**setting), on_call=check)
    assert any(seen)  # some calls grew or rebuilt a buffer


@pytest.mark.parametrize("setting", SETTINGS)
def test_simulated_calls_write_the_buffers_the_real_ones_do(engine, setting):
    """With every request at t=0 the policy's decisions do not depend on time, so the simulator
    makes the real engine's calls: the same shapes, KV rows written and fresh memory, with the
    process warmed by the same warm-up run first; and relogging the real log derives them again."""
    from sim.cost.model import LinearCostModel
    from sim.engine.log import EventLog
    from sim.replay import simulate, warmed
    from sim.engine.relog import relog
    trace, warm = tinyllm(5, 20, 280, 2, 12, seed=6, vocab=1024), tinyllm(2, 30, 60, 3, 3, seed=7, vocab=1024)
    policy = policies.make(**setting)
    engine.heap = Heap()  # a process that has freed nothing yet
    engine.run(warm, policy)
    real = engine.run(trace, policy).log.calls
    cost = LinearCostModel((1e-3, 1e-5, 1e-8), (1e-3, 1e-4, 1e-7), copy=1e-6, fresh=1e-6)
    sim = simulate(trace, policy, cost, warmup=warm).calls
    shape = lambda c: (c.kind, c.rids, c.tokens, c.prefix, c.contexts, c.joined, c.left, c.written, c.fresh, c.batched)
    assert [shape(c) for c in sim] == [shape(c) for c in real]
    assert any(c.written and not c.fresh for c in real)  # reused memory
    if setting.get("decode") != "single":  # batch arrays outgrow the warm-up's: fresh memory
        assert any(c.fresh for c in real)
    bare = EventLog()
    for c in real:  # a log from before KV buffers were logged
        bare.add(c._replace(written=0, fresh=0))
    again = relog(trace, bare, heap=warmed(warm, policy, cost))
    assert [shape(c) for c in again.calls] == [shape(c) for c in real]


def test_adaptive_budgets_make_the_simulators_calls(engine):
    """auto:MS and idle_budget whole on the real executor: the policy decides by the cost model it
    was built with and the state alone, so with every request arriving at t=0 the real engine makes
    exactly the simulator's calls (same iterations, chunks, prefixes, batches), though its calls
    take other times than those prices."""
    from sim.cost.model import LinearCostModel
    from sim.replay import simulate
    trace = tinyllm(5, 20, 90, 4, 8, seed=5, vocab=1024)
    cost = LinearCostModel((2e-3, 1e-4, 1e-7, 0.0), (3e-3, 2e-4, 1e-7), 1e-4, copy=1e-6)
    shape = lambda log: [(c.kind, c.rids, c.tokens, c.prefix, c.iteration) for c in log.calls]
    for s in ({"policy": "chunked", "budget": "auto:6", "batch_size": 2},
              {"policy": "chunked", "budget": "auto:9", "batch_size": 3, "order": "decode-first",
               "idle_budget": "whole"},
              {"policy": "chunked", "budget": 16, "batch_size": 2, "idle_budget": "whole"}):
        real = RealEngine(engine.lm).run(trace, policies.make(**s, cost=cost))
        predicted = simulate(trace, policies.make(**s, cost=cost), cost)
        assert shape(real.log) == shape(predicted)
        chunks = [c.tokens for c in real.log.calls if c.kind == "prefill"]
        assert sum(chunks) == sum(r.prompt_len for r in trace.requests)
        if s["budget"] != 16:
            assert len(set(chunks)) > 3  # the chunk adapts to the prefix and the batch
        else:  # the first request prefills alone: its whole prompt in one call
            assert chunks[0] == trace.requests[0].prompt_len > 16


def test_each_call_counts_its_own_page_faults(engine, monkeypatch):
    """The real engine counts each call's minor page faults (`EventLog.faults`, one per call): here
    every batch sync first maps 8 MiB of fresh memory, as a join that meets fresh memory does, so
    each logged sync has at least one fault per (huge) page of it and its step is counted apart;
    the counts survive the log's file and a relog, and the per-call table says which calls faulted."""
    from calibrate.engine.kernels import DecodeBatch
    from calibrate.measure.speed_probe import allocation_seconds
    from sim.cost.model import LinearCostModel
    from sim.engine.log import EventLog
    from sim.engine.relog import relog
    from sim.engine.memory import kv_bytes_per_token
    from sim.metrics.residuals import FAULTED, residual_table
    import resource
    sync = DecodeBatch.sync

    def faulting_sync(self, ids, caches):
        allocation_seconds(8 << 20)
        return sync(self, ids, caches)
    monkeypatch.setattr(DecodeBatch, "sync", faulting_sync)
    trace = tinyllm(4, 10, 40, 6, 6, seed=2, vocab=1024)
    log = engine.run(trace, policies.make("eager", batch_size=4)).log
    calls, faults = log.calls, log.faults
    assert len(faults) == len(calls) and min(faults) >= 0
    pages = (8 << 20) // (2 << 20)  # a fault per page at least, huge pages included
    synced = [i for i, c in enumerate(calls) if c.kind == "sync"]
    assert synced and all(faults[i] >= pages for i in synced)
    assert sum(faults[i + 1] for i in synced) < sum(faults[i] for i in synced)  # the step after is its own
    kept = EventLog.from_dict(log.to_dict())
    assert kept.faults == faults and relog(trace, kept).faults == faults
    rows = residual_table([kept], LinearCostModel((1e-3, 0.0, 0.0), (1e-3, 0.0, 0.0)), by_size=False)
    join = next(r for r in rows if r["kind"] == "join")
    assert join["faulted"] == sum(1 for i in synced if calls[i].joined and faults[i] >= FAULTED)
    assert (join["faulted_ratio_median"] is None) == (join["faulted"] == 0)
    assert "fresh_rows" not in join  # a cost model that does not know a KV row's bytes
    # in token-rows: the faults at the host's page, beside the rows `sim.engine.heap` gave the same calls
    assert kept.fault_bytes == resource.getpagesize()
    row = kv_bytes_per_token(engine.lm.config, engine.lm.dtype)
    rows = residual_table([kept], LinearCostModel((1e-3, 0.0, 0.0), (1e-3, 0.0, 0.0), kv_bytes=row), by_size=False)
    join = next(r for r in rows if r["kind"] == "join")
    joins = [i for i in synced if calls[i].joined]
    assert join["faulted_rows"] == pytest.approx(sum(faults[i] for i in joins) * resource.getpagesize() / row)
    assert join["faulted_rows"] >= 8 * 2**20 / row * len(joins)  # the 8 MiB each one mapped
    assert join["fresh_rows"] == sum(calls[i].fresh for i in joins)
    assert join["fresh_rows_error"] >= abs(join["fresh_rows"] - join["faulted_rows"])

"""Queue order on the real engine (MLX, qwen3-tiny): the same policy object on the same engine state
makes the same calls as in the simulator, in the order the queue names."""
import pytest

import policies
from calibrate.engine.executor import RealEngine
from calibrate.engine.model import build_model
from sim.cost.model import LinearCostModel
from sim.metrics.scoring import log_class_metrics
from sim.replay import simulate
from traces.generators import tinyllm
from traces.trace import Request, Trace

SETTINGS = [
    {"policy": "fifo", "queue": "sjf"},
    {"policy": "chunked", "budget": 8, "batch_size": 2, "queue": "priority"},
    {"policy": "eager", "batch_size": 3, "queue": "sjf", "order": "decode-first"},
    {"policy": "chunked", "budget": 16, "batch_size": 4, "queue": "priority", "decode": "single"},
]


@pytest.fixture(scope="module")
def engine():
    return RealEngine(build_model("qwen3-tiny"))


def classed(trace: Trace) -> Trace:
    """Every other request in class tight (TTFT target shortest for the latest), the rest bulk."""
    n = len(trace.requests)
    return Trace([Request(r.id, r.arrival, r.prompt_len, r.output_len, r.prompt_ids, cls="tight" if i % 2 else "bulk",
                          ttft_slo_ms=float(1000 * (n - i)) if i % 2 else None)
                  for i, r in enumerate(trace.requests)])


@pytest.mark.parametrize("setting", SETTINGS)
def test_real_engine_serves_the_queue_order_the_simulator_predicts(engine, setting):
    """With every request at t=0 (and far from the aging bound) the decisions do not depend on time,
    so the simulated and the real runs make the same calls; and the prompts start in the queue's order."""
    trace = classed(tinyllm(6, 10, 90, 2, 6, seed=5, vocab=1024))
    policy = policies.make(**setting)
    real = engine.run(trace, policy)
    cost = LinearCostModel((1e-3, 1e-5, 1e-8), (1e-3, 1e-4, 1e-7), copy=1e-6, fresh=1e-6)
    sim = simulate(trace, policy, cost)
    shape = lambda c: (c.kind, c.rids, c.tokens, c.prefix, c.contexts, c.joined, c.left, c.batched)
    assert [shape(c) for c in sim.calls] == [shape(c) for c in real.log.calls]
    started = list(dict.fromkeys(c.rids[0] for c in real.log.calls if c.kind == "prefill"))
    reqs = {r.id: r for r in trace.requests}
    key = (lambda r: r.prompt_len) if setting["queue"] == "sjf" else \
        (lambda r: (r.ttft_slo_ms is None, r.ttft_slo_ms or 0.0))
    assert started == sorted(started, key=lambda rid: (key(reqs[rid]), int(rid)))
    assert started != sorted(started, key=int)  # the order did change something
    assert {rid: len(t) for rid, t in real.outputs.items()} == {r.id: r.output_len for r in trace.requests}
    by_class = log_class_metrics(trace, real.log)
    assert by_class["tight"]["completed"] == 3 and by_class["bulk"]["completed"] == 3


def test_queue_order_does_not_change_greedy_tokens(engine):
    trace = classed(tinyllm(4, 10, 50, 3, 5, seed=8, vocab=1024))
    outs = [engine.run(trace, policies.make(**s)).outputs for s in [{"policy": "chunked", "budget": 8}] + SETTINGS]
    assert all(o == outs[0] for o in outs[1:])

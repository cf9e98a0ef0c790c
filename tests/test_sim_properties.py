"""Invariants of the simulator over random traces, policies, budgets and batch sizes."""
from collections import defaultdict

from hypothesis import given, settings, strategies as st

import policies
from sim.costmodel import LinearCostModel
from sim.replay import simulate
from traces.trace import Request, Trace


@st.composite
def traces(draw):
    n = draw(st.integers(1, 8))
    gaps = draw(st.lists(st.floats(0, 5, allow_nan=False), min_size=n, max_size=n))
    reqs, t = [], 0.0
    for i, g in enumerate(gaps):
        t += g
        out = draw(st.integers(1, 12))
        reqs.append(Request(str(i), t, draw(st.integers(1, 300)), out,
                            prefilled=out >= 2 and draw(st.booleans()) and i == 0))
    return Trace(reqs)


settings_ = st.fixed_dictionaries({
    "policy": st.sampled_from(list(policies.POLICIES)),
    "budget": st.integers(1, 256),
    "batch_size": st.integers(1, 6),
    "decode": st.sampled_from(["batched", "single"]),
    "order": st.sampled_from(["chunk-first", "decode-first"]),
})
costs = st.builds(
    LinearCostModel,
    st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6)),
    st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6)),
    st.floats(0, 1e-3), st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-4), st.floats(0, 1e-6)),
    st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-4), st.floats(0, 1e-6)))


@settings(max_examples=150, deadline=None)
@given(traces(), settings_, costs)
def test_invariants(trace, setting, cost):
    log = simulate(trace, policies.make(**setting), cost)
    reqs = {r.id: r for r in trace.requests}

    # every request gets exactly its output budget
    assert {rid: len(t) for rid, t in log.tokens.items()} == {r.id: r.output_len for r in trace.requests}

    # time never goes backwards; no call starts before the previous one ended
    prev_end = 0.0
    for c in log.calls:
        assert prev_end <= c.start <= c.end
        prev_end = c.end
    for t in log.tokens.values():
        assert t == sorted(t)

    # chunks tile each prompt exactly, in order, and never exceed the budget
    done_prefill: dict[str, float] = {}
    covered = defaultdict(int)
    for c in log.calls:
        if c.kind == "prefill":
            (rid,) = c.rids
            assert c.start >= reqs[rid].arrival
            assert c.prefix == covered[rid]
            covered[rid] += c.tokens
            if setting["policy"] != "eager":
                assert c.tokens <= setting["budget"]
            if covered[rid] == reqs[rid].prompt_len:
                done_prefill[rid] = c.end
    for r in trace.requests:
        assert covered[r.id] == (0 if r.prefilled else r.prompt_len)
        if r.prefilled:
            done_prefill[r.id] = r.arrival

    # no decode before the request's prefill ended; batches never exceed the batch size
    for c in log.calls:
        if c.kind == "decode":
            assert len(c.rids) <= max(1, setting["batch_size"] if setting["policy"] != "fifo" else 1)
            for rid in c.rids:
                assert c.start >= done_prefill[rid]

    # the first token comes from the last prefill chunk
    for r in trace.requests:
        if not r.prefilled:
            assert log.tokens[r.id][0] == done_prefill[r.id]

    # the same inputs give the same log
    again = simulate(trace, policies.make(**setting), cost)
    assert again.to_dict() == log.to_dict()

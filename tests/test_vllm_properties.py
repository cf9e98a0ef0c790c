"""The `vllm` policy's invariants over random traces, settings and prices (hypothesis): every
token accounted for, the token budget and max_num_seqs never exceeded, no decode before its
prompt's last row, time never backwards, steady stretches equal to the forward-by-forward log,
and a KV limit never exceeded."""
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
from sim.cost.model import LinearCostModel
from sim.replay import simulate
from traces.trace import Request, Trace


@st.composite
def traces(draw):
    n, t, reqs = draw(st.integers(1, 7)), 0.0, []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.3, 2.0]))
        reqs.append(Request(str(i), t, draw(st.integers(1, 200)), draw(st.integers(1, 9))))
    return Trace(reqs)


options = st.fixed_dictionaries({
    "max_num_seqs": st.integers(1, 5),
    "max_num_batched_tokens": st.integers(5, 300),
    "long_prefill_token_threshold": st.sampled_from([0, 0, 3, 17, 64]),
}).filter(lambda o: o["max_num_batched_tokens"] >= o["max_num_seqs"])
costs = st.builds(lambda a, b, c, d, e, it: LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 0.0), it,
                                                           mixed_coef=(a, b, c, d, e)),
                  st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6), st.floats(0, 1e-5),
                  st.floats(0, 1e-3), st.floats(0, 1e-3))


@settings(max_examples=150, deadline=None)
@given(traces(), options, costs, st.sampled_from([None, 600, 250]))
def test_invariants(trace, opts, cost, kv_limit):
    fits = kv_limit is None or all(r.prompt_len + r.output_len - 1 <= kv_limit for r in trace.requests)
    if not fits:
        return
    log = simulate(trace, policies.make("vllm", **opts, kv_limit=kv_limit), cost)
    reqs = {r.id: r for r in trace.requests}
    assert {rid: len(t) for rid, t in log.tokens.items()} == {r.id: r.output_len for r in trace.requests}
    prev, done_prompt = 0.0, {}
    for c in log.calls:
        assert prev <= c.start <= c.end
        prev = c.end
        if c.kind == "preempt":  # its cache freed: it recomputes its prompt and outputs but the last
            done_prompt.pop(c.rids[0], None)
            continue
        assert sum(c.chunks) <= opts["max_num_batched_tokens"] and len(c.rids) <= opts["max_num_seqs"]
        assert len(set(c.rids)) == len(c.rids)
        for rid, n, cached in zip(c.rids, c.chunks, c.contexts):
            assert c.start >= reqs[rid].arrival
            emitted = sum(t < c.end for t in log.tokens[rid])
            if rid in done_prompt:  # a decode row: one token, after its prompt's last row
                assert n == 1 and c.start >= done_prompt[rid]
            elif cached + n == reqs[rid].prompt_len + max(0, emitted - 1):  # a prompt (or a recompute) done
                done_prompt[rid] = c.end
            thr = opts["long_prefill_token_threshold"]
            assert rid in done_prompt and n == 1 or not thr or n <= thr
    for t in log.tokens.values():
        assert t == sorted(t)
    again = simulate(trace, policies.make("vllm", **opts, kv_limit=kv_limit), cost, steady=False)
    assert again.calls == log.calls and again.tokens == log.tokens


@settings(max_examples=60, deadline=None)
@given(traces(), options, costs)
def test_a_kv_limit_is_never_exceeded_and_every_run_ends(trace, opts, cost):
    limit = max(r.prompt_len + r.output_len - 1 for r in trace.requests) + 10
    log = simulate(trace, policies.make("vllm", **opts, kv_limit=limit), cost)
    held, cached = 0, {}
    for c in log.calls:
        if c.kind == "preempt":
            held -= cached.pop(c.rids[0])
            continue
        for rid, n in zip(c.rids, c.chunks):
            cached[rid] = cached.get(rid, 0) + n
            held += n
        assert held <= limit
        for rid in c.rids:  # a request's cache goes when it finishes
            r = next(r for r in trace.requests if r.id == rid)
            if len([t for t in log.tokens[rid] if t <= c.end]) == r.output_len:
                held -= cached.pop(rid)
    assert sum(len(t) for t in log.tokens.values()) == sum(r.output_len for r in trace.requests)

"""The mlx-lm policy in the simulator: invariants over random traces and options (no MLX here;
tests/test_mlxlm_engine.py holds it against the real BatchGenerator)."""
from collections import defaultdict

import pytest
from hypothesis import given, settings, strategies as st

import policies
from policies.mlxlm import MlxLm, check_version, server_command
from sim.cost.model import LinearCostModel
from sim.metrics.scoring import score
from sim.replay import simulate
from sim.engine.relog import relog
from traces.trace import Request, Trace


@st.composite
def traces(draw):
    n = draw(st.integers(1, 10))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.05, 1.0]))
        reqs.append(Request(str(i), t, draw(st.integers(1, 90)), draw(st.integers(1, 12))))
    return Trace(reqs)


options = st.fixed_dictionaries({"prefill_step": st.integers(1, 64), "prompt_concurrency": st.integers(1, 5),
                                 "decode_concurrency": st.integers(1, 6)})
costs = st.builds(LinearCostModel, st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6)),
                  st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6)), st.floats(0, 1e-3),
                  copy=st.floats(0, 1e-5), fresh=st.floats(0, 1e-5))


@settings(max_examples=200, deadline=None)
@given(traces(), options, costs)
def test_invariants(trace, opts, cost):
    policy = policies.make("mlx-lm", **opts)
    log = simulate(trace, policy, cost)
    reqs = {r.id: r for r in trace.requests}
    c_max, p = policy.completion_batch_size, opts["prompt_concurrency"]

    # tokens conserved: every request gets exactly its output budget, in time order
    assert {rid: len(t) for rid, t in log.tokens.items()} == {r.id: r.output_len for r in trace.requests}
    assert all(t == sorted(t) for t in log.tokens.values())
    # time never goes backwards; calls do not overlap
    prev = 0.0
    for c in log.calls:
        assert prev <= c.start <= c.end
        prev = c.end
    # prompt chunks tile every prompt but its last token, in order, never above the step per row;
    # then one first forward; generation steps only after it; at most P rows prefill together
    covered, first_at, steps = defaultdict(int), {}, defaultdict(int)
    for c in log.calls:
        assert c.kind in ("prompt", "first", "generate")
        if c.kind == "prompt":
            assert len(c.rids) <= p and len(c.chunks) == len(c.rids) and c.tokens == max(c.chunks)
            for rid, n, cached in zip(c.rids, c.chunks, c.contexts):
                assert c.start >= reqs[rid].arrival and rid not in first_at
                assert 1 <= n <= opts["prefill_step"] and cached == covered[rid]
                covered[rid] += n
        elif c.kind == "first":
            for rid in c.rids:
                assert covered[rid] == reqs[rid].prompt_len - 1 and rid not in first_at
                first_at[rid] = c.iteration
        else:
            assert len(c.rids) <= c_max + p - 1
            for rid in c.rids:
                assert first_at[rid] < c.iteration
                steps[rid] += 1
    assert set(first_at) == set(reqs) and dict(steps) == {r.id: r.output_len for r in trace.requests}
    # a step's tokens come back when its next() returns: at the end of its iteration
    ends = {}
    for c in log.calls:
        ends[c.iteration] = c.end
    for c in log.calls:
        if c.kind == "generate":
            for rid in c.rids:
                assert ends[c.iteration] in log.tokens[rid]
    assert all(0 <= c.fresh <= c.written for c in log.calls)
    # deterministic, and the measured-log path (relog) derives the same log from the calls alone
    assert simulate(trace, policies.make("mlx-lm", **opts), cost).to_dict() == log.to_dict()
    again = relog(trace, log, cost.fresh_heap(), counts=cost.prices_kv)  # the heap only where the profile prices fresh memory
    assert again.calls == log.calls and again.tokens == log.tokens
    m = score(log)
    assert m["completed"] == len(trace.requests)


def test_a_full_generation_batch_stops_admission_and_prefill():
    """BatchGenerator's early return: with the generation batch at its limit after a step, the
    waiting request is not admitted and nothing prefills until a row leaves."""
    trace = Trace([Request("a", 0.0, 4, 6), Request("b", 0.0, 4, 6), Request("c", 0.0, 40, 2)])
    cost = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 0.0))
    log = simulate(trace, policies.make("mlx-lm", prefill_step=8, prompt_concurrency=2, decode_concurrency=2), cost)
    its = defaultdict(list)
    for c in log.calls:
        its[c.iteration].append((c.kind, c.rids, c.chunks))
    seq = [its[i] for i in sorted(its)]
    assert seq[0] == [("prompt", ("a", "b"), (3, 3))]
    assert seq[1] == [("first", ("a", "b"), ())]
    # a and b generate 6 tokens: c waits for a slot through all of them but the last
    assert all(calls == [("generate", ("a", "b"), ())] for calls in seq[2:7])
    assert seq[7] == [("generate", ("a", "b"), ()), ("prompt", ("c",), (8,))]
    assert [k for k, *_ in log.calls[-1:]] == ["generate"]


def test_the_held_back_token_and_the_pipeline():
    """A prompt of L tokens prefills L - 1; its last token runs in the first forward; token j comes
    back from the j-th step after it, whose forward attends L + j tokens; a 1-token prompt goes
    straight to its first forward."""
    trace = Trace([Request("a", 0.0, 10, 3), Request("b", 0.0, 1, 2)])
    cost = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 0.0))
    log = simulate(trace, policies.make("mlx-lm", prefill_step=4), cost)
    calls = [(c.iteration, c.kind, c.rids, c.chunks or c.contexts) for c in log.calls]
    assert calls == [(1, "first", ("b",), (1,)), (1, "prompt", ("a",), (4,)),
                     (2, "generate", ("b",), (2,)), (2, "prompt", ("a",), (4,)),
                     (3, "generate", ("b",), (3,)), (3, "prompt", ("a",), (1,)),
                     (4, "first", ("a",), (10,)),
                     (5, "generate", ("a",), (11,)), (6, "generate", ("a",), (12,)), (7, "generate", ("a",), (13,))]
    assert log.tokens["b"] == [log.calls[3].end, log.calls[5].end]  # the end of each next(), after its prompt call
    assert score(log)["completed"] == 2


def test_bad_options_and_versions():
    for bad in ({"prompt_concurrency": 0}, {"decode_concurrency": 0}, {"prefill_step": -1}):
        with pytest.raises(policies.PolicyError, match="must be a whole number >= 1"):
            policies.make("mlx-lm", **bad)
    with pytest.raises(policies.PolicyError, match="unknown policy option 'batch'"):
        policies.make("mlx-lm", batch=3)
    with pytest.raises(policies.PolicyError, match="takes no prefill_step"):
        policies.make("chunked", 16, prefill_step=8)
    assert MlxLm(prompt_concurrency=8, decode_concurrency=2).completion_batch_size == 8
    assert check_version("0.32.2") == []
    with pytest.raises(policies.PolicyError, match="mlx-lm 0.99.0 is installed.*--any-mlx-lm"):
        check_version("0.99.0")
    assert check_version("0.99.0", allow=True)
    assert server_command({"prefill_step": 128, "prompt_concurrency": 4, "decode_concurrency": 8}, "M") == \
        "mlx_lm.server --model M --prefill-step-size 128 --prompt-concurrency 4 --decode-concurrency 8"


def test_a_prefilled_request_is_refused():
    trace = Trace([Request("a", 0.0, 8, 3, prefilled=True)])
    with pytest.raises(policies.PolicyError, match="prefilled before the clock"):
        simulate(trace, policies.make("mlx-lm"), LinearCostModel((1e-3, 0, 0), (1e-3, 0, 0)))


@settings(max_examples=150, deadline=None)
@given(traces(), options, costs)
def test_steady_stretches_write_the_call_by_call_log(trace, opts, cost):
    """Steps of an unchanged generation batch priced as one stretch give exactly the log of the
    call-by-call replay (its calls, their floats, every token's time)."""
    bulk = simulate(trace, policies.make("mlx-lm", **opts), cost)
    one_by_one = simulate(trace, policies.make("mlx-lm", **opts), cost, steady=False)
    assert bulk.calls == one_by_one.calls
    assert bulk.tokens == one_by_one.tokens

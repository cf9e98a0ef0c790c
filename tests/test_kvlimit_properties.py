"""Invariants of the KV-cache limit over random traces, settings, limits and cost models: tokens
conserved across preemptions, the limit never exceeded, no decode before its (re)prefill ends,
the newest request preempted, every run deterministic and its steady stretches exact."""
from collections import defaultdict

import pytest
from hypothesis import given, settings, strategies as st

import policies
from sim.cost.model import LinearCostModel
from sim.metrics.scoring import score
from sim.replay import simulate
from sim.engine.relog import relog
from sim.engine.kvlimit import KVLimitError
from sim.engine.state import EngineState
from traces.trace import Request, Trace

PDSIM_POLICIES = [name for name, info in policies.POLICIES.items() if info.engine == "pdsim"]


@st.composite
def cases(draw):
    """A trace, a setting and a limit from its largest request's cache to a few times it."""
    n = draw(st.integers(1, 8))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.floats(0, 2, allow_nan=False) | st.just(0.0))
        out = draw(st.integers(1, 60))
        reqs.append(Request(str(i), t, draw(st.integers(1, 80)), out,
                            prefilled=i == 0 and out >= 2 and draw(st.booleans()),
                            ttft_slo_ms=draw(st.none() | st.floats(10, 5000))))  # read by queue priority
    trace = Trace(reqs)
    peak = max(r.prompt_len + r.output_len - 1 for r in reqs)
    limit = draw(st.integers(peak, peak + peak // 2 + 8) | st.integers(peak, 3 * peak))  # tight ones preempt
    setting = draw(st.fixed_dictionaries({
        "policy": st.sampled_from(PDSIM_POLICIES), "budget": st.integers(1, 64), "batch_size": st.integers(1, 6),
        "decode": st.sampled_from(["batched", "single"]), "order": st.sampled_from(["chunk-first", "decode-first"]),
        "queue": st.sampled_from(["fcfs", "sjf", "priority"]), "aging_s": st.sampled_from([0.5, 30.0])}))
    return trace, dict(setting, kv_limit=limit)


costs = st.builds(LinearCostModel, st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6)),
                  st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6)), st.floats(0, 1e-3))


def shape(c):
    return c.kind, c.start, c.end, c.rids, c.tokens, c.prefix, c.contexts, c.joined, c.left, c.written, c.fresh


@settings(max_examples=200, deadline=None)
@given(cases(), costs)
def test_preemption_invariants(case, cost):
    trace, setting = case
    limit = setting["kv_limit"]
    policy = policies.make(**setting)
    log = simulate(trace, policy, cost)
    reqs = {r.id: r for r in trace.requests}
    order = {r.id: i for i, r in enumerate(trace.requests)}
    calls = log.calls

    # tokens conserved: every request emits exactly its output budget, in time order; a recompute emits none
    assert {rid: len(t) for rid, t in log.tokens.items()} == {r.id: r.output_len for r in trace.requests}
    assert all(t == sorted(t) for t in log.tokens.values())

    # time monotone
    prev = 0.0
    for c in calls:
        assert prev <= c.start <= c.end
        prev = c.end

    # follow every cache from the log alone: the limit holds after every call, prefills tile each
    # (re)prefill from 0, no decode before its prefill ends, the preempted request is the newest holding
    # a cache, it frees exactly what it held, and it resumes before any prompt not yet begun (every queue order)
    cache = {r.id: r.prompt_len for r in trace.requests if r.prefilled}  # tokens held, by request
    done = {r.id for r in trace.requests if r.prefilled}  # prefill (or recompute) finished
    emitted = defaultdict(int, {r.id: 1 for r in trace.requests if r.prefilled})
    recomputed = prefilled_tokens = 0
    waiting, begun = set(), set()  # preempted and not resumed yet; every request whose prefill began
    for c in calls:
        if c.kind == "preempt":
            (rid,) = c.rids
            assert rid in cache and max(cache, key=order.get) == rid
            assert c.tokens == cache.pop(rid)
            done.discard(rid)
            waiting.add(rid)
            recomputed += c.tokens
            continue
        if c.kind == "prefill":
            (rid,) = c.rids
            assert rid not in done and c.prefix == cache.get(rid, 0)
            assert c.start >= reqs[rid].arrival
            assert rid in waiting or rid in begun or not waiting, f"{rid} began while {waiting} waited to resume"
            waiting.discard(rid)
            begun.add(rid)
            cache[rid] = c.prefix + c.tokens
            prefilled_tokens += c.tokens
            target = reqs[rid].prompt_len + max(0, emitted[rid] - 1)
            assert cache[rid] <= target
            if cache[rid] == target:
                done.add(rid)
                if emitted[rid] == 0:
                    emitted[rid] = 1  # the first token; a recompute emits none
                if emitted[rid] == reqs[rid].output_len:
                    del cache[rid]
        elif c.kind == "decode":
            for rid in c.rids:
                assert rid in done, f"decode of {rid} before its prefill ended"
                cache[rid] += 1
                emitted[rid] += 1
        assert sum(cache.values()) <= limit, f"{sum(cache.values())} tokens cached after {c}, limit {limit}"
        if c.kind == "decode":
            for rid in c.rids:
                if emitted[rid] == reqs[rid].output_len:
                    del cache[rid]
    assert dict(emitted) == {r.id: r.output_len for r in trace.requests}
    assert not cache

    # the metrics count the preemptions and every recomputed token, once
    m = score(log)
    assert m["preemptions"] == sum(c.kind == "preempt" for c in calls)
    assert m["recomputed_tokens"] == recomputed
    assert prefilled_tokens == sum(r.prompt_len for r in trace.requests if not r.prefilled) + recomputed
    assert m["engine_calls"] == len(calls) - m["preemptions"]

    # deterministic, and steady stretches give exactly the call-by-call log
    again = simulate(trace, policies.make(**setting), cost, steady=False)
    assert [shape(c) for c in again.calls] == [shape(c) for c in calls]
    assert again.tokens == log.tokens

    # a log's preemptions replay through the state machine (`relog`, as a measured run's are)
    assert [shape(c) for c in relog(trace, log, cost.fresh_heap(), counts=cost.prices_kv).calls] == [shape(c) for c in calls]


@settings(max_examples=60, deadline=None)
@given(cases(), costs)
def test_no_limit_is_the_run_without_one(case, cost):
    """A limit no iteration reaches changes nothing: the same calls as no limit at all."""
    trace, setting = case
    room = sum(r.prompt_len + r.output_len for r in trace.requests)
    free = simulate(trace, policies.make(**dict(setting, kv_limit=None)), cost)
    roomy = simulate(trace, policies.make(**dict(setting, kv_limit=room)), cost)
    assert [shape(c) for c in roomy.calls] == [shape(c) for c in free.calls]


def test_a_limit_forces_preemptions_and_recomputes():
    """Five requests at t=0 with long outputs: every one is admitted, then decodes outgrow the limit."""
    reqs = [Request(str(i), 0.0, 20, 30) for i in range(5)]
    cost = LinearCostModel((1e-3, 1e-5, 1e-8), (1e-3, 1e-4, 1e-7))
    log = simulate(Trace(reqs), policies.make("chunked", 16, 4, kv_limit=120), cost)
    m = score(log)
    assert m["preemptions"] >= 2 and m["recomputed_tokens"] > 0 and m["completed"] == 5
    first = next(c for c in log.calls if c.kind == "preempt")
    assert first.rids == ("3",)  # the newest of the four decoding (the fifth is waiting, holding none)


@pytest.mark.parametrize("prompt,output,fits", [(100, 1, True), (100, 2, False), (99, 2, True), (60, 41, True),
                                                (60, 42, False)])
def test_a_request_that_can_never_fit_is_refused_before_the_run(prompt, output, fits):
    """A request's cache holds prompt + output - 1 tokens at its last decode (the last token is never written)."""
    trace = Trace([Request("a", 0.0, prompt, output)])
    if fits:
        EngineState(trace, kv_limit=100)
    else:
        with pytest.raises(KVLimitError, match="request a needs .* tokens of KV cache"):
            EngineState(trace, kv_limit=100)

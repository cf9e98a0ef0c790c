"""Invariants of the simulator over random traces, policies, budgets and batch sizes."""
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import policies
from sim.cost.curve import Curve
from sim.cost.grid import GridCostModel
from sim.cost.model import LinearCostModel
from sim.engine.log import EventLog
from sim.metrics.scoring import inter_token_gaps
from sim.cost.noise import CallNoise
from sim.replay import simulate
from sim.engine.state import EngineState
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


# pdsim's own loops; mlx-lm's BatchGenerator makes other calls (several prompts per call), and its
# invariants are tests/test_mlxlm_sim.py's
PDSIM_POLICIES = [name for name, info in policies.POLICIES.items() if info.engine == "pdsim"]
settings_ = st.fixed_dictionaries({
    "policy": st.sampled_from(PDSIM_POLICIES),
    "budget": st.integers(1, 256),
    "batch_size": st.integers(1, 6),
    "decode": st.sampled_from(["batched", "single"]),
    "order": st.sampled_from(["chunk-first", "decode-first"]),
})
curves = st.one_of(st.none(), st.lists(st.tuples(st.integers(1, 300), st.floats(1e-4, 0.05)), min_size=1, max_size=4,
                                       unique_by=lambda p: p[0]).map(lambda ps: Curve(*zip(*sorted(ps)))))
costs = st.builds(
    LinearCostModel,
    st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6), st.floats(0, 1e-5)),
    st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-3), st.floats(0, 1e-6), st.floats(0, 1e-6)),
    st.floats(0, 1e-3), st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-4), st.floats(0, 1e-6)),
    st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-4), st.floats(0, 1e-6)), curves, curves,
    st.one_of(st.just(float("inf")), st.floats(1, 400)),  # decode knot
    st.one_of(st.none(), st.floats(0, 2e-6)))  # a lone request's slope


# call noise (`sim.cost.noise`): None, or quantiles of a factor and a seed
noises = st.one_of(st.none(), st.tuples(st.lists(st.floats(0.5, 2.0), min_size=2, max_size=6).map(sorted),
                                        st.integers(0, 2**31)))


def sampler(noise):
    return None if noise is None else CallNoise(tuple(noise[0]), 1).sampler(noise[1])


@settings(max_examples=150, deadline=None)
@given(traces(), settings_, costs, noises)
def test_invariants(trace, setting, cost, noise):
    log = simulate(trace, policies.make(**setting), cost, noise=sampler(noise))
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
            if setting["policy"] == "chunked":
                assert c.tokens <= setting["budget"]
            else:  # fifo and eager prefill whole prompts
                assert c.prefix == 0 and c.tokens == reqs[rid].prompt_len
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

    # the same inputs (and seed) give the same log
    again = simulate(trace, policies.make(**setting), cost, noise=sampler(noise))
    assert again.to_dict() == log.to_dict()


@st.composite
def long_traces(draw):
    """Fewer, longer requests than `traces`: long decode stretches between arrivals."""
    n = draw(st.integers(1, 5))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.01, 0.1, 1.0])) + draw(st.floats(0, 2))
        out = draw(st.integers(1, 60))
        reqs.append(Request(str(i), t, draw(st.integers(1, 200)), out, prefilled=out >= 2 and i == 0))
    return Trace(reqs)


def grid_costs(decode_coef):
    """A grid cost model over a few points: interpolation inside, the linear form outside."""
    lin = LinearCostModel((2e-3, 1e-4, 1e-7), decode_coef, 1e-4, (1e-3, 1e-4, 1e-7), (1e-3, 0.0, 0.0))
    pf = np.array([[c, p, lin.prefill(c, p) * 1.1] for c in (1, 64, 256) for p in (0, 512)])
    dc = np.array([[b, m, lin.decode([m] * b) * 0.9] for b in (1, 4, 8) for m in (1, 128, 256)])
    return GridCostModel(lin, pf, dc, lin.iteration)


@settings(max_examples=150, deadline=None)
@given(long_traces(), settings_, st.one_of(costs, st.builds(grid_costs, costs.map(lambda c: c.decode_coef[:3]))))
def test_steady_stretches_write_the_call_by_call_log(trace, setting, cost):
    """Pricing a steady stretch of decodes in one step gives exactly the call-by-call log."""
    bulk = simulate(trace, policies.make(**setting), cost)
    one_by_one = simulate(trace, policies.make(**setting), cost, steady=False)
    assert bulk.calls == one_by_one.calls
    assert bulk.tokens == one_by_one.tokens


def test_a_lone_request_decodes_in_stretches_cut_where_its_cache_grows(monkeypatch):
    calls = []
    monkeypatch.setattr(EngineState, "apply_steady",
                        lambda self, *a, _f=EngineState.apply_steady: calls.append(len(a[2][0])) or _f(self, *a))
    cost = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 1e-7), copy=1e-6)
    log = simulate(Trace([Request("a", 0.0, 16, 500)]), policies.make("fifo"), cost)
    # the batch cache is merged at 16 tokens (a sync call), exactly full: the first step grows it
    # to 272, the 257th (at 272 tokens) to 528; the first runs alone (after the sync), the
    # second starts a stretch
    assert calls == [255, 243] and len(log.calls) == 501
    assert [(c.kind, c.joined, c.contexts) for c in log.calls[1:4]] == [("sync", 1, (17,)), ("decode", 0, (17,)),
                                                                         ("decode", 0, (18,))]
    assert [(i, c.written) for i, c in enumerate(log.calls) if c.written] == [(0, 256), (2, 272), (258, 528)]
    grow = log.calls[258]
    assert grow.end - grow.start == pytest.approx(cost.decode(grow.contexts) + 528 * cost.copy)


def test_a_sync_where_requests_only_leave_is_priced_at_the_gather_price():
    """Two requests decode together; the shorter one leaves, and the sync that rebuilds the batch
    without it is its gather (the profile's own price per row) and the leave constant; a join's
    copies stay at `copy`."""
    cost = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 1e-7), copy=3e-6, gather=1e-6,
                           join=(2e-3, 0.0, 0.0), leave=(5e-4, 0.0, 0.0))
    log = simulate(Trace([Request("a", 0.0, 16, 4), Request("b", 0.0, 24, 12)]),
                   policies.make("eager", batch_size=2), cost)
    syncs = [c for c in log.calls if c.kind == "sync" and c.written]
    leave = [c for c in syncs if c.left and not c.joined]
    join = [c for c in syncs if c.joined]
    assert leave and join
    for c in leave:
        assert c.end - c.start == pytest.approx(1e-6 * c.written + 5e-4)
    for c in join:
        assert c.end - c.start == pytest.approx(3e-6 * c.written + cost.membership(c.joined, c.left, c.contexts))


@given(st.lists(st.lists(st.floats(0, 1e6), max_size=5).map(sorted), max_size=6))
def test_pooled_inter_token_gaps_never_span_two_requests(emissions):
    log = EventLog(tokens={str(i): t for i, t in enumerate(emissions)})
    expected = [b - a for t in emissions for a, b in zip(t, t[1:])]
    assert inter_token_gaps(log).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(1, 40)), min_size=1, max_size=8),
       st.sampled_from([{"policy": "chunked", "budget": 48}, {"policy": "eager", "batch_size": 3},
                        {"policy": "fifo"}, {"policy": "chunked", "budget": 16, "decode": "single"}]))
def test_kv_buffers_written_fresh_and_priced(reqs, setting):
    """Every call writes a non-negative number of KV token-rows, of which at most all are fresh,
    and each call's time includes exactly its copies (all at t=0: the same calls either way)."""
    trace = Trace([Request(str(i), 0.0, p, o) for i, (p, o) in enumerate(reqs)])
    cost = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 1e-7), copy=1e-5, fresh=3e-5)
    free = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-4, 1e-7))
    log = simulate(trace, policies.make(**setting), cost, steady=False)
    bare = simulate(trace, policies.make(**setting), free, steady=False)
    assert all(0 <= c.fresh <= c.written for c in log.calls)
    for c, b in zip(log.calls, bare.calls):
        assert (c.end - c.start) == pytest.approx((b.end - b.start) + 1e-5 * c.written + 3e-5 * c.fresh)


@settings(max_examples=120, deadline=None)
@given(traces(), settings_, costs)
def test_resumption_summary_is_the_pairwise_definition(trace, setting, cost):
    """The resumption gaps `score` reports for every trace size equal the quadratic definition."""
    from sim.metrics.scoring import resumption_gaps, resumption_summary
    log = simulate(trace, policies.make(**setting), cost)
    gaps = [g for _, _, g in resumption_gaps(log)]
    top, mean = resumption_summary(log)
    if not gaps:
        assert np.isnan(top) and np.isnan(mean)
    else:
        assert top == max(gaps) and mean == pytest.approx(np.mean(gaps))


@settings(max_examples=100, deadline=None)
@given(traces(), settings_, costs)
def test_a_completed_setting_runs_what_the_raw_one_runs(trace, raw, cost):
    """`policies.settings` gives options a policy does not read one fixed value (fifo: batch size and
    order): the completed setting runs exactly the same work, so merging such settings loses nothing."""
    from policies.settings import setting
    full = setting(raw)
    assert simulate(trace, policies.make(**full), cost).to_dict() == simulate(trace, policies.make(**raw), cost).to_dict()



@pytest.mark.parametrize("setting", [{"policy": "chunked", "budget": 64, "batch_size": 4},
                                     {"policy": "eager", "batch_size": 2}, {"policy": "fifo"},
                                     {"policy": "chunked", "budget": 64, "batch_size": 4, "queue": "sjf"}])
def test_stretches_run_through_arrivals_only_behind_a_first_come_first_served_queue(setting, monkeypatch):
    """Arrivals every 50 ms into an engine that serves a few requests a second: behind a waiting
    prompt in an fcfs queue an arrival queues behind, so stretches run on through arrivals; sjf may
    pick the newcomer, so its stretches stop at each. Either way the log is the call-by-call one."""
    trace = Trace([Request(str(i), 0.05 * i, 300 - 7 * (i % 5), 30) for i in range(40)])
    cost = LinearCostModel((2e-3, 1e-4, 1e-7), (5e-3, 1e-4, 1e-7), 1e-4)
    stretches = []
    monkeypatch.setattr(EngineState, "apply_steady",
                        lambda self, *a, _f=EngineState.apply_steady: stretches.append(a[1][0]) or _f(self, *a))
    bulk = simulate(trace, policies.make(**setting), cost)
    assert bulk.calls == simulate(trace, policies.make(**setting), cost, steady=False).calls
    # iterations of a stretch that started after an arrival that came during the stretch
    through = sum(1 for starts in stretches for r in trace.requests if starts[0] < r.arrival <= starts[-1])
    assert (through > 0) == (setting.get("queue", "fcfs") == "fcfs")

"""Budgets that adapt (`policies.budget`): auto:MS sizes each chunk from the cost model, idle_budget
whole runs the whole prompt when nothing decodes. In the simulator here; on the real engine in
tests/test_engine_real.py and tests/test_confirm.py."""
from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st

import policies
from cli_checks import refused
from policies import PolicyError
from policies.budget import auto_target, largest_fitting, parse_budget
from sim.cost.model import LinearCostModel
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.replay import simulate
from policies.settings import Setting, grid_settings, setting, setting_label
from sim.engine.state import EngineState
from sim.cost.price import host_seconds, iteration_seconds
from sim.engine.work import Prefill
from traces.trace import Request, Trace


@st.composite
def traces(draw, longest=300, outputs=12):
    """Up to 8 requests, spread or together; the first may be prefilled before the clock."""
    n = draw(st.integers(1, 8))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.5])) * draw(st.floats(0, 4))
        out = draw(st.integers(1, outputs))
        reqs.append(Request(str(i), t, draw(st.integers(1, longest)), out,
                            prefilled=out >= 2 and i == 0 and draw(st.booleans())))
    return Trace(reqs)


# per-call costs of a few ms (prefill: per token 0..1 ms, attention up to 1e-6 s per token pair), so
# targets of 0.05..80 ms sometimes bind at 1 token, sometimes never
costs = st.builds(
    LinearCostModel,
    st.tuples(st.floats(1e-4, 0.01), st.floats(0, 1e-3), st.floats(0, 1e-6), st.floats(0, 1e-5)),
    st.tuples(st.floats(1e-4, 0.01), st.floats(0, 1e-3), st.floats(0, 1e-6), st.floats(0, 1e-6)),
    st.floats(0, 1e-3), st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-4), st.floats(0, 1e-6)),
    st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-4), st.floats(0, 1e-6)),
    copy=st.floats(0, 1e-5), fresh=st.floats(0, 1e-5), prefill_tile=st.sampled_from([0, 8, 16]),
    prefill_rem=st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-4)))


@pytest.mark.parametrize("value, canonical", [(32, 32), ("32", 32), (32.0, 32), ("auto:40", "auto:40"),
                                              ("auto:40.0", "auto:40"), ("AUTO:2.5", "auto:2.5"),
                                              ("auto:1e3", "auto:1000"), (None, None)])
def test_budgets_are_written_one_way(value, canonical):
    assert parse_budget(value) == canonical
    assert Setting("chunked", value if value is not None else 8).budget == (canonical if value is not None else 8)


@pytest.mark.parametrize("bad", ["auto:0", "auto:-5", "auto:x", "auto:", "auto:inf", "auto:nan", "0", "-3", "abc",
                                 0, -1, 1 << 60])
def test_bad_budgets_are_refused_naming_the_value(bad):
    with pytest.raises(PolicyError) as e:
        parse_budget(bad)
    assert "budget" in str(e.value) and "\n" not in str(e.value)


def test_labels_and_dicts():
    s = setting({"policy": "chunked", "budget": "auto:40.0", "idle_budget": "whole"})
    assert s == {"policy": "chunked", "budget": "auto:40", "batch_size": 4, "decode": "batched",
                 "order": "chunk-first", "idle_budget": "whole"}
    assert setting_label(s) == "chunked/auto:40/bs4/idle-whole"
    # the default idle budget is not in the dict: settings that do not use it are what they were
    assert setting({"policy": "chunked", "budget": 8}) == {"policy": "chunked", "budget": 8, "batch_size": 4,
                                                            "decode": "batched", "order": "chunk-first"}
    # a table row read back (a CSV cell holds "32", a missing idle budget is NaN)
    assert Setting.of({"policy": "chunked", "budget": "32", "idle_budget": float("nan")}).label == "chunked/b32/bs4"
    # policies that read no budget take one value of these options, as of any other they do not read
    assert setting({"policy": "eager", "budget": "auto:40", "idle_budget": "whole"}) == setting({"policy": "eager"})


def test_a_grid_mixes_fixed_and_auto_budgets_and_refuses_them_where_nothing_reads_a_budget():
    labels = [setting_label(s) for s in grid_settings(["chunked", "mlx-lm"], [16, "auto:40"],
                                                      idle_budgets=["budget", "whole"])]
    assert labels == ["chunked/b16/bs4", "chunked/b16/bs4/idle-whole", "chunked/auto:40/bs4",
                      "chunked/auto:40/bs4/idle-whole", "mlx-lm/s2048/p8/d32"]
    for policy in ("mlx-lm", "eager", "fifo"):
        with pytest.raises(PolicyError, match="reads no chunk budget"):
            grid_settings([policy], ["auto:40"])
        with pytest.raises(PolicyError, match="reads no chunk budget"):
            grid_settings([policy], [128], idle_budgets=["whole"])
    with pytest.raises(PolicyError, match="prefill-step"):
        policies.make("mlx-lm", budget="auto:40")


def test_auto_needs_the_cost_model_and_one_of_pdsim_calls():
    trace = Trace([Request("a", 0.0, 300, 4), Request("b", 0.0, 200, 4)])
    with pytest.raises(PolicyError, match="needs a cost model"):
        simulate(trace, policies.make("chunked", "auto:40"), cost_model(load_profile(BUILTIN)))
    mlx_only = LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), pdsim_forms=False)
    with pytest.raises(PolicyError, match="mlx-lm's calls only"):
        policies.make("chunked", "auto:40", cost=mlx_only)
    policies.make("chunked", 40, cost=mlx_only)  # a fixed budget prices nothing (the replay refuses the profile)


def test_largest_fitting_finds_a_boundary_and_keeps_the_floor():
    assert largest_fitting(lambda n: n <= 37, 100) == 37
    assert largest_fitting(lambda n: n <= 37, 20) == 20
    assert largest_fitting(lambda n: False, 50) == 1
    assert largest_fitting(lambda n: True, 1) == 1


@dataclass
class Watched:
    """A policy run as it is, with every decision checked against the cost model on the state it saw."""
    inner: object
    cost: object
    seen: list

    def __post_init__(self):
        for attr in ("name", "engine", "steady", "steady_chunks", "queues_arrivals", "queue_order", "kv_limit"):  # `Policy`'s
            setattr(self, attr, getattr(self.inner, attr))

    def schedule(self, state: EngineState):
        work = self.inner.schedule(state)
        chunks = [w for w in work if isinstance(w, Prefill)]
        if chunks:
            (c,) = chunks
            left = state.queued[c.rid].prefill_left
            host = host_seconds(self.cost)
            here = iteration_seconds(self.cost, state, work, host)
            longer = None
            if c.tokens < left:  # the same iteration with one token more
                longer = iteration_seconds(self.cost, state, self.inner._iteration(state.queued[c.rid], c.tokens + 1,
                                                                                    _slots(self.inner, state)), host)
            self.seen.append((state.iteration + 1, c.tokens, left, bool(state.ready), here, longer))
        return work


def _slots(policy, state):
    from itertools import islice
    return list(islice(state.ready, policy.opts.batch_size))


adaptive = st.fixed_dictionaries({
    "policy": st.just("chunked"),
    "budget": st.one_of(st.integers(1, 256), st.floats(0.05, 80).map(lambda ms: f"auto:{ms:.3g}")),
    "batch_size": st.integers(1, 6),
    "decode": st.sampled_from(["batched", "single"]),
    "order": st.sampled_from(["chunk-first", "decode-first"]),
    "idle_budget": st.sampled_from(["budget", "whole"]),
})


@settings(max_examples=150, deadline=None)
@given(traces(), adaptive, costs)
def test_adaptive_budgets_keep_their_promises(trace, s, cost):
    """Tokens conserved, chunks tile prompts, a fixed budget is never exceeded while something decodes,
    the whole prompt runs when nothing does (idle_budget whole), every auto chunk longer than the
    1-token floor fits its target as the simulator charged it, and is a boundary (one token more
    would not fit), and the same inputs give the same log."""
    seen = []
    log = simulate(trace, Watched(policies.make(**s, cost=cost), cost, seen), cost, steady=False)
    reqs = {r.id: r for r in trace.requests}
    assert {rid: len(t) for rid, t in log.tokens.items()} == {r.id: r.output_len for r in trace.requests}
    covered = {}
    for c in log.calls:
        if c.kind == "prefill":
            assert c.prefix == covered.get(c.rids[0], 0)
            covered[c.rids[0]] = c.prefix + c.tokens
    assert covered == {r.id: r.prompt_len for r in trace.requests if not r.prefilled}
    target = auto_target(s["budget"])
    by_iteration, host = {}, host_seconds(cost)
    for c in log.calls:
        by_iteration.setdefault(c.iteration, []).append(c)
    for it, tokens, left, decoding, here, longer in seen:
        if s["idle_budget"] == "whole" and not decoding:
            assert tokens == left
        elif target is None:
            assert tokens == min(left, s["budget"])
        elif tokens > 1:
            assert here <= target
            assert longer is None or longer > target
            # what the simulator charged the iteration is what the policy predicted
            calls = by_iteration[it]
            assert host + (calls[-1].end - calls[0].start) == pytest.approx(here, rel=1e-9, abs=1e-12)
    assert all(c.start >= reqs[c.rids[0]].arrival for c in log.calls if c.kind == "prefill")
    again = simulate(trace, policies.make(**s, cost=cost), cost)
    assert again.calls == log.calls and again.tokens == log.tokens


@settings(max_examples=150, deadline=None)
@given(traces(longest=200, outputs=60), adaptive, costs)
def test_adaptive_budgets_replay_in_stretches_as_call_by_call(trace, s, cost):
    """auto chunks change every iteration, so only their chunk-free iterations are priced as
    stretches; idle_budget whole keeps the steady promise (its chunk changes only when the last
    decoding request finishes). Either way the log is the call-by-call one."""
    bulk = simulate(trace, policies.make(**s, cost=cost), cost)
    one_by_one = simulate(trace, policies.make(**s, cost=cost), cost, steady=False)
    assert bulk.calls == one_by_one.calls
    assert bulk.tokens == one_by_one.tokens


def test_auto_binds_the_decode_gap_and_a_larger_target_takes_larger_chunks():
    from sim.metrics.scoring import score
    from traces.generators import tinyllm
    cost, trace = cost_model(load_profile(BUILTIN)), tinyllm()
    gaps, chunks = [], []
    for ms in (30, 60):
        log = simulate(trace, policies.make("chunked", f"auto:{ms}", cost=cost), cost)
        m = score(log)
        assert m["decode_gap_p95_ms"] <= ms * 1.001
        gaps.append(m["decode_gap_p95_ms"])
        chunks.append(max(c.tokens for c in log.calls if c.kind == "prefill"))
    assert gaps[0] < gaps[1] and chunks[0] < chunks[1]
    assert gaps[0] > 0.8 * 30  # the target binds: chunks are as long as it allows


def test_cli_simulate_sweep_and_policies_take_adaptive_budgets(tmp_path, capsys):
    import json
    from sim.cli import main
    assert main(["simulate", "--budget", "auto:40", "--idle-budget", "whole", "--json-out", str(tmp_path / "s.json")]) == 0
    assert "chunked/auto:40/bs4/idle-whole" in capsys.readouterr().out
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["setting"]["budget"] == "auto:40" and doc["metrics"]["decode_gap_p95_ms"] <= 40.001
    out = tmp_path / "sweep"
    assert main(["sweep", "--budget", "16", "64", "auto:40", "auto:80", "--idle-budget", "budget", "whole",
                 "--workers", "1", "--no-progress", "--slo", "decode_gap_p95_ms<=45", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chunked/auto:40/bs4" in text and "Pareto front" in text
    res = json.loads((out / "results.json").read_text())
    labels = {r["label"] for r in res["rows"]} if "rows" in res else None
    import pandas as pd
    df = pd.read_csv(out / "results.csv")
    assert set(df["label"]) == {f"chunked/{b}/bs4{i}" for b in ("b16", "b64", "auto:40", "auto:80")
                                for i in ("", "/idle-whole")}
    assert labels is None or labels == set(df["label"])
    # the CSV reads back as the same settings, auto budgets and idle budgets included
    from sim.report.frames import _setting_of
    assert {setting_label(_setting_of(r)) for _, r in df.iterrows()} == set(df["label"])
    assert main(["sweep", "--setting", "chunked:budget=auto:25,idle_budget=whole", "chunked:budget=32",
                 "--workers", "1", "--no-progress"]) == 0
    assert "chunked/auto:25/bs4/idle-whole" in capsys.readouterr().out
    assert main(["policies"]) == 0
    text = capsys.readouterr().out
    assert "auto:MS" in text and "--idle-budget" in text and "idle_budget" in text


@pytest.mark.parametrize("args, says", [
    (["simulate", "--budget", "auto:0"], "finite number of milliseconds > 0"),
    (["simulate", "--budget", "auto:-5"], "finite number of milliseconds > 0"),
    (["simulate", "--budget", "auto:x"], "must be a number of milliseconds"),
    (["simulate", "--budget", "auto:"], "must be a number of milliseconds"),
    (["sweep", "--budget", "16", "auto:nan"], "finite number"),
    (["simulate", "--policy", "mlx-lm", "--budget", "auto:40"], "prefill-step"),
    (["simulate", "--policy", "mlx-lm", "--idle-budget", "whole"], "prefill-step"),
    (["sweep", "--setting", "mlx-lm:budget=auto:40"], "prefill_step"),
    (["sweep", "--setting", "chunked:budget=auto:x"], "auto:x"),
    (["sweep", "--setting", "chunked:idle_budget=sometimes"], "idle_budget"),
    (["simulate", "--idle-budget", "sometimes"], "idle-budget"),
])
def test_bad_adaptive_budgets_get_one_line_and_exit_2(args, says, capsys):
    refused(args, capsys, says)


def test_picks_break_ties_fixed_budgets_then_auto_by_target_then_whole_prompts():
    import pandas as pd
    from sim.sweep.pick import Objective, rank
    df = pd.DataFrame({"label": ["e", "a80", "b64", "a40", "b16"], "budget": [None, "auto:80", 64, "auto:40", 16],
                       "output_throughput": [1.0] * 5})
    assert list(rank(df, [], Objective())["label"]) == ["b16", "b64", "a40", "a80", "e"]


def test_report_charts_order_auto_budgets_after_fixed_ones():
    from sim.report.frames import budget_label, budget_order
    labels = [budget_label(b) for b in (128, "auto:80", None, 16, "auto:40", float("nan"), "32")]
    assert labels == ["128", "auto:80", "whole prompt", "16", "auto:40", "whole prompt", "32"]
    assert budget_order(labels) == ["16", "32", "128", "auto:40", "auto:80", "whole prompt"]

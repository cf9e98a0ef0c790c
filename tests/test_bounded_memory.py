"""Scoring in bounded memory: a run tallied as it goes gives the metrics of its whole log, exactly
where the metric allows and within the stated error where it does not; the event log, when kept,
is a columnar file that reads back as the run's log."""
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.metrics.logfile import read_log, write_log
from sim.metrics.scoring import score
from sim.metrics.quantiles import Distribution
from sim.replay import simulate
from sim.metrics.scored_log import ScoredLog, simulate_scored
from sim.metrics.tally import Slo, p95_of_runs
from traces.generators import poisson, tinyllm

COST = cost_model(load_profile(BUILTIN))
SETTINGS = [dict(policy="fifo"), dict(policy="eager", batch_size=4), dict(policy="chunked", budget=32, batch_size=4),
            dict(policy="chunked", budget=128, batch_size=3, decode="single"),
            dict(policy="mlx-lm"), dict(policy="mlx-lm", prefill_step=32, prompt_concurrency=2, decode_concurrency=3)]
TRACES = {"tinyllm": tinyllm(num_seqs=8), "poisson": poisson(num_requests=60, rate=4.0, seed=3)}


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and math.isnan(x):
            assert isinstance(y, float) and math.isnan(y), k
        else:
            assert x == pytest.approx(y, rel=1e-12, abs=1e-12), k


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "/".join(map(str, s.values())))
@pytest.mark.parametrize("name", sorted(TRACES))
def test_tallied_as_it_runs_equals_scoring_the_whole_log(setting, name):
    trace, slo = TRACES[name], Slo(ttft=2000.0, tpot=100.0)
    whole = score(simulate(trace, policies.make(**setting), COST), slo)
    tallied = simulate_scored(trace, policies.make(**setting), COST, slo)
    same(tallied.result(), whole)
    assert tallied.estimated() == {}  # a run this small is exact everywhere


def test_a_scored_log_holds_only_requests_in_flight():
    trace = poisson(num_requests=200, rate=4.0, seed=1)
    in_flight = []  # when each request is tallied (`simulate`'s progress bar counts these), how many others are
    log = ScoredLog(trace, on_done=lambda: in_flight.append(len(log.tokens)))
    simulate(trace, policies.make(policy="chunked", budget=64, batch_size=4), COST, log=log)
    assert log.call_count > 1000
    tally = log.close()
    assert len(log.tokens) == 0 and tally.result()["completed"] == 200 == len(in_flight)
    assert max(in_flight) <= 4  # the batch, less the request just done, and one that emitted its first token


def test_memory_does_not_follow_the_calls():
    """Traced allocations while replaying: an EventLog keeps every call, a ScoredLog does not;
    four times the requests (and calls) must not cost four times the memory beyond the trace."""
    setting = dict(policy="chunked", budget=64, batch_size=4)

    def peak(n: int, scored: bool) -> tuple[int, int]:
        trace = poisson(num_requests=n, rate=3.0, seed=2, max_in=256, max_out=64)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        if scored:
            calls = simulate_scored(trace, policies.make(**setting), COST).result()["engine_calls"]
        else:
            calls = len(simulate(trace, policies.make(**setting), COST).calls)
        top = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        return top, calls
    small, calls_small = peak(250, True)
    big, calls_big = peak(1000, True)
    full, _ = peak(1000, False)
    assert calls_big > 3 * calls_small
    assert big < full / 3  # the whole log is what costs the memory
    assert big / calls_big < 200  # bytes per call: the request table and in-flight requests only


def test_a_distribution_is_exact_while_small_and_within_its_stated_error_beyond():
    rng = np.random.default_rng(0)
    values = rng.lognormal(0.0, 1.5, 200_000)
    small, sketched = Distribution(cap=len(values)), Distribution(cap=10_000)
    for chunk in np.array_split(values, 37):
        small.add(chunk)
        sketched.add(chunk)
    assert small.exact and not sketched.exact
    ordered = np.sort(values)
    for q in (0.5, 0.9, 0.95, 0.99, 0.999):
        assert small.nearest_rank(q) == float(np.percentile(values, q * 100, method="inverted_cdf"))
        exact = ordered[max(0, math.ceil(q * len(values)) - 1)]  # the rank the sketch reads
        assert abs(sketched.nearest_rank(q) / exact - 1) <= sketched.alpha * 1.0001
        assert abs(sketched.percentile(q) / np.percentile(values, q * 100) - 1) <= 2 * sketched.alpha
    assert sketched.mean() == pytest.approx(values.mean(), rel=1e-9)
    assert sketched.std() == pytest.approx(values.std(), rel=1e-9)
    assert sketched.max() == values.max() and sketched.sum() == pytest.approx(values.sum(), rel=1e-9)


@pytest.mark.parametrize("setting", [dict(policy="chunked", budget=32, batch_size=4),
                                     dict(policy="mlx-lm", prefill_step=32, prompt_concurrency=2)])
def test_a_log_file_reads_back_as_the_runs_log(tmp_path, setting):
    trace = TRACES["poisson"]
    log = simulate(trace, policies.make(**setting), COST)
    write_log(tmp_path / "run.npz", log, {"what": "test"})
    meta, back = read_log(tmp_path / "run.npz")
    assert meta["what"] == "test"
    assert back.to_dict() == log.to_dict()
    same(score(back), score(log))


def test_a_log_written_as_the_run_goes_is_the_runs_log(tmp_path):
    from sim.metrics.logfile import LogWriter
    from sim.metrics.tally import RequestTable
    trace, setting = TRACES["poisson"], dict(policy="eager", batch_size=4)
    writer = LogWriter(tmp_path / "run.npz", RequestTable.of(trace.requests))
    tally = simulate_scored(trace, policies.make(**setting), COST, keep_rows=True, writer=writer)
    writer.close({"metrics": tally.result()}, tally.rows)
    _, back = read_log(tmp_path / "run.npz")
    assert back.to_dict() == simulate(trace, policies.make(**setting), COST).to_dict()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "/".join(map(str, s.values())))
def test_gaps_judged_in_small_batches_are_tiny_llms_gaps(setting, monkeypatch):
    """Decode gaps are judged a buffer at a time, and requests done behind every judged gap are only
    counted: with a buffer of 5 calls the gaps are still exactly `sim.metrics.scoring.decode_gaps` of the log."""
    import sim.metrics.tally
    from sim.metrics.scoring import decode_gaps
    trace = poisson(num_requests=120, rate=6.0, seed=4)
    log = simulate(trace, policies.make(**setting), COST)
    want = np.sort(decode_gaps(log) * 1e3)
    monkeypatch.setattr(sim.metrics.tally, "FLUSH", 5)
    tally = simulate_scored(trace, policies.make(**setting), COST)
    got = tally.result()
    assert np.array_equal(np.sort(tally.gaps.values()), want)
    assert got["decode_gap_max_ms"] == want.max()
    assert len(tally._finish) < 20  # not one entry per request done


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.floats(0, 10, allow_nan=False) | st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=40),
                min_size=1, max_size=6))
def test_each_requests_p95_gap_is_numpys(runs):
    """The per-request p95 gap, computed for many requests at once, is the float `np.percentile`
    gives each request's gaps (ties, runs of one, and interpolation weights either side of 0.5)."""
    values = np.concatenate([np.asarray(r, float) for r in runs])
    run = np.repeat(np.arange(len(runs)), [len(r) for r in runs])
    starts = np.r_[0, np.cumsum([len(r) for r in runs])[:-1]]
    assert p95_of_runs(values, run, starts).tolist() == [float(np.percentile(r, 95)) for r in runs]

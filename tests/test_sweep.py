"""Sweeps and picks: the grid, the three executors agreeing, the pick's optimality, the CLI's errors."""
import json
import math
import socket

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.cost.profile import BUILTIN, load_profile
from sim.sweep.pick import (Constraint, Objective, PickError, check_names, feasible, pareto_front, parse_constraint,
                      parse_objective, pick, rank, split_slo)
from sim.metrics.registry import NAMES
from sim.sweep.run import Inputs, SweepError, grid, run_sweep, scale_rate
from traces.generators import poisson, tinyllm

SETTINGS = [{"policy": p, "budget": b, "batch_size": 4, "decode": "batched", "order": "chunk-first"}
            for p, b in [("fifo", None), ("eager", None), ("chunked", 32), ("chunked", 128)]]


@pytest.fixture(scope="module")
def inputs():
    return Inputs({"tiny": tinyllm(num_seqs=6), "pois": poisson(num_requests=30, rate=3.0, seed=1)},
                  load_profile(BUILTIN))


@pytest.fixture(scope="module")
def in_process(inputs):
    return run_sweep(grid(SETTINGS, inputs.traces, [1.0, 2.0]), inputs, workers=1, progress=False)


def test_grid_covers_every_combination_and_rejects_empty():
    pts = grid(SETTINGS, ["a", "b"], [1.0, 0.5])
    assert len(pts) == len(SETTINGS) * 4
    assert {(p.trace, p.rate_scale, p.label) for p in pts} == \
        {(t, f, p.label) for t in "ab" for f in (1.0, 0.5) for p in pts[:len(SETTINGS)]}
    for args in (([], ["a"]), (SETTINGS, []), (SETTINGS, ["a"], [])):
        with pytest.raises(SweepError, match="empty grid"):
            grid(*args)


def test_rate_scale_divides_arrivals():
    tr = poisson(num_requests=5, rate=1.0, seed=3)
    fast = scale_rate(tr, 4.0)
    assert [r.arrival * 4 for r in fast.requests] == pytest.approx([r.arrival for r in tr.requests])
    assert fast.meta["rate_scale"] == 4.0 and scale_rate(tr, 1.0) is tr


def test_rows_carry_the_grid_and_every_metric(in_process, inputs):
    df = in_process
    assert len(df) == len(SETTINGS) * 2 * 2
    # every metric of the registry, in its order, after where the point is in the grid
    assert list(df.columns)[-len(NAMES):] == list(NAMES)
    assert set(df["trace_sha256"]) == set(inputs.sha256.values())
    assert df.loc[df["policy"] != "chunked", "budget"].isna().all()
    # arriving twice as fast never lowers throughput here (the server is the bottleneck or idle)
    pois = df[df["trace"] == "pois"].pivot(index="label", columns="rate_scale", values="output_throughput")
    assert (pois[2.0] >= pois[1.0] * 0.99).all()


def test_local_processes_give_the_same_frame(in_process, inputs):
    df = run_sweep(grid(SETTINGS, inputs.traces, [1.0, 2.0]), inputs, workers=2, progress=False)
    pd.testing.assert_frame_equal(df, in_process)


def test_dask_local_cluster_gives_the_same_frame(in_process, inputs):
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=1, processes=False, threads_per_worker=2, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        by_address = run_sweep(grid(SETTINGS, inputs.traces, [1.0, 2.0]), inputs, scheduler=cluster.scheduler_address,
                               progress=False)
    pd.testing.assert_frame_equal(by_address, in_process)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_silent_dask_address_is_one_clear_error(inputs):
    addr = f"tcp://127.0.0.1:{_free_port()}"
    with pytest.raises(SweepError, match="does not answer") as e:
        run_sweep(grid(SETTINGS[:1], ["tiny"]), inputs, scheduler=addr, progress=False, connect_timeout=1.0)
    assert addr in str(e.value) and "\n" not in str(e.value)


# --- picking -----------------------------------------------------------------------------------

def test_slo_items_split_into_goodput_targets_and_constraints():
    goodput, cons = split_slo(["ttft:2000", "decode_gap_p95_ms<=50", "p99_ttft_ms <= 2e3", "output_tok_s>100"])
    assert goodput == ["ttft:2000"]
    assert cons == [Constraint("decode_gap_p95_ms", "<=", 50), Constraint("p99_ttft_ms", "<=", 2000),
                    Constraint("output_throughput", ">", 100)]
    assert parse_objective("min:p99_ttft_ms") == Objective("p99_ttft_ms", False)
    # a bare metric goes the way the registry says is better; aliases name the registry's metric
    assert parse_objective("output_tok_s") == Objective("output_throughput", True)
    assert parse_objective("p99_ttft_ms") == Objective("p99_ttft_ms", False)
    assert parse_constraint("goodput_req_s>=1") == Constraint("request_goodput", ">=", 1)
    for bad in ("gap<=fast", "nonsense", "a<=inf"):
        with pytest.raises(PickError):
            split_slo([bad])
    for bad in ("up:output_tok_s", "engine_calls"):  # neither direction is better for engine calls
        with pytest.raises(PickError):
            parse_objective(bad)


def test_unknown_metric_is_refused_before_running():
    with pytest.raises(PickError, match="unknown metric 'decode_gap_p97_ms'"):
        check_names([parse_constraint("decode_gap_p97_ms<=50")], Objective(), None, False)
    with pytest.raises(PickError, match="needs a per-request target"):
        check_names([parse_constraint("goodput_req_s>=1")], Objective(), None, False)
    check_names([parse_constraint("goodput_req_s>=1")], Objective(), None, True)
    with pytest.raises(PickError, match="lower is better"):
        check_names([], Objective(), "output_throughput", False)
    from sim.sweep.results import SweepPlan
    assert SweepPlan({}, [], {}, latency="duration").latency == "makespan_s"  # an alias names its metric


metric = st.one_of(st.floats(0, 100, allow_nan=False), st.just(math.nan))


@st.composite
def frames(draw):
    n = draw(st.integers(1, 12))
    rows = [{"label": f"s{i}", "lat": draw(metric), "thr": draw(metric), "other": draw(metric)} for i in range(n)]
    return pd.DataFrame(rows)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames(), st.floats(0, 100), st.floats(0, 100), st.booleans())
def test_pick_meets_constraints_and_is_best_among_feasible(df, lat_max, other_min, maximize):
    cons = [Constraint("lat", "<=", lat_max), Constraint("other", ">=", other_min)]
    obj = Objective("thr", maximize)
    [pk] = pick(df, cons, obj, latency="lat", throughput="thr")
    ok = (df["lat"] <= lat_max) & (df["other"] >= other_min) & df["thr"].notna()
    assert pk.feasible == ok.sum() and pk.total == len(df)
    if not ok.any():
        assert pk.best is None
        return
    best = pk.best
    assert best["lat"] <= lat_max and best["other"] >= other_min
    vals = df.loc[ok, "thr"]
    assert best["thr"] == (vals.max() if maximize else vals.min())
    ranked = rank(df, cons, obj, "lat")
    assert list(ranked["label"]) == [best["label"]] + list(pk.runners_up["label"]) + \
        list(ranked["label"])[1 + len(pk.runners_up):]
    assert feasible(df, cons).sum() >= len(ranked)


@settings(max_examples=60, deadline=None)
@given(frames())
def test_pareto_front_is_exactly_the_non_dominated_rows(df):
    front = pareto_front(df, "lat", "thr")
    pts = df.dropna(subset=["lat", "thr"])

    def dominated(r):
        return ((pts["lat"] <= r["lat"]) & (pts["thr"] >= r["thr"]) &
                ((pts["lat"] < r["lat"]) | (pts["thr"] > r["thr"]))).any()
    assert not any(dominated(r) for _, r in front.iterrows())
    rest = pts.drop(index=front.index)
    assert all(dominated(r) for _, r in rest.iterrows())
    assert list(front["lat"]) == sorted(front["lat"])


def test_pick_is_per_trace_and_rate(in_process):
    picks = pick(in_process, [Constraint("decode_gap_p95_ms", "<=", 60)], Objective(), "decode_gap_p95_ms")
    assert {(p.group["trace"], p.group["rate_scale"]) for p in picks} == \
        {(t, f) for t in ("tiny", "pois") for f in (1.0, 2.0)}
    for p in picks:
        if p.best is not None:
            assert p.best["decode_gap_p95_ms"] <= 60


# --- the command -------------------------------------------------------------------------------

SMALL = ["sweep", "--trace", "tinyllm", "--num-seqs", "6", "--policy", "fifo", "eager", "chunked",
         "--budget", "32", "128", "--no-progress"]


def test_sweep_command_writes_results_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "sw"
    code = main(SMALL + ["--slo", "decode_gap_p95_ms<=50", "ttft:5000", "-o", str(out), "--logs", "2"])
    assert code == 0
    text = capsys.readouterr().out
    df = pd.read_csv(out / "results.csv")
    # fifo and eager prefill whole prompts, so the budgets multiply only chunked
    assert len(df) == 4 and {"request_goodput", "slo_attained", "decode_gap_p95_ms"} <= set(df.columns)
    doc = json.loads((out / "results.json").read_text())
    assert len(doc["rows"]) == 4 and doc["inputs"]["traces"][0]["sha256"] == tinyllm(num_seqs=6).sha256()
    assert doc["inputs"]["grid"]["budget"] == [32, 128]
    best = doc["picks"][0]["best"]
    assert f"pick: {best}" in text and "Pareto front" in text and "runners-up" in text
    assert [entry["rank"] for entry in doc["logs"]] == [0, 1]
    assert all((out / entry["file"]).is_file() for entry in doc["logs"])
    # the pick satisfies the constraint and no qualifying row beats it
    qualifying = df[df["decode_gap_p95_ms"] <= 50]
    assert len(qualifying) == doc["picks"][0]["feasible"] < len(df)
    assert qualifying["output_throughput"].max() == df.set_index("label").loc[best, "output_throughput"]

    before = (out / "results.csv").read_text()
    assert main(SMALL + ["-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and err.count("\n") == 1
    assert (out / "results.csv").read_text() == before
    assert main(SMALL + ["-o", str(out), "--overwrite"]) == 0


@pytest.mark.parametrize("extra, message", [
    (["--slo", "decode_gap_p97_ms<=50"], "unknown metric 'decode_gap_p97_ms'"),
    (["--objective", "max:tokens_per_second"], "unknown metric 'tokens_per_second'"),
    (["--slo", "goodput_req_s>=1"], "needs a per-request target"),
    (["--slo", "ttft:fast"], "not a number"),
    (["--budget"], "empty grid: --budget"),
    (["--policy"], "empty grid: --policy"),
    (["--rate-scale"], "empty grid: --rate-scale"),
    (["--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "1"], "does not answer"),
])
def test_sweep_bad_input_is_one_line_exit_2(extra, message, capsys, tmp_path):
    assert main(SMALL + extra + ["-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x" / "results.csv").exists()


def test_infeasible_constraints_say_so(capsys):
    assert main(SMALL + ["--slo", "decode_gap_p95_ms<=1"]) == 0
    assert "no setting meets every constraint" in capsys.readouterr().out


def test_rows_are_finite_where_defined(in_process):
    assert np.isfinite(in_process["output_throughput"]).all() and (in_process["completed"] > 0).all()


def test_columns_do_not_depend_on_the_trace_size():
    """Resumption gaps used to be computed only up to 200 requests, so a sweep's columns changed
    with its trace; every run now has every registry column."""
    prof = load_profile(BUILTIN)
    small, large = poisson(num_requests=5, rate=1.0, seed=2), poisson(num_requests=250, rate=1.5, seed=2)
    inputs = Inputs({"small": small, "large": large}, prof)
    df = run_sweep(grid(SETTINGS[2:3], inputs.traces), inputs, workers=1, progress=False)
    assert list(df.columns)[-len(NAMES):] == list(NAMES)
    assert np.isfinite(df["resume_gap_max_ms"]).all()


def test_settings_that_run_the_same_are_swept_once(tmp_path, capsys):
    """fifo decodes one request at a time: fifo at batch sizes 4 and 8 used to be two identical runs,
    both on the Pareto front."""
    out = tmp_path / "sw"
    assert main(["sweep", "--trace", "tinyllm", "--num-seqs", "6", "--policy", "fifo", "eager", "--batch-size",
                 "4", "8", "--no-progress", "-o", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in doc["rows"]] == ["fifo", "eager/bs4", "eager/bs8"]
    for pk in doc["picks"]:
        assert len(pk["front"]) == len(set(pk["front"]))
    assert grid([{"policy": "fifo", "batch_size": b} for b in (2, 4, 8)] + [{"policy": "eager", "budget": 9}],
                ["t"]) == grid([{"policy": "fifo"}, {"policy": "eager"}], ["t"])


README = __import__("pathlib").Path(__file__).parent.parent / "README.md"


def test_the_readme_python_sweep_runs_as_written():
    """The README's five-line sweep from Python: settings name only what differs from the defaults
    (it used to run every simulation, then fail with KeyError 'batch_size')."""
    text = README.read_text()
    block = text[text.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    assert len(block.strip().splitlines()) <= 5
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    df = scope["df"]
    assert list(df["label"]) == ["chunked/b32/bs4", "chunked/b128/bs4", "chunked/b512/bs4", "eager/bs4"]
    assert df["decode_gap_max_ms"].is_monotonic_increasing


def test_run_sweep_from_settings_alone():
    df = run_sweep(grid([{"policy": "chunked", "budget": b} for b in (32, 128)]), workers=1, progress=False)
    assert list(df["batch_size"]) == [4, 4] and set(df["trace"]) == {"tinyllm"}
    assert list(df["decode"]) == ["batched"] * 2 and df["output_throughput"].gt(0).all()

"""`pdsim confirm` end to end on qwen3-tiny: the gate, the protocol, the report, the arithmetic."""
import json
import math
import shlex
import statistics
import subprocess
import sys

import pytest

import policies

from calibrate.calibration import calibrate
from calibrate.measure.grid import TINY
from calibrate.measure.worker import warmup_trace
from sim.cost.profile import cost_model, load_profile
from sim.engine.log import EventLog
from sim.metrics.scoring import score
from sim.cost.noise import MIN_CALLS
from sim.predict import REPLICAS
from sim.replay import simulate
from sim.metrics.residuals import price_call, residual_table
from traces.trace import Trace


def pdsim(*args):
    p = subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("prof") / "tiny.json"
    calibrate("qwen3-tiny", TINY, path, progress=False)
    return path


TRACE = ["--trace", "tinyllm", "--num-seqs", "3", "--min-in", "12", "--max-in", "40", "--min-out", "5",
         "--max-out", "5"]


def test_confirm_end_to_end(profile, tmp_path):
    out = tmp_path / "report.json"
    code, stdout, err = pdsim("confirm", "--profile", str(profile), *TRACE, "--policy", "chunked",
                              "--budget", "8", "32", "--batch-size", "2", "--repeats", "2", "-o", str(out))
    assert code == 0, err
    assert "predicted" in stdout and "rel. error" in stdout
    rep = json.loads(out.read_text())
    assert rep["gate"]["ok"] and rep["gate"]["greedy_tokens_identical"] and rep["gate"]["timed_runs_identical_tokens"]
    assert all(g["ok"] for g in rep["gate"]["logits"])
    # forward order, then reverse: every (setting, repeat) once
    assert rep["protocol"]["order"] == [[0, "chunked/b8/bs2"], [0, "chunked/b32/bs2"],
                                        [1, "chunked/b32/bs2"], [1, "chunked/b8/bs2"]]
    assert len(rep["trace"]["requests"]) == 3 and all("prompt_ids" in r for r in rep["trace"]["requests"])
    assert len(rep["trace"]["sha256"]) == 64
    for res in rep["results"]:
        runs = [r for r in rep["runs"] if r["label"] == res["label"]]
        assert len(runs) == 2
        for k, m in res["measured"].items():
            vals = sorted(r["metrics"][k] for r in runs)
            assert m["min"] == vals[0] and m["max"] == vals[-1]
            assert m["median"] == pytest.approx(sum(vals) / 2)
            assert res["rel_error"][k] == pytest.approx((res["predicted"][k] - m["median"]) / m["median"])
        # every call of the setting's runs, priced by the profile: where a run metric's miss comes from
        logs = [EventLog.from_dict(r["log"]) for r in runs]
        cost = cost_model(load_profile(profile))
        assert res["calls"] == residual_table(logs, cost)
        assert res["calls_by_kind"] == residual_table(logs, cost, by_size=False)
        assert {"prefill", "decode"} <= {c["kind"] for c in res["calls"]}
        assert sum(c["calls"] for c in res["calls"]) == sum(c["calls"] for c in res["calls_by_kind"]) \
            == sum(c.end > c.start for log in logs for c in log.calls)
        for c in res["calls"] + res["calls_by_kind"]:
            assert all(math.isfinite(c[k]) and c[k] > 0 for k in ("ratio_p10", "ratio_median", "ratio_p90"))
            assert c["ratio_p10"] <= c["ratio_median"] <= c["ratio_p90"]
        json.dumps([res["calls"], res["calls_by_kind"]], allow_nan=False)  # strict JSON
        # each run's speed against the calibration: the median of its calls' predicted/measured
        assert [r["repeat"] for r in res["run_speed"]] == [r["repeat"] for r in runs]
        for r, log in zip(res["run_speed"], logs):
            ratios = sorted(price_call(cost, c) / (c.end - c.start) for c in log.calls if c.end > c.start)
            assert r["pred_over_meas"] == pytest.approx(statistics.median(ratios))
        # every request arrives at once, so no call's time can change a decision: every replay takes
        # each run's path, call by call (`sim.metrics.decisions`)
        assert res["paths"] == {"replays": REPLICAS, "runs": [{"repeat": r["repeat"], "same": REPLICAS, "parted": None}
                                                              for r in runs]}
    assert stdout.count(f"replays that took each run's path (of {REPLICAS}): r0 {REPLICAS} r1 {REPLICAS}") == 2
    assert "pred/meas (median)" in stdout  # and each setting's by-kind table, a row per kind
    for kind in ("prefill", "decode"):
        assert sum(line.startswith(f"{kind} ") for line in stdout.splitlines()) == len(rep["results"])
    # rescoring the same runs with the same profile reproduces the predictions, measuring nothing
    again = tmp_path / "rescored.json"
    code, stdout, err = pdsim("confirm", "--profile", str(profile), "--rescore", str(out), "-o", str(again))
    assert code == 0, err
    new = json.loads(again.read_text())
    assert new["rescored_from"] == str(out) and new["runs"] == rep["runs"]
    assert [r["predicted"] for r in new["results"]] == [r["predicted"] for r in rep["results"]]
    assert [r["calls"] for r in new["results"]] == [r["calls"] for r in rep["results"]]
    # --slo: each constraint's metric scored too, and whether it holds, predicted and measured
    checked = tmp_path / "slo.json"
    code, stdout, err = pdsim("confirm", "--profile", str(profile), "--rescore", str(out), "--slo",
                              "p99_ttft_ms<=1e9", "decode_gap_p95_ms<=1e-6", "-o", str(checked))
    assert code == 0, err
    slo = json.loads(checked.read_text())
    assert slo["slo"] == ["p99_ttft_ms<=1e+09", "decode_gap_p95_ms<=1e-06"]
    for res in slo["results"]:
        runs = [r for r in rep["runs"] if r["label"] == res["label"]]
        assert res["measured"]["p99_ttft_ms"]["median"] == pytest.approx(
            statistics.median(r["metrics"]["p99_ttft_ms"] for r in runs))
        assert [(v["holds_predicted"], v["holds_measured"], v["as_predicted"]) for v in res["slo"]] == \
            [(True, True, True), (False, False, True)]
        assert res["slo"][1]["measured"] == res["measured"]["decode_gap_p95_ms"]["median"]
    assert stdout.count("SLO p99_ttft_ms<=1e+09: predicted") == len(rep["results"])
    for bad, says in ((["p99_ttft_sec<=3"], "unknown metric"), (["ttft:2000"], "METRIC<=X")):
        code, _, err = pdsim("confirm", "--profile", str(profile), "--rescore", str(out), "--slo", *bad,
                             "-o", str(tmp_path / "bad.json"))
        assert code == 2 and says in err and err.count("\n") == 1 and not (tmp_path / "bad.json").exists(), err
    # predicted with the profile's call noise: the median over seeded replays, inside their range
    assert rep["prediction"]["replicas"] == REPLICAS and rep["prediction"]["noise"]["calls"] >= MIN_CALLS
    for res in rep["results"]:
        assert set(res["predicted_range"]) == set(res["predicted"])
        assert all(lo <= res["predicted"][k] <= hi for k, (lo, hi) in res["predicted_range"].items())
    # --replicas 0: one replay at typical call times, what `pdsim simulate` replays
    typical = tmp_path / "typical.json"
    code, stdout, err = pdsim("confirm", "--profile", str(profile), "--rescore", str(out), "--replicas", "0",
                              "-o", str(typical))
    assert code == 0, err
    one = json.loads(typical.read_text())
    assert one["prediction"]["replicas"] == 0 and all(not r["predicted_range"] for r in one["results"])
    trace = Trace.from_dicts(rep["trace"]["requests"], rep["trace"]["meta"])
    # each process served the trace itself untimed first (the default warm-up), and so does each replay
    assert rep["protocol"]["warmup"] == 1 and rep["protocol"]["warmup_with"] == "trace"
    run_file = out.with_name(out.name + ".runs") / "r0-chunked_b8_bs2.json"
    assert json.loads(run_file.read_text())["warmup_with"] == "trace"
    for res in one["results"]:
        plain = score(simulate(trace, policies.make(**res["setting"]), cost_model(load_profile(profile)),
                               warmup=trace))
        assert res["at_calibration_speed"]["predicted"] == {k: plain[k] for k in res["predicted"]}
    # a report from before `--warmup-with` measured processes warmed up short, and is rescored so
    old = tmp_path / "old.json"
    old.write_text(json.dumps(dict(rep, protocol={k: v for k, v in rep["protocol"].items() if k != "warmup_with"})))
    code, _, err = pdsim("confirm", "--profile", str(profile), "--rescore", str(old), "--replicas", "0",
                         "-o", str(tmp_path / "old-rescored.json"))
    assert code == 0, err
    for res in json.loads((tmp_path / "old-rescored.json").read_text())["results"]:
        short = score(simulate(trace, policies.make(**res["setting"]), cost_model(load_profile(profile)),
                               warmup=warmup_trace(trace)))
        assert res["at_calibration_speed"]["predicted"] == {k: short[k] for k in res["predicted"]}
    # each run was probed before and after (calibrate.measure.speed_probe); the prediction is made at their speed
    for res in rep["results"]:
        runs = [r for r in rep["runs"] if r["label"] == res["label"]]
        assert all(len(r["probe"]["logs"]) == 2 for r in runs)
        assert all(len(r["probe"]["alloc_s"]) == 2 and min(r["probe"]["alloc_s"]) > 0 for r in runs)
        assert all(0.05 < p["memory"] < 20 for p in res["machine_speed"]["runs"])  # the profile's probes allocated too
        for kind in ("prefill", "decode"):
            # each probe timed against the profile's in the same place (before a run, after it), priced beside it
            assert {p["method"] for p in res["machine_speed"]["runs"]} == {"positional"}
            assert all(0.2 < p["priced"][kind] < 5 for p in res["machine_speed"]["runs"])
            speeds = [p[kind] for p in res["machine_speed"]["runs"]]
            assert all(0.2 < v < 5 for v in speeds)
            assert res["machine_speed"]["median"][kind] == statistics.median(speeds)
    assert "machine speed against the calibration" in stdout and "at calib. speed" in stdout
    assert "each timed against the calibration's probes in the same place" in stdout and "; priced by the profile: r0" in stdout
    assert "fresh memory's speed against the calibration" in stdout
    # the report is never overwritten
    code, _, err = pdsim("confirm", "--profile", str(profile), *TRACE, "--budget", "8", "--repeats", "1",
                         "-o", str(out))
    assert code == 2 and "exists" in err
    # the runs' calls refit the profile they were predicted with; the errors before and after are said
    learned = tmp_path / "learned.json"
    code, stdout, err = pdsim("calibrate", "--from-runs", str(out), "-o", str(learned))
    assert code == 0, err
    assert "before -> after" in stdout and "cross-validated mean" in stdout
    new, old = load_profile(learned), load_profile(profile)
    added = [s for s in new["samples"] if s.get("source", "").startswith("run:report.json:")]
    assert len(added) == sum(len(r["log"]["calls"]) for r in rep["runs"])
    # each run's calls at the calibration's speed, by its probes timed against the calibration's in the
    # same place: the speed the report predicted at (`positional_speed`)
    timed = [p for res in rep["results"] for p in res["machine_speed"]["runs"] if p["method"] == "positional"]
    assert len(timed) == len(rep["runs"]) and any(s.get("speed") for s in added)
    for s in added:
        if "speed" in s:
            assert s["seconds"] == pytest.approx(s["measured"] * s["speed"], rel=1e-12)
            assert any(s["speed"] == pytest.approx(t["prefill" if s["step"] == "prefill" else "decode"], rel=1e-9)
                       for t in timed)
    assert new["samples"][:len(old["samples"])] == [dict(s, held_out=n["held_out"], fitted=n["fitted"])
                                                    if "fitted" in s else s
                                                    for s, n in zip(old["samples"], new["samples"])]
    assert new["from_runs"] == [str(out)] and new["fit"]["replay"]["calls"] == old["fit"]["replay"]["calls"]
    code, _, err = pdsim("calibrate", "--from-runs", str(profile), "-o", str(tmp_path / "x.json"))
    assert code == 2 and "not a confirm report" in err and "Traceback" not in err


def test_a_resumed_confirm_must_be_of_the_same_work(profile, tmp_path):
    """Issue 12: a confirm interrupted after its runs and resumed with another trace reported the old
    runs as measurements of the new trace (exit 0). Now it is refused in one line naming what differs;
    the same work resumes, reusing every finished run."""
    out = tmp_path / "conf.json"
    args = ["confirm", "--profile", str(profile), *TRACE, "--policy", "chunked", "--budget", "8",
            "--batch-size", "2", "--repeats", "1", "-o", str(out)]
    code, _, err = pdsim(*args)
    assert code == 0, err
    runs = out.with_name(out.name + ".runs")
    stamps = {p.name: p.stat().st_mtime_ns for p in runs.glob("r*.json")}
    assert stamps
    out.unlink()  # as if interrupted before the report was written
    other = [a if a != "3" else "4" for a in args]  # --num-seqs 4: another trace
    code, _, err = pdsim(*other)
    assert code == 2 and "other work" in err and "trace" in err and err.count("\n") == 1, err
    code, _, err = pdsim(*args[:-2], "--repeats", "2", "-o", str(out))  # another protocol
    assert code == 2 and "protocol" in err, err
    code, _, err = pdsim(*args[:-2], "--warmup-with", "short", "-o", str(out))  # another warm-up
    assert code == 2 and "protocol" in err, err
    code, _, err = pdsim(*args)
    assert code == 0, err
    assert {p.name: p.stat().st_mtime_ns for p in runs.glob("r*.json")} == stamps  # reused, not measured again


def test_confirm_refuses_mismatched_profile_and_long_trace(profile, tmp_path):
    other = json.loads(profile.read_text())
    other["device"]["id"] = "gpu:Apple M9 Ultra"
    p2 = tmp_path / "other.json"
    p2.write_text(json.dumps(other))
    code, _, err = pdsim("confirm", "--profile", str(p2), *TRACE, "--repeats", "1", "-o", str(tmp_path / "r.json"))
    assert code == 2 and "Apple M9 Ultra" in err and "--force" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()
    code, _, err = pdsim("confirm", "--profile", str(profile), "--trace", "metile", "--prompt-len", "5000",
                         "--output-len", "4", "--repeats", "1", "-o", str(tmp_path / "r.json"))
    assert code == 2 and "context" in err and "Traceback" not in err


def test_tune_runs_the_whole_loop(profile, tmp_path):
    """The main job end to end on qwen3-tiny: the capacity question, the pick confirmed on the real
    engine at its capacity, report."""
    out = tmp_path / "tune"
    code, stdout, err = pdsim("tune", "--model", "qwen3-tiny", "--profile", str(profile), "--repeats", "1",
                              "-o", str(out))
    assert code == 0, err
    assert "[4/4] report" in stdout and "pick:" in stdout
    capacity = json.loads((out / "capacity" / "capacity.json").read_text())
    best = capacity["pick"]
    report = json.loads((out / "confirm.json").read_text())
    assert report["results"][0]["label"] == best and report["gate"]["ok"]
    assert report["trace"]["meta"].get("rate_scale") == capacity["settings"][0]["capacity_scale"]
    assert (out / "report" / "report.html").stat().st_size > 10_000
    assert report["results"][0]["calls"]
    # the confirm checks the SLOs the capacity was found under, predicted and measured
    assert report["slo"] == capacity["slo"] and [v["slo"] for v in report["results"][0]["slo"]] == capacity["slo"]
    # and says how to see them break above it: that confirm runs as printed
    above = shlex.split(stdout.split("1.3x it):\n")[1].split("\n")[0])  # as a shell reads it: SLOs quoted
    assert above[:2] == ["pdsim", "confirm"] and "--slo" in above
    code, printed, err = pdsim(*above[1:], "--repeats", "1")
    assert code == 0, err
    fast = json.loads((out / "confirm-above.json").read_text())
    at, above = ([r["arrival"] for r in doc["trace"]["requests"]] for doc in (report, fast))
    assert above == pytest.approx([a / 1.3 for a in at], rel=1e-5)
    assert fast["results"][0]["label"] == best and fast["slo"] == capacity["slo"]
    assert "Per-call predicted/measured" in (out / "report" / "report.html").read_text()
    code, _, err = pdsim("tune", "--model", "qwen3-99b", "-o", str(tmp_path / "t2"))
    assert code == 2 and "unknown model" in err and not (tmp_path / "t2").exists()
    # a profile of float32 weights does not answer for float16 or 4-bit ones: refused, one line
    for flags, asked in ((["--dtype", "float16"], "asks for float16"), (["--quant-bits", "4"], "quantized to 4 bits")):
        code, _, err = pdsim("tune", "--model", "qwen3-tiny", "--profile", str(profile), *flags, "-o", str(tmp_path / "t3"))
        assert code == 2 and "is of float32 weights" in err and asked in err and err.count("\n") == 1, err


def test_the_confirm_tune_prints_runs_any_pick(tmp_path):
    """Whatever tune picks (fifo's budget is None), the confirm it prints parses back to that setting."""
    from policies.settings import setting
    from sim.cli import build_parser
    from sim.commands.common import settings_from_args
    from sim.commands.tune_capacity import above_command, settings_for
    parser = build_parser()
    for engine in ("pdsim", "vllm"):
        for kind in ("cpu", "gpu"):
            for s in settings_for(engine, kind):
                pick = setting(s)
                words = shlex.split(above_command(pick, {"capacity_scale": 0.5}, ["decode_gap_p95_ms<=100"],
                                                  tmp_path / "p.json", tmp_path))
                args = parser.parse_args(words[1:])
                assert [setting(x) for x in settings_from_args(args)] == [pick]
                assert args.speed == pytest.approx(0.65) and args.slo == ["decode_gap_p95_ms<=100"]


def test_tune_names_a_profile_for_each_precision():
    """The profile `pdsim tune` caches: one per model, device kind, engine and precision, the
    device's default precision unnamed (float32 on a CPU, bfloat16 on a GPU)."""
    from calibrate.profiles import default_profile_path
    assert str(default_profile_path("qwen3-0.6b", "cpu")) == "profiles/qwen3-0.6b-cpu.json"
    assert str(default_profile_path("qwen3-0.6b", "gpu", "mlx-lm", "float32-q4")) == \
        "profiles/qwen3-0.6b-gpu-float32-q4-mlx-lm.json"


def test_confirm_runs_an_auto_budget_with_the_profiles_prices(profile, tmp_path):
    """On the real engine an auto:MS budget prices its chunks with the profile confirm was given (the
    worker gets its cost model): every run makes the calls the prediction makes (all requests arrive
    at t=0, so decisions depend on the state and the prices alone)."""
    from sim.replay import simulate
    from calibrate.measure.engine_runs import relogged
    from calibrate.measure.worker import warmup_trace
    import policies
    from traces.trace import Trace
    cost = cost_model(load_profile(profile))
    ms = (cost.decode([30, 30]) + cost.prefill(8, 16)) * 1e3  # binds: a chunk of about 8 beside two decodes
    budget = f"auto:{ms:.3g}"
    out = tmp_path / "auto.json"
    code, stdout, err = pdsim("confirm", "--profile", str(profile), *TRACE, "--policy", "chunked", "--budget",
                              budget, "--idle-budget", "whole", "--batch-size", "2", "--repeats", "1", "-o", str(out))
    assert code == 0, err
    rep = json.loads(out.read_text())
    (res,) = rep["results"]
    assert res["label"] == f"chunked/{budget}/bs2/idle-whole" and f"chunked/{budget}/bs2/idle-whole" in stdout
    trace = Trace.from_dicts(rep["trace"]["requests"], rep["trace"]["meta"])
    s = rep["settings"][0]
    predicted = simulate(trace, policies.make(**s, cost=cost), cost, warmup=warmup_trace(trace))
    shape = lambda log: [(c.kind, c.rids, c.tokens, c.prefix, c.iteration) for c in log.calls]
    (run,) = rep["runs"]
    assert shape(relogged(trace, run["log"], s, cost)) == shape(predicted)
    chunks = [c.tokens for c in predicted.calls if c.kind == "prefill"]
    assert len(set(chunks)) > 2

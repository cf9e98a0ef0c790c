"""`pdsim calibrate/confirm/tune --engine mlx-lm` end to end on qwen3-tiny: BatchGenerator's calls
timed and fitted, settings confirmed on BatchGenerator itself, mlx_lm.server's flags picked."""
import json
import subprocess
import sys

import pytest

from calibrate.measure.grid import MLX_TINY
from calibrate.mlxlm_calibration import calibrate_mlx_lm
from calibrate.measure.engine_runs import relogged
from sim.cost.profile import cost_model, load_profile
from sim.metrics.residuals import residual_table
from traces.trace import Trace


def pdsim(*args):
    p = subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=900)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("prof") / "tiny-mlx-lm.json"
    calibrate_mlx_lm("qwen3-tiny", MLX_TINY, path, progress=False)
    return path


def test_the_profile_prices_batch_generators_calls(profile):
    prof = load_profile(profile)
    assert prof["engine"] == "mlx-lm" and prof["device"]["mlx_lm"] == "0.32.2"
    assert "prefill" not in prof["cost"] and set(prof["cost"]["mlx_lm"]) >= {"prompt", "generate", "copy", "fresh"}
    grid = [s for s in prof["samples"] if "source" not in s]
    assert len(grid) == len(MLX_TINY.points()) and all(len(s["times"]) == MLX_TINY.repeats for s in grid)
    assert any(s["written"] for s in grid if s["step"] == "prompt" and len(set(s["chunks"])) > 1)  # padded: rolled
    engine = [s for s in prof["samples"] if s.get("source", "").startswith("engine:")]
    assert {s["call"] for s in engine} >= {"prompt", "first", "generate", "merge"}
    assert any(s["rows"] > 1 for s in engine if s["step"] == "prompt")
    for step in ("prompt", "generate"):
        e = prof["fit"]["errors"][step]
        assert 0 <= e["form_mean"] <= e["form_max"] and e["cv_folds"] == 4
    replay = prof["fit"]["replay"]  # held-out BatchGenerator runs, every call priced
    assert {r["kind"] for r in replay["by_kind"]} >= {"prompt", "first", "generate"}
    assert sum(r["calls"] for r in replay["by_kind"]) == replay["calls"] > 0
    assert prof["cost"]["mlx_lm"]["iteration"] >= 0
    host = prof["cost"]["mlx_lm"]["host"]  # each kind's host part, from the fitted runs (`sim.engine.pipeline`)
    assert set(host) == {"prompt", "first", "generate"} and all(v > 0 for v in host.values())
    assert set(prof["cost"]["mlx_lm"]["tail"]) == {"first", "generate"}  # what was left of a call when queued
    piped = prof["fit"]["pipelined_replay"]  # a held-out run served as the server serves, priced as simulated
    assert {r["kind"] for r in piped["by_kind"]} >= {"prompt", "first", "generate"} and piped["calls"] > 0
    assert not any(s.get("source", "").endswith("pipelined-held-out") for s in prof["samples"])  # not call times
    # the calibrated forms price mlx-lm's calls; pdsim's policies are refused with this profile
    cost = cost_model(prof)
    section = prof["cost"]["mlx_lm"]["prompt"]  # knots at the grid's sizes (the tile's multiples), never falling
    sizes, tile = sorted({s["rows"] * s["chunk"] for s in grid if s["step"] == "prompt"}), section.get("tile", 0)
    dense = section["dense"]
    assert [x for x, _ in dense] == sorted({n for n in sizes if not tile or n % tile == 0} | {sizes[0], sizes[-1]})
    assert all(a[1] <= b[1] for a, b in zip(dense, dense[1:]))
    # at aligned sizes more rows never cost less (an unaligned size may: it pays the remainder)
    aligned = [int(x) for x, _ in dense if not tile or x % tile == 0]
    prices = [cost.mlx_lm_call("prompt", n, 0, [0], 0, 0) for n in aligned]
    assert prices[0] > 0 and all(a <= b for a, b in zip(prices, prices[1:]))
    if tile:
        assert cost.mlx_lm_call("prompt", tile + 1, 0, [0], 0, 0) > cost.mlx_lm_call("prompt", tile, 0, [0], 0, 0)
    code, _, err = pdsim("simulate", "--profile", str(profile), "--policy", "chunked")
    assert code == 2 and "mlx-lm's BatchGenerator only" in err
    code, out, err = pdsim("calibrate", "--refit", str(profile), "-o", str(profile.with_name("refit.json")))
    assert code == 0, err
    assert load_profile(profile.with_name("refit.json"))["cost"]["mlx_lm"] == prof["cost"]["mlx_lm"]


SPREAD = ["--trace", "poisson", "--num-requests", "6", "--rate", "60", "--min-in", "5", "--max-in", "60",
          "--min-out", "3", "--max-out", "8", "--seed", "4"]


def test_confirm_on_batch_generator(profile, tmp_path):
    out = tmp_path / "report.json"
    code, stdout, err = pdsim("confirm", "--engine", "mlx-lm", "--profile", str(profile), *SPREAD, "--setting",
                              "mlx-lm:prefill_step=16,prompt_concurrency=2,decode_concurrency=2",
                              "mlx-lm:prefill_step=2048", "--repeats", "2", "-o", str(out))
    assert code == 0, err
    assert "its calls are the mlx-lm policy's, call by call, in every run: True" in stdout
    rep = json.loads(out.read_text())
    assert rep["engine"]["name"] == "mlx-lm" and rep["engine"]["mlx_lm"] == "0.32.2"
    assert rep["gate"]["ok"] and rep["gate"]["policy_calls_identical"] and rep["gate"]["timed_runs_identical_tokens"]
    assert [r["label"] for r in rep["results"]] == ["mlx-lm/s16/p2/d2", "mlx-lm/s2048/p8/d32"]
    for run in rep["runs"]:
        assert run["engine"] == {"name": "mlx-lm", "version": "0.32.2"}
        assert run["check"] == {"policy_mismatches": [], "shape_mismatches": []}
        assert {c[0] for c in run["log"]["calls"]} <= {"prompt", "first", "generate"}
        assert run["log"]["pipelined"]  # as the server runs it: nothing synchronized
        # the machine's speed, probed on BatchGenerator before and after the run (the profile prices its calls)
        assert run["probe"]["setting"]["policy"] == "mlx-lm" and len(run["probe"]["logs"]) == 2
        assert all({c[0] for c in log["calls"]} >= {"prompt", "generate"} for log in run["probe"]["logs"])
    for res in rep["results"]:
        speeds = res["machine_speed"]["runs"]
        assert len(speeds) == 2 and all(0.2 < s[k] < 5 for s in speeds for k in ("prefill", "decode"))
        assert all(s["method"] == "positional" and 0.2 < s["priced"]["decode"] < 5 for s in speeds)  # on BatchGenerator
    cost = cost_model(load_profile(profile))
    trace = Trace.from_dicts(rep["trace"]["requests"], rep["trace"]["meta"])
    for res in rep["results"]:
        assert set(res["measured"]) >= {"decode_gap_p50_ms", "p50_ttft_ms", "output_throughput", "makespan_s"}
        # each run's calls after a warm-up that served the trace itself, as the run went (`relogged`)
        logs = [relogged(trace, r["log"], r["setting"], cost, cost.kv_bytes, "trace")
                for r in rep["runs"] if r["label"] == res["label"]]
        assert res["calls_by_kind"] == residual_table(logs, cost, by_size=False)
        assert {c["kind"] for c in res["calls_by_kind"]} >= {"prompt", "first"}
    # pdsim's policies do not run on BatchGenerator
    code, _, err = pdsim("confirm", "--engine", "mlx-lm", "--profile", str(profile), *SPREAD, "--policy", "chunked",
                         "--repeats", "1", "-o", str(tmp_path / "r2.json"))
    assert code == 2 and "another policy" in err and "Traceback" not in err


def test_tune_prints_the_server_command(profile, tmp_path):
    """On its default target, which some setting of the grid meets (`tune.mlx_lm_default_slo`)."""
    out = tmp_path / "tune"
    code, stdout, err = pdsim("tune", "--engine", "mlx-lm", "--model", "qwen3-tiny", "--profile", str(profile),
                              "--repeats", "1", "-o", str(out))
    assert code == 0, err
    assert "[4/4] report" in stdout
    line = stdout.strip().splitlines()[-1].strip()
    assert line.startswith("mlx_lm.server --model ") and "--prefill-step-size" in line
    sweep = json.loads((out / "sweep" / "results.json").read_text())
    best = sweep["picks"][0]["best"]
    report = json.loads((out / "confirm.json").read_text())
    assert report["results"][0]["label"] == best and report["engine"]["name"] == "mlx-lm"
    step, p, d = (int(x[1:]) for x in best.split("/")[1:])
    assert line.endswith(f"--prefill-step-size {step} --prompt-concurrency {p} --decode-concurrency {d}")

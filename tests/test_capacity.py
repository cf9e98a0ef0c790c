"""`pdsim capacity`: the highest arrival rate at which a setting meets every SLO, found by bisection."""
import json
import math
import subprocess
import sys

import pytest

import policies
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.metrics.scoring import score
from sim.replay import simulate
from sim.sweep.capacity import CapacityError, mean_rate, meets, search
from sim.sweep.pick import parse_constraint
from sim.sweep.run import Inputs, scale_rate
from traces.generators import poisson

TRACE = poisson(300, 1.0, 64, 512, 32, 128, seed=3)
SLO = [parse_constraint("p99_ttft_ms<=2000"), parse_constraint("decode_gap_p95_ms<=150")]
SETTINGS = [{"policy": "chunked", "budget": 64}, {"policy": "chunked", "budget": 256}, {"policy": "eager"}]


def _inputs():
    return Inputs({"t": TRACE}, load_profile(BUILTIN))


def _met(setting, scale) -> bool:
    cost = cost_model(load_profile(BUILTIN))
    return meets(score(simulate(scale_rate(TRACE, scale), policies.make(**setting, cost=cost), cost)), SLO)


def test_each_capacity_meets_the_slos_and_the_bracket_top_breaks_one():
    """The answer is a rate the setting was seen to meet, within the tolerance of one it broke."""
    found = search(SETTINGS, "t", _inputs(), SLO, (0.1, 20.0), 0.02, workers=1, progress=False)
    for f in found:
        assert f.met_lo and f.hi / f.lo <= 1.02
        assert _met(f.setting, f.lo) and not _met(f.setting, f.hi)


def test_local_processes_and_a_dask_cluster_give_the_same_answers():
    distributed = pytest.importorskip("distributed")
    local = search(SETTINGS, "t", _inputs(), SLO, (0.1, 20.0), 0.05, workers=2, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        dask = search(SETTINGS, "t", _inputs(), SLO, (0.1, 20.0), 0.05, scheduler=client, progress=False)
    assert [(f.lo, f.hi, len(f.runs)) for f in local] == [(f.lo, f.hi, len(f.runs)) for f in dask]


def test_a_range_that_does_not_bracket_is_refused_after_one_round():
    with pytest.raises(CapacityError, match="does not bracket"):
        search(SETTINGS, "t", _inputs(), SLO, (0.01, 0.05), workers=1, progress=False)
    with pytest.raises(CapacityError, match="no setting meets"):
        search(SETTINGS, "t", _inputs(), [parse_constraint("p99_ttft_ms<=1")], (0.1, 20.0), workers=1,
               progress=False)


def test_mean_rate_is_the_arrivals_rate():
    assert mean_rate(TRACE) == pytest.approx((len(TRACE) - 1) / (TRACE.requests[-1].arrival - TRACE.requests[0].arrival))
    assert mean_rate(scale_rate(TRACE, 2.0)) == pytest.approx(2 * mean_rate(TRACE))


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sim.cli", "capacity", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_capacity_command_writes_its_answer_and_why(tmp_path):
    p = _cli("--trace", "poisson", "--num-requests", "300", "--rate", "1.0", "--seed", "3", "--policy", "chunked",
             "eager", "--budget", "64", "256", "--slo", "p99_ttft_ms<=2000", "decode_gap_p95_ms<=150",
             "--rate-range", "0.1:20", "--workers", "1", "--no-progress", "-o", str(tmp_path / "cap"))
    assert p.returncode == 0, p.stderr
    assert "pick:" in p.stdout
    doc = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    caps = [r["capacity_req_s"] for r in doc["settings"]]
    assert doc["pick"] == doc["settings"][0]["label"] and caps == sorted(caps, reverse=True)
    assert all(math.isfinite(c) and c > 0 for c in caps)
    assert (tmp_path / "cap" / "curve.csv").read_text().count("\n") == sum(r["runs"] for r in doc["settings"]) + 1
    again = _cli("--trace", "poisson", "--slo", "p99_ttft_ms<=2000", "--no-progress", "-o", str(tmp_path / "cap"))
    assert again.returncode == 2 and "exists" in again.stderr


@pytest.mark.parametrize("args,says", [
    (["--slo", "p99_ttfx_ms<=2000"], "unknown metric"),
    (["--slo", "ttft:2000"], "METRIC<=X"),
    (["--slo", "p99_ttft_ms<=2000", "--rate-range", "5:1"], "LOW < HIGH"),
    (["--trace", "tinyllm", "--slo", "p99_ttft_ms<=2000"], "arrives at once"),
    (["--trace", "poisson", "--num-requests", "50", "--slo", "p99_ttft_ms<=1", "--rate-range", "0.5:2"],
     "no setting meets"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    p = _cli(*args, "--no-progress", "--workers", "1")
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().count("\n") == 0

"""The speed probes around each confirm run: a machine that runs slower than at its calibration is
seen by them, and the prediction follows it (the one at the calibration's speed kept beside it)."""
import pytest

import policies
from calibrate.confirm import compare, probed_speed
from calibrate.speed_probe import SETTING, probe_speed, probe_trace
from calibrate.worker import warmup_trace
from sim.costmodel import BUILTIN, LinearCostModel, cost_model, load_profile
from sim.metrics import score
from sim.predict import replays
from sim.replay import simulate
from sim.settings import setting_label
from traces.generators import tinyllm

SLOW = 1.25  # every call of the "measured" runs takes 1.25x its price: a machine at 0.8x its calibration's speed


def slow(factor):
    return lambda: factor


def measured(trace, setting, cost, factor, repeat):
    """A run as a worker returns it, at `factor` times every price, with its probes at the same speed."""
    log = simulate(trace, policies.make(**setting), cost, warmup=warmup_trace(trace), noise=slow(factor))
    probe = probe_trace(151_936)
    logs = [simulate(probe, policies.make(**SETTING), cost, noise=slow(factor)).to_dict() for _ in range(2)]
    return {"label": setting_label(setting), "setting": setting, "repeat": repeat, "log": log.to_dict(),
            "probe": {"trace": probe.to_dict(), "setting": SETTING, "logs": logs}}


def test_probes_read_the_machines_speed_and_the_prediction_follows_it():
    prof = load_profile(BUILTIN)
    cost, trace = cost_model(prof), tinyllm(num_seqs=4, min_in=20, max_in=90, min_out=4, max_out=9, seed=3)
    setting = {"policy": "fifo"}
    runs = [measured(trace, setting, cost, SLOW, r) for r in range(3)]
    assert probed_speed(runs[0], cost) == pytest.approx({"before": 1 / SLOW, "after": 1 / SLOW, "speed": 1 / SLOW})
    (res,) = compare(prof, trace, [setting], runs, replicas=0)
    assert res["machine_speed"]["median"] == pytest.approx(1 / SLOW)
    assert [r["repeat"] for r in res["machine_speed"]["runs"]] == [0, 1, 2]
    # at the probed speed the prediction is the measured run (the host's time between calls is not scaled)
    for k in ("decode_gap_max_ms", "p99_itl_ms", "p50_ttft_ms", "makespan_s"):
        assert res["rel_error"][k] == pytest.approx(0, abs=0.01), k
        assert res["at_calibration_speed"]["rel_error"][k] == pytest.approx(1 / SLOW - 1, abs=0.02), k
    # the prediction is replays at that speed, and the one beside it at the calibration's
    at_speed, _ = replays(trace, lambda: policies.make(**setting), cost, None, 0, warmup_trace(trace), 1 / SLOW)
    assert res["predicted"]["makespan_s"] == pytest.approx(score(at_speed[0])["makespan_s"], rel=1e-12)
    plain = score(simulate(trace, policies.make(**setting), cost, warmup=warmup_trace(trace)))
    assert res["at_calibration_speed"]["predicted"]["makespan_s"] == plain["makespan_s"]


def test_runs_without_probes_are_predicted_at_the_calibrations_speed():
    prof = load_profile(BUILTIN)
    cost, trace = cost_model(prof), tinyllm(num_seqs=3, seed=4)
    setting = {"policy": "fifo"}
    runs = [dict(measured(trace, setting, cost, SLOW, r), probe=None) for r in range(2)]
    (res,) = compare(prof, trace, [setting], runs, replicas=0)
    assert res["machine_speed"]["median"] is None and res["rel_error"] == res["at_calibration_speed"]["rel_error"]
    assert res["rel_error"]["makespan_s"] == pytest.approx(1 / SLOW - 1, abs=0.02)


def test_probe_speed_is_the_median_of_its_calls_and_needs_pdsim_prices():
    cost = cost_model(load_profile(BUILTIN))
    probe = probe_trace(151_936)
    assert [r.prompt_len for r in probe.requests] == [32, 64]  # aligned shapes a grid times
    log = simulate(probe, policies.make(**SETTING), cost, noise=iter([2.0] * 5 + [1.0] * 100).__next__)
    assert probe_speed([log], cost) == pytest.approx(1.0)  # a slow prefill and two slow decodes of 14 calls move no median
    assert probe_speed([log], LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), pdsim_forms=False)) is None

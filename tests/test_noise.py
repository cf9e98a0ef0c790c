"""Call noise (`sim.cost.noise`): measured from a calibration's rounds, drawn in replays, predicted over them."""
import json
import math

import pytest

import policies
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.cost.fields import ProfileError
from sim.metrics.scoring import score
from sim.cost.noise import MIN_CALLS, POINTS, CallNoise, measure
from sim.predict import predict
from sim.cost.schema import check_profile
from sim.replay import simulate
from traces.trace import Request, Trace

SPEEDS = [1.0, 1.1, 0.9]


def points(n, stall=None, disturbed=None):
    """n grid points timed in three rounds at the rounds' speeds. `stall`: (k, factor): every k-th
    point is slowed in one round, the rounds taking turns; `disturbed`: (round, factor): every
    point of that round slowed."""
    out = []
    for i in range(n):
        times = [0.01 * (i + 1) * v for v in SPEEDS]
        if stall and i % stall[0] == 0:
            times[(i // stall[0]) % len(SPEEDS)] *= stall[1]
        if disturbed and i % 2:
            times[disturbed[0]] *= disturbed[1]
        out.append({"step": "decode", "times": times, "seconds": sorted(times)[1]})
    return out


def test_a_rounds_speed_is_divided_out():
    noise = measure(points(30), SPEEDS)
    assert noise.calls == 90 and len(noise.quantiles) == POINTS
    assert noise.quantiles == pytest.approx([1.0] * POINTS)


def test_stalls_make_the_upper_tail():
    noise = measure(points(60, stall=(5, 1.5)), SPEEDS)  # 4 of each round's 60 timings
    assert noise.at(0.5) == pytest.approx(1.0)
    assert noise.at(1.0) == pytest.approx(1.5)  # the stalled timing over its point's median
    assert noise.at(0.9) == pytest.approx(1.0)
    assert list(noise.quantiles) == sorted(noise.quantiles)


def test_one_disturbed_round_does_not_set_the_tails():
    """Half the points of one round 2.5x slow (another process ran), its speed barely moved."""
    noisy = measure(points(60, stall=(5, 1.5), disturbed=(2, 2.5)), SPEEDS)
    assert noisy.at(0.5) == pytest.approx(1.0) and noisy.at(1.0) == pytest.approx(1.5)  # not 2.5


def test_two_rounds_are_spread_to_a_single_timings_deviation():
    """With two timings, each lies from their mean by half their difference: a 1.5x stall reads
    1.2 there, and sqrt(2) times that deviation (1.28) is read; without a stall, nothing moves."""
    two = [{"step": "decode", "times": t[:2], "seconds": sum(t[:2]) / 2} for t in
           (p["times"] for p in points(60, stall=(3, 1.5)))]  # rounds 0 and 1 take turns stalling
    noise = measure(two, SPEEDS[:2])
    assert noise.at(1.0) == pytest.approx(1 + 2 ** 0.5 * 0.2)
    assert noise.at(0.0) == pytest.approx(1 - 2 ** 0.5 * 0.2)
    assert noise.at(0.5) == pytest.approx(1.0)
    quiet = [{"step": "decode", "times": [0.01 * i, 0.011 * i], "seconds": 0.0105 * i} for i in range(1, 60)]
    assert measure(quiet, [1.0, 1.1]).quantiles == pytest.approx([1.0] * POINTS)


def test_too_few_timings_say_nothing():
    assert measure(points(MIN_CALLS // 3 - 1), SPEEDS) is None
    assert measure([{"step": "decode", "times": [0.1, 0.2], "seconds": 0.15}] * 100, SPEEDS) is None  # rounds differ


def test_draws_are_seeded_and_inside_the_measured_range():
    noise = CallNoise((0.8, 1.0, 1.0, 1.6), 100)
    a, b = noise.sampler(3), noise.sampler(3)
    draws = [a() for _ in range(2000)]
    assert draws == [b() for _ in range(2000)]
    assert draws != [noise.sampler(4)() for _ in range(2000)]
    assert 0.8 <= min(draws) and max(draws) <= 1.6
    assert sorted(draws)[1000] == pytest.approx(1.0, abs=0.02)


def trace():
    return Trace([Request(str(i), 0.3 * i, 40 + 17 * i, 6) for i in range(5)])


def test_a_factor_multiplies_every_call():
    cost, policy = cost_model(load_profile(BUILTIN)), lambda: policies.make("chunked", budget=16, batch_size=2)
    typical = simulate(trace(), policy(), cost, steady=False)
    same = simulate(trace(), policy(), cost, noise=CallNoise((1.0, 1.0), 1).sampler(0))
    assert same.to_dict() == typical.to_dict()
    # with no idle time (everything arrived), twice as slow calls make a log twice as long, call by call
    t0 = Trace([Request(r.id, 0.0, r.prompt_len, r.output_len) for r in trace().requests])
    one = simulate(t0, policy(), cost, steady=False)
    two = simulate(t0, policy(), cost, noise=CallNoise((2.0, 2.0), 1).sampler(0))
    assert [c.kind for c in two.calls] == [c.kind for c in one.calls]
    assert [c.end - c.start for c in two.calls] == pytest.approx([2 * (c.end - c.start) for c in one.calls])


def test_prediction_is_the_median_over_replays():
    cost = cost_model(load_profile(BUILTIN))
    policy = lambda: policies.make("chunked", budget=16, batch_size=2)
    plain, none = predict(trace(), policy, cost)
    assert none == {} and plain == score(simulate(trace(), policy(), cost))
    noise = CallNoise((0.9, 1.0, 1.0, 1.5), 100)
    got, spread = predict(trace(), policy, cost, noise, replicas=7)
    assert (got, spread) == predict(trace(), policy, cost, noise, replicas=7)  # the same every time
    runs = [score(simulate(trace(), policy(), cost, noise=noise.sampler(i))) for i in range(7)]
    for k in ("decode_gap_max_ms", "p99_itl_ms", "makespan_s"):
        vals = sorted(r[k] for r in runs)
        assert got[k] == vals[3] and spread[k] == (vals[0], vals[-1])
    assert got["decode_gap_max_ms"] > plain["decode_gap_max_ms"]  # the worst call of many is slower than typical
    assert math.isnan(got["request_goodput"])  # no target: no replay has it


@pytest.mark.parametrize("noise, says", [
    ({"quantiles": [1.0], "calls": 5}, "at least two"),
    ({"quantiles": [1.2, 1.0], "calls": 5}, "not decreasing"),
    ({"quantiles": [1.0, float("nan")], "calls": 5}, "finite"),
    ({"quantiles": "x", "calls": 5}, "list of numbers"),
    ({"quantiles": [1.0, 1.1], "calls": 0}, "fit.noise.calls"),
])
def test_a_damaged_noise_section_is_named(noise, says):
    prof = json.loads(BUILTIN.read_text())
    prof.setdefault("fit", {})["noise"] = noise
    with pytest.raises(ProfileError, match=says) as e:
        check_profile(prof, "p.json")
    assert "fit.noise" in str(e.value) and "\n" not in str(e.value)

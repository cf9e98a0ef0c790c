"""A round another process slowed is timed again, a bounded number of times, and a round that
stays slow is not fitted as if quiet: each point is then priced at its fastest round."""
from calibrate.measure.grid import TINY
from calibrate.measure.profiler import ONCE, RETRIES, point_time, run_grid


def grid_run(tmp_path, slow_round: int, slow_tries: int, capsys):
    visits: dict[str, int] = {}

    class Profiler:
        def measure(self, point):
            k = point["key"]
            visits[k] = visits.get(k, 0) + 1
            timing = visits[k] - (0 if point["step"] in ONCE else TINY.warmup)  # after the warm-up round
            if timing < 1:
                return dict(point, seconds=9.0)  # a warm-up's time is never fitted
            # timing r + 1 is round r's; retries of the slow round come after every round
            slowed = timing == slow_round + 1 or (timing > TINY.repeats and timing - TINY.repeats <= slow_tries)
            return dict(point, seconds=1.6 if slowed else 1.0)
    samples = run_grid(None, TINY, tmp_path / "p.jsonl", {"t": 1}, progress=False, profiler=Profiler())
    return samples, visits, capsys.readouterr()


def test_a_disturbed_round_is_timed_again_and_then_fits_as_quiet(tmp_path, capsys):
    samples, visits, out = grid_run(tmp_path, slow_round=1, slow_tries=0, capsys=capsys)
    assert "round 2 ran 1.60x slower" in out.err + out.out and "1 of 2 tries" in out.err + out.out
    assert all(s["seconds"] == 1.0 for s in samples)
    assert max(visits.values()) == TINY.warmup + TINY.repeats + 1  # one retry of every point of that round


def test_a_round_that_stays_slow_is_priced_at_the_fastest_round(tmp_path, capsys):
    samples, visits, out = grid_run(tmp_path, slow_round=1, slow_tries=RETRIES, capsys=capsys)
    assert f"still ran 1.60x slower after {RETRIES} tries" in out.err + out.out
    assert all(s["seconds"] == 1.0 for s in samples) and max(visits.values()) == TINY.warmup + TINY.repeats + RETRIES
    # the sample says so, and a refit (`calibrate.calibration.refitted`) prices it the same way
    assert all(s["fastest"] and point_time(dict(s, times=[1.3, 1.2, 1.6])) == 1.2 for s in samples)
    assert point_time({"times": [1.3, 1.2, 1.6]}) == 1.3  # a quiet point: the median


def test_a_quiet_calibration_is_timed_once(tmp_path, capsys):
    samples, visits, out = grid_run(tmp_path, slow_round=99, slow_tries=0, capsys=capsys)
    assert "slower" not in out.err + out.out and all(s["seconds"] == 1.0 for s in samples)
    # one untimed warm-up round, then each round once (the host overhead's run: once, timed)
    assert all(n == (1 if k in ONCE else TINY.warmup + TINY.repeats) for k, n in visits.items())

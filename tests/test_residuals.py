"""Where a measured run's calls ran off its own pace (`sim.metrics.residuals.off_stretches`): the
host's slow stretches, told from a price's miss by the call kinds they touch."""
import pytest

from sim.cost.model import LinearCostModel
from sim.engine.log import Call, EventLog
from sim.metrics.residuals import off_stretches, price_call


def _run_with_a_slow_stretch(slow_kinds: set[str], factor: float = 1.25):
    """120 calls alternating prefill and decode, each taking its price, except calls 50-79 of
    `slow_kinds`, which take `factor` times it."""
    cost, log, t = LinearCostModel((1e-3, 1e-5, 0.0), (2e-3, 1e-4, 0.0)), EventLog(), 0.0
    for i in range(120):
        c = Call("prefill", t, t, ("a",), 32, 0) if i % 2 else Call("decode", t, t, ("a",), 1, 0, (10,))
        took = price_call(cost, c) * (factor if 50 <= i < 80 and c.kind in slow_kinds else 1.0)
        log.add(c._replace(end=t + took))
        t += took
    return log, cost


def test_a_stretch_off_the_runs_pace_is_found_and_told_by_kind():
    log, cost = _run_with_a_slow_stretch({"prefill", "decode"})
    (st,) = off_stretches(log, cost)
    calls = log.calls
    assert st["start_s"] == calls[50].start and st["end_s"] == calls[79].end and st["calls"] == 30
    assert st["ratio"] == pytest.approx(0.8) and set(st["by_kind"]) == {"prefill", "decode"}
    assert all(v == pytest.approx(0.8) for v in st["by_kind"].values())  # every kind alike: the host
    log, cost = _run_with_a_slow_stretch({"prefill", "decode"}, factor=0.8)  # a fast one too
    (st,) = off_stretches(log, cost)
    assert st["ratio"] == pytest.approx(1.25)
    for quiet in (set(), {"prefill", "decode"}):
        log, cost = _run_with_a_slow_stretch(quiet, factor=1.05)  # within the run's own noise
        assert off_stretches(log, cost) == []

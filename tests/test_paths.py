"""`sim.metrics.decisions`: where a replay leaves a measured run's path, and what it missed before."""
import pytest

import policies
from sim.cost.model import LinearCostModel
from sim.metrics.decisions import first_difference, parting, path, paths_of, summary
from sim.replay import simulate
from traces.trace import Request, Trace

# a arrives alone; b arrives 50 ms later: with 1 ms decodes a has finished by then, with 20 ms
# decodes a is still decoding, so eager prefills b between two of a's decodes
TRACE = Trace([Request("a", 0.0, 32, 6), Request("b", 0.05, 16, 3)])
FAST = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 0.0, 0.0))
SLOW = LinearCostModel((1e-3, 1e-5, 0.0), (20e-3, 0.0, 0.0))


def run(cost):
    return simulate(TRACE, policies.make("eager", batch_size=4), cost)


def test_a_replay_on_the_runs_path_does_not_part():
    log = run(SLOW)
    assert parting(log, run(SLOW)) is None
    assert paths_of([log], [0], [run(SLOW), run(SLOW)], run(SLOW)) == {
        "replays": 2, "runs": [{"repeat": 0, "same": 2, "parted": None}]}
    assert summary(paths_of([log], [0], [run(SLOW)], run(SLOW))).endswith("took every run's path")


def test_a_replay_that_runs_fast_parts_where_the_engine_prefills_the_late_request():
    engine, replay = run(SLOW), run(FAST)
    i = first_difference(path(engine), path(replay))
    assert i is not None and path(engine)[:i] == path(replay)[:i]
    p = parting(engine, replay)
    # the engine, 20 ms a decode, is still serving a when b arrives; the replay has finished a
    assert p.call == i and p.engine == "prefill b (16 tokens)" and p.replay == "decode a"
    assert p.at_s == engine.calls[i].start >= 0.05 > replay.calls[i].start
    assert p.replay_ahead_s == pytest.approx(engine.calls[i].start - replay.calls[i].start)
    # before it, every call the replay missed is one of a's decodes: 20 ms measured, 1 ms replayed
    assert p.missed == "decode a"
    assert p.missed_measured_s == pytest.approx(20e-3) and p.missed_replayed_s == pytest.approx(1e-3)
    assert engine.calls[i].start > p.missed_at_s
    report = paths_of([engine, engine], [0, 1], [replay, run(SLOW)], replay)
    assert [r["same"] for r in report["runs"]] == [1, 1]
    assert report["runs"][0]["parted"]["call"] == i
    line = summary(report)
    assert f"parts at {engine.calls[i].start:.2f} s (call {i}: the engine ran prefill b (16 tokens), " \
           f"the replay decode a), its clock {p.replay_ahead_s:.2f} s ahead of the engine's" in line
    assert "decode a at" in line
    assert "s behind the engine's" in summary(paths_of([replay], [0], [engine], engine))  # the other way round


def test_a_path_that_ends_first_parts_at_its_end():
    longer = [("prefill", ("a",), 8), ("decode", ("a",), 1)]
    assert first_difference(longer, longer[:1]) == 1 and first_difference(longer[:1], longer) == 1
    assert first_difference(longer, list(longer)) is None

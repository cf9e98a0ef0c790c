"""mlx-lm's next() as the server runs it (`sim.engine.pipeline`): hand-worked timelines, what every
run keeps, and a simulated run scored as a measured one (each call priced at its own span)."""
import statistics

import pytest
from hypothesis import given, settings, strategies as st

import policies
from sim.cost.mlxlm import MlxLmCosts
from sim.cost.model import LinearCostModel
from sim.engine.pipeline import Pipeline, renewed
from sim.metrics.residuals import call_ratios, priced_calls
from sim.replay import simulate
from traces.trace import Request, Trace


def returns(pipe: Pipeline, calls: list[tuple[str, float]], start: float = 0.0) -> list[float]:
    """Each call's return on the host, each starting where the one before returned."""
    out = []
    for kind, seconds in calls:
        start = pipe.call(kind, start, seconds)
        out.append(start)
    return out


def test_steps_on_a_busy_device_come_at_the_devices_pace():
    # each step: 1 s building on the host, 2 s on the device. The host queues step k+1 while the
    # device runs step k, and next() returns step k's tokens when it ends: every 2 s, not every 3
    assert returns(Pipeline({"generate": 1.0}), [("generate", 3.0)] * 4) == [1.0, 3.0, 5.0, 7.0]


def test_steps_on_a_busy_host_come_at_the_hosts_pace():
    # 3 s building, 1 s on the device: the device waits for the host
    assert returns(Pipeline({"generate": 3.0}), [("generate", 4.0)] * 3) == [3.0, 6.0, 9.0]


def test_a_prompt_call_waits_for_everything_queued():
    # the step is queued at 1 (device until 3); the prompt call is built by 2, runs 3-7, and
    # next() returns when it ends: 7, where one call after the other would end at 8
    assert returns(Pipeline({"generate": 1.0, "prompt": 1.0}), [("generate", 3.0), ("prompt", 5.0)]) == [1.0, 7.0]


def test_the_first_token_comes_when_the_first_forward_has_run():
    # a first forward is queued and not waited for (device until 3); the next step returns its
    # token, so it waits for it: 3, not the step's own end (5)
    pipe = Pipeline({"generate": 1.0, "first": 1.0})
    assert returns(pipe, [("first", 3.0), ("generate", 3.0)]) == [1.0, 3.0]
    assert pipe.device == 5.0 and pipe.pending == 5.0


def test_a_step_rows_leave_waits_for_its_own_forward():
    # the batch's filter reads its padding, which waits for the queued forward (device until 5);
    # the step after finds its tokens ready and returns once built: 1 s later, where steps come 2 s apart
    pipe, back = Pipeline({"generate": 1.0}), []
    for leaving in (False, True, False):
        back.append(pipe.call("generate", back[-1] if back else 0.0, 3.0, leaving))
    assert back == [1.0, 5.0, 6.0]


def test_a_step_after_rows_changed_waits_for_its_own_forward():
    # its input tokens are a new array (gathered or concatenated), evaluated with its own forward:
    # the second step returns when that forward ends (5), the third once built (6)
    pipe, back = Pipeline({"generate": 1.0}), []
    for fresh in (False, True, False):
        back.append(pipe.call("generate", back[-1] if back else 0.0, 3.0, renewed=fresh))
    assert back == [1.0, 5.0, 6.0]


@pytest.mark.parametrize("rids, stepped, fresh", [
    (("a", "b"), (), True),  # the generator's first batch: tokens concatenated onto its empty one
    (("a", "b"), ("a", "b"), False),  # the same rows: the last step's own tokens
    (("a",), ("a", "b"), True),  # b left: the filter gathers a's token
    (("a", "b", "c"), ("a", "b"), True),  # c joined: `extend` concatenates
    (("a", "c"), ("a", "b"), True),  # both
    (("c",), ("a", "b"), False),  # every row left, then c joined: its tokens as they are
])
def test_which_steps_read_new_tokens(rids, stepped, fresh):
    assert renewed(rids, stepped) is fresh


def test_the_split_before_a_first_forward_lies_in_the_call_before_it():
    # the step is queued at 1 (device until 3); the split's filters wait for it before the first
    # forward's model call, where a measured run reads that call's start: the step's span ends at 3
    pipe = Pipeline({"generate": 1.0, "first": 1.0})
    assert pipe.call("generate", 0.0, 3.0, split_after=True) == 3.0
    assert pipe.call("first", 3.0, 3.0) == 4.0 and pipe.device == 6.0


@pytest.mark.parametrize("measured, device", [(5.0, 6.0), (2.0, 3.0), (3.0, 4.0)])
def test_a_measured_return_moves_what_the_device_has_left(measured, device):
    # queued at 1, the device until 4, back at 3 with its 1 s tail left; a run that came back at
    # `measured` has that tail left after it, later or sooner
    pipe = Pipeline({"generate": 1.0}, {"generate": 1.0})
    assert pipe.call("generate", 0.0, 4.0) == 3.0
    pipe.returned(3.0, measured)
    assert pipe.device == device


def test_a_first_forward_is_built_when_the_device_is_idle():
    # split off the prompt batch, whose filters wait for the step queued before it (until 3)
    pipe = Pipeline({"generate": 1.0, "first": 1.0})
    assert returns(pipe, [("generate", 3.0), ("first", 3.0)]) == [1.0, 4.0] and pipe.device == 6.0


def test_queueing_returns_when_the_device_has_its_tail_left():
    # MLX bounds the tasks in flight: `mx.async_eval` returns once only the call's last 1 s is left.
    # Steps of 4 s (0.5 of it on the host) come at the device's pace (3.5 s), each 1 s before its
    # own forward ends (at 4, 7.5, 11)
    pipe = Pipeline({"generate": 0.5}, {"generate": 1.0})
    assert returns(pipe, [("generate", 4.0)] * 3) == [3.0, 6.5, 10.0]
    # without the bound, next() returns the previous step's tokens as soon as it has queued its own
    assert returns(Pipeline({"generate": 0.5}), [("generate", 4.0)] * 3) == [0.5, 4.0, 7.5]


def test_a_host_part_above_the_price_is_the_whole_price():
    assert returns(Pipeline({"generate": 5.0}), [("generate", 2.0)] * 2) == [2.0, 4.0]


calls = st.lists(st.tuples(st.sampled_from(["generate", "first", "prompt"]), st.floats(1e-4, 0.5),
                           st.floats(0, 0.5), st.booleans(), st.booleans()), min_size=1, max_size=30)
hosts = st.fixed_dictionaries({k: st.floats(0, 0.1) for k in ("generate", "first", "prompt")})
tails = st.dictionaries(st.sampled_from(["generate", "first"]), st.floats(0, 0.5))


@settings(max_examples=300, deadline=None)
@given(calls, hosts, tails)
def test_never_later_than_one_call_after_another(seq, host, tail):
    """With the same host work between calls, next() pipelined returns no later than the calls
    run one after another, never before the host has built the call, and the device runs
    every call's device part, one at a time."""
    pipe, t, synced, device_work = Pipeline(host, tail), 0.0, 0.0, 0.0
    for kind, seconds, between, leaving, fresh in seq:
        t, synced = t + between, synced + between
        back = pipe.call(kind, t, seconds, leaving, fresh)
        own = min(host[kind], seconds)
        assert back >= t + own - 1e-12
        synced += seconds
        assert back <= synced + 1e-9
        device_work += seconds - own
        assert pipe.device >= device_work - 1e-9 and pipe.device <= synced + 1e-9
        t = back


def mlx_costs(host: dict | None, scale: float = 1.0) -> LinearCostModel:
    mlx = MlxLmCosts(tuple(scale * c for c in (2e-3, 4e-5, 1e-8, 1e-7)), tuple(scale * c for c in (3e-3, 2e-4, 1e-6, 1e-6)),
                     first=scale * 5e-4, iteration=2e-4, host=host)
    return LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), mlx=mlx, pdsim_forms=False)


@st.composite
def at_once(draw):
    n = draw(st.integers(1, 8))
    return Trace([Request(str(i), 0.0, draw(st.integers(1, 90)), draw(st.integers(1, 12))) for i in range(n)])


options = st.fixed_dictionaries({"prefill_step": st.integers(1, 64), "prompt_concurrency": st.integers(1, 5),
                                 "decode_concurrency": st.integers(1, 6)})


@settings(max_examples=100, deadline=None)
@given(at_once(), options, st.floats(0, 4e-3))
def test_a_pipelined_replay_makes_the_same_calls_sooner(trace, opts, part):
    """All requests at once, so timing cannot change a decision: the same calls in the same order,
    each ending no later than one after another; every token accounted for, in time order."""
    policy = policies.make("mlx-lm", **opts)
    synced = simulate(trace, policy, mlx_costs(None))
    piped = simulate(trace, policy, mlx_costs({"generate": part, "first": part, "prompt": part / 2}))
    assert piped.pipelined and not synced.pipelined
    assert [c._replace(start=0, end=0) for c in piped.calls] == [c._replace(start=0, end=0) for c in synced.calls]
    prev = 0.0
    for p, s in zip(piped.calls, synced.calls):
        assert prev <= p.start <= p.end <= s.end + 1e-9
        prev = p.end
    assert {r: len(t) for r, t in piped.tokens.items()} == {r.id: r.output_len for r in trace.requests}
    assert all(t == sorted(t) for t in piped.tokens.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_simulated_run_scored_as_measured_prices_each_call_at_its_span(seed):
    """What confirm does with a pipelined run's log: each call priced from its start with the
    device's queue as the model ran it. On the simulator's own log that is each call's span."""
    import random
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(12):
        t += rng.choice([0.0, 0.002, 0.02, 0.1])
        reqs.append(Request(str(i), t, rng.randint(3, 80), rng.randint(1, 10)))
    cost = mlx_costs({"generate": 2e-3, "first": 1e-3, "prompt": 1e-3})
    log = simulate(Trace(reqs), policies.make("mlx-lm", prefill_step=16, prompt_concurrency=3,
                                              decode_concurrency=3), cost)
    priced = list(priced_calls(log, cost))
    assert len(priced) == log.call_count
    assert all(p == c.end - c.start for c, _, p in priced)
    assert {r for _, _, r in call_ratios([log], cost)} == {1.0}
    # the same log as if run one call after another: each call's price, its span no longer
    log.pipelined = False
    assert any(r > 1.0 for _, _, r in call_ratios([log], cost))
    # priced twice as dear, the calls cost about twice their spans, not more and more as the run goes
    # on: the device's clock is set back where the run shows it (idle after a prompt call, a leave)
    log.pipelined = True
    dear = mlx_costs({"generate": 2e-3, "first": 1e-3, "prompt": 1e-3}, scale=2.0)
    dear.mlx.tail = {"generate": 1e-3, "first": 1e-3}
    assert 1.5 < statistics.median(r for _, _, r in call_ratios([log], dear)) < 2.5  # unset: 10-20


@st.composite
def spread(draw):
    reqs, t = [], 0.0
    for i in range(draw(st.integers(1, 10))):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.05, 1.0]))
        reqs.append(Request(str(i), t, draw(st.integers(1, 90)), draw(st.integers(1, 12))))
    return Trace(reqs)


@settings(max_examples=150, deadline=None)
@given(spread(), options, st.floats(0, 4e-3))
def test_steady_stretches_write_the_call_by_call_log(trace, opts, part):
    """A pipelined run's steps of an unchanged generation batch, priced as one stretch, give
    exactly the call-by-call replay's log (its calls, their floats, every token's time)."""
    cost = mlx_costs({"generate": part, "first": part, "prompt": part})
    bulk = simulate(trace, policies.make("mlx-lm", **opts), cost)
    one_by_one = simulate(trace, policies.make("mlx-lm", **opts), cost, steady=False)
    assert bulk.calls == one_by_one.calls
    assert bulk.tokens == one_by_one.tokens


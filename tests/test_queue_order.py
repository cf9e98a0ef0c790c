"""Queue order (`queue=fcfs|sjf|priority`, `aging_s`): invariants over random traces with classes,
the settings and commands that carry it, priority classes in every trace format, per-class metrics."""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

import policies
from sim.cli import main
from sim.cost.model import LinearCostModel
from sim.metrics.scoring import class_metrics, log_class_metrics
from sim.replay import simulate
from policies.settings import Setting, grid_settings, setting_label
from traces.classes import parse_class_slo, with_class_targets
from traces.generators import bursty_classes
from traces.load import load_file
from traces.trace import Request, Trace, TraceError

from test_sim_properties import costs

PDSIM_POLICIES = [name for name, info in policies.POLICIES.items() if info.engine == "pdsim"]


@st.composite
def class_traces(draw):
    """Up to 9 requests in bursts, each of class a (a TTFT target), b (another) or c (none)."""
    n = draw(st.integers(1, 9))
    targets = {"a": draw(st.floats(1, 5000)), "b": draw(st.floats(1, 5000)), "c": None}
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.05, 0.5, 2.0]))
        out = draw(st.integers(1, 10))
        cls = draw(st.sampled_from("abc"))
        reqs.append(Request(str(i), t, draw(st.integers(1, 300)), out, cls=cls, ttft_slo_ms=targets[cls],
                            prefilled=out >= 2 and i == 0 and draw(st.booleans())))
    return Trace(reqs)


queued_settings = st.fixed_dictionaries({
    "policy": st.sampled_from(PDSIM_POLICIES),
    "budget": st.integers(1, 256),
    "batch_size": st.integers(1, 5),
    "decode": st.sampled_from(["batched", "single"]),
    "order": st.sampled_from(["chunk-first", "decode-first"]),
    "queue": st.sampled_from(policies.QUEUES),
    "aging_s": st.one_of(st.floats(1e-3, 2.0), st.just(1e6)),
})


def decisions(trace: Trace, log) -> list[tuple[float, str, set[str]]]:
    """(when, request, the requests waiting then that had not started) for every first prefill
    chunk: the policy decided at the end of the previous iteration, or at the request's arrival
    after an idle wait (the engine admits arrivals between iterations)."""
    reqs = {r.id: r for r in trace.requests}
    calls = log.calls
    first = {}
    for c in calls:
        if c.kind == "prefill":
            first.setdefault(c.rids[0], c)
    out = []
    for rid, c in first.items():
        prev = max((p.end for p in calls if p.iteration < c.iteration), default=0.0)
        when = max(prev, reqs[rid].arrival)
        waiting = {r for r, f in first.items() if r != rid and reqs[r].arrival <= when and f.start > c.start}
        out.append((when, rid, waiting))
    return out


@settings(max_examples=200, deadline=None)
@given(class_traces(), queued_settings, costs)
def test_queue_order_invariants(trace, setting, cost):
    policy = policies.make(**setting)
    log = simulate(trace, policy, cost)
    reqs = {r.id: r for r in trace.requests}
    index = {r.id: i for i, r in enumerate(trace.requests)}

    # tokens conserved: every request gets its output budget; chunks tile each prompt, within the budget
    assert {rid: len(t) for rid, t in log.tokens.items()} == {r.id: r.output_len for r in trace.requests}
    covered = {r.id: 0 for r in trace.requests}
    for c in log.calls:
        if c.kind == "prefill":
            assert c.prefix == covered[c.rids[0]]
            covered[c.rids[0]] += c.tokens
            if setting["policy"] == "chunked":
                assert c.tokens <= setting["budget"]
    assert covered == {r.id: 0 if r.prefilled else r.prompt_len for r in trace.requests}

    # a started prefill is finished before another one starts
    prefills = [c.rids[0] for c in log.calls if c.kind == "prefill"]
    assert [r for i, r in enumerate(prefills) if i == 0 or prefills[i - 1] != r] == list(dict.fromkeys(prefills))

    aging = setting["aging_s"] if setting["queue"] != "fcfs" else None
    for when, rid, waiting in decisions(trace, log):
        for other in waiting:
            if index[other] < index[rid] and aging is not None:  # no starvation past the aging bound
                assert when - reqs[other].arrival <= aging
            if setting["queue"] == "fcfs":
                assert index[other] > index[rid]
            elif not any(when - reqs[o].arrival > aging for o in waiting | {rid}):  # the order itself
                key = (lambda r: r.prompt_len) if setting["queue"] == "sjf" else \
                    (lambda r: math.inf if r.ttft_slo_ms is None else r.arrival + r.ttft_slo_ms / 1e3)
                assert (key(reqs[rid]), index[rid]) < (key(reqs[other]), index[other])

    # deterministic, and the steady stretches write the call-by-call log
    assert simulate(trace, policies.make(**setting), cost).to_dict() == log.to_dict()
    one_by_one = simulate(trace, policies.make(**setting), cost, steady=False)
    assert one_by_one.calls == log.calls and one_by_one.tokens == log.tokens


def test_sjf_and_priority_reorder_a_queue_and_aging_restores_arrival_order():
    cost = LinearCostModel((1e-2, 1e-2, 0.0), (1e-2, 0.0, 0.0), 0.0)  # 10 ms a prompt token
    reqs = [Request("long", 0.0, 200, 2, cls="bulk"), Request("mid", 0.0, 100, 2, cls="bulk"),
            Request("tight", 0.0, 150, 2, cls="tight", ttft_slo_ms=100.0),
            Request("short", 0.0, 10, 2, cls="bulk")]
    trace = Trace(reqs)
    order = lambda **o: list(dict.fromkeys(c.rids[0] for c in simulate(trace, policies.make("fifo", **o), cost).calls
                                           if c.kind == "prefill"))
    assert order() == ["long", "mid", "tight", "short"]
    assert order(queue="sjf") == ["short", "mid", "tight", "long"]
    assert order(queue="priority") == ["tight", "long", "mid", "short"]  # no target: arrival order, after
    # short and mid are served by t = 1.14 s: then long, the oldest, has waited past the 1 s bound
    assert order(queue="sjf", aging_s=1.0) == ["short", "mid", "long", "tight"]



def test_a_steady_stretch_stops_where_the_oldest_waiting_request_ages():
    """Request a decodes alone; b, the tightest prompt, does not fit the KV limit beside it and
    waits at the queue's head, and c (no target) waits behind b. At 0.5 s c reaches the aging
    bound and is prefilled next though nothing arrived or finished: the decode stretch must stop
    there, as the call-by-call replay does (hypothesis found a case of this), not run on until a ends."""
    cost = LinearCostModel((0.03125, 0.0, 0.0), (0.03125, 0.0, 0.0), 0.0)
    trace = Trace([Request("c", 0.0, 1, 1), Request("a", 0.0, 1, 40, ttft_slo_ms=10.0),
                   Request("b", 0.0, 44, 1, ttft_slo_ms=10.0)])
    setting = dict(policy="eager", budget=1, batch_size=1, queue="priority", aging_s=0.5, kv_limit=45)
    log = simulate(trace, policies.make(**setting), cost)
    aged = next(c for c in log.calls if c.kind == "prefill" and c.rids == ("c",))
    assert 0.5 <= aged.start < 0.5 + 2 * 0.03125  # the first iteration to start at or after the bound
    assert simulate(trace, policies.make(**setting), cost, steady=False).calls == log.calls

def test_settings_labels_and_grids_carry_the_queue():
    assert setting_label({"policy": "chunked", "budget": 64, "queue": "priority"}) == "chunked/b64/bs4/priority"
    assert setting_label({"policy": "fifo", "queue": "sjf", "aging_s": 60}) == "fifo/sjf/age60s"
    assert setting_label({"policy": "chunked", "budget": 64}) == "chunked/b64/bs4"  # fcfs: labels as before
    # fcfs reads no aging bound: one setting; mlx-lm is FIFO: a queue axis does not multiply it
    assert Setting.of({"policy": "eager", "aging_s": 5}) == Setting.of({"policy": "eager"})
    grid = grid_settings(["chunked", "mlx-lm"], [32], queues=["fcfs", "sjf", "priority"], agings=[10, 30])
    assert [setting_label(s) for s in grid] == ["chunked/b32/bs4", "chunked/b32/bs4/sjf/age10s", "chunked/b32/bs4/sjf",
                                                "chunked/b32/bs4/priority/age10s", "chunked/b32/bs4/priority",
                                                "mlx-lm/s2048/p8/d32"]
    with pytest.raises(policies.PolicyError, match="mlx-lm: queue must be fcfs"):
        policies.make("mlx-lm", queue="sjf")
    with pytest.raises(policies.PolicyError, match="queue must be one of"):
        policies.make("chunked", 8, queue="lifo")
    with pytest.raises(policies.PolicyError, match="aging_s must be"):
        policies.make("chunked", 8, queue="sjf", aging_s=0)


def test_classes_in_every_format_and_their_targets(tmp_path):
    csv = tmp_path / "v.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,class,ttft_slo_ms\n0,10,2,tight,500\n"
                   "1,20,3,bulk,\n")
    trace = load_file(csv)
    assert [(r.cls, r.ttft_slo_ms) for r in trace.requests] == [("tight", 500.0), ("bulk", None)]
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "class": "x", "ttft_slo_ms": 9}\n')
    assert load_file(moon).requests[0].cls == "x"
    lengths = tmp_path / "l.csv"
    lengths.write_text("prompt_len,output_len,class\n5,2,q\n6,2,\n")
    assert [r.cls for r in load_file(lengths).requests] == ["q", None]
    # pdsim's JSONL round-trips them; a trace without classes hashes as before they existed
    out = tmp_path / "t.jsonl"
    trace.save_jsonl(out)
    assert load_file(out).requests == trace.requests
    plain = Trace([Request("0", 0.0, 5, 2)])
    assert json.dumps(plain.requests[0].to_dict()) == '{"id": "0", "arrival": 0.0, "prompt_len": 5, "output_len": 2}'
    # --class-slo gives a class's requests its target, and refuses a class no trace holds
    (targeted,) = with_class_targets({"t": trace}, parse_class_slo(["bulk:ttft=2000"])).values()
    assert [r.ttft_slo_ms for r in targeted.requests] == [500.0, 2000.0]
    assert targeted.sha256() != trace.sha256()
    with pytest.raises(TraceError, match="no request of class 'bluk'"):
        with_class_targets({"t": trace}, parse_class_slo(["bluk:ttft=2000"]))
    for bad in ("tight", "tight:tpot=5", "tight:ttft=0", "tight:ttft=nan", "a b:ttft=5", "tight:ttft=x"):
        with pytest.raises(TraceError, match="--class-slo"):
            parse_class_slo([bad])


def test_bursty_classes_generator():
    t = bursty_classes(40, seed=3)
    assert {r.cls for r in t.requests} == {"tight", "bulk"}
    cut = t.meta["tight_max_in"]
    assert all(r.prompt_len <= cut for r in t.requests if r.cls == "tight")
    assert all(r.prompt_len >= cut for r in t.requests if r.cls == "bulk")
    assert bursty_classes(40, seed=3).sha256() == t.sha256() != bursty_classes(40, seed=4).sha256()
    with pytest.raises(TraceError, match="tight share"):
        bursty_classes(tight_share=1.0)


def test_class_metrics_follow_each_requests_target():
    reqs = [Request("0", 0.0, 5, 2, cls="t", ttft_slo_ms=100.0), Request("1", 0.0, 5, 2, cls="t", ttft_slo_ms=100.0),
            Request("2", 0.0, 5, 2, cls="b"), Request("3", 0.0, 5, 2, cls="t", ttft_slo_ms=100.0)]
    m = class_metrics(reqs, [0.05, 0.2, 1.0, math.nan], [2, 2, 2, 0])
    assert m["t"]["requests"] == 3 and m["t"]["completed"] == 2 and m["t"]["ttft_target_ms"] == 100.0
    assert m["t"]["slo_attained"] == pytest.approx(1 / 3)  # the unfinished request misses it
    assert m["t"]["p99_ttft_ms"] == pytest.approx(50 + 0.99 * 150)
    assert math.isnan(m["b"]["slo_attained"]) and m["b"]["max_ttft_ms"] == pytest.approx(1000)
    assert class_metrics([Request("0", 0.0, 5, 2)], [0.1], [2]) is None
    trace = Trace(reqs[:3])
    log = simulate(trace, policies.make("eager"), LinearCostModel((1e-2, 0, 0), (1e-2, 0, 0), 0.0))
    assert log_class_metrics(trace, log)["t"]["completed"] == 2


def test_priority_cuts_the_tight_class_ttft_on_a_bursty_trace():
    """The must-show's shape in the simulator: priority serves the tight class first, at a cost to bulk."""
    trace, = with_class_targets({"t": bursty_classes(60, rate=2.0, seed=1)}, {"tight": 1000.0}).values()
    cost = LinearCostModel((5e-3, 2e-4, 1e-8), (2e-2, 1e-3, 1e-7), 1e-4)
    by = {q: log_class_metrics(trace, simulate(trace, policies.make("chunked", 32, queue=q), cost))
          for q in ("fcfs", "priority")}
    assert by["priority"]["tight"]["p99_ttft_ms"] < by["fcfs"]["tight"]["p99_ttft_ms"]
    assert by["priority"]["bulk"]["mean_ttft_ms"] > by["fcfs"]["bulk"]["mean_ttft_ms"]


def _cli(args, capsys) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out + out.err


def test_commands_take_the_queue_and_report_classes(tmp_path, capsys):
    code, out = _cli(["policies"], capsys)
    assert code == 0 and "--queue" in out and "--aging-s" in out and "queue, aging_s" in out
    out_json = tmp_path / "m.json"
    code, out = _cli(["simulate", "--trace", "bursty-classes", "--class-slo", "tight:ttft=2000", "--policy",
                      "chunked", "--budget", "32", "--queue", "priority", "--json-out", str(out_json)], capsys)
    assert code == 0, out
    assert "chunked/b32/bs4/priority" in out and "p99_ttft_ms" in out
    doc = json.loads(out_json.read_text())
    assert set(doc["classes"]) == {"tight", "bulk"} and doc["classes"]["tight"]["ttft_target_ms"] == 2000
    assert doc["classes"]["bulk"]["ttft_target_ms"] is None and doc["setting"]["queue"] == "priority"
    code, out = _cli(["sweep", "--trace", "bursty-classes", "--policy", "chunked", "fifo", "--budget", "32",
                      "--queue", "fcfs", "sjf", "--aging-s", "5", "-o", str(tmp_path / "sw"), "--no-progress",
                      "--workers", "1"], capsys)
    assert code == 0, out
    rows = json.loads((tmp_path / "sw" / "results.json").read_text())["rows"]
    assert sorted(r["label"] for r in rows) == ["chunked/b32/bs4", "chunked/b32/bs4/sjf/age5s", "fifo", "fifo/sjf/age5s"]
    assert {(r["queue"], r["aging_s"]) for r in rows} == {("fcfs", None), ("sjf", 5.0)}


@pytest.mark.parametrize("args, needle", [
    (["simulate", "--queue", "lifo"], "--queue"),
    (["simulate", "--queue", "sjf", "--aging-s", "0"], "--aging-s"),
    (["simulate", "--policy", "mlx-lm", "--queue", "sjf"], "mlx-lm: queue must be fcfs"),
    (["sweep", "--setting", "mlx-lm:queue=priority", "-o", "OUT"], "mlx-lm: queue must be fcfs"),
    (["sweep", "--setting", "chunked:queue=sjf,aging_s=-1", "-o", "OUT"], "aging_s"),
    (["sweep", "--setting", "chunked:queue=edf", "-o", "OUT"], "queue must be one of"),
    (["simulate", "--trace", "bursty-classes", "--class-slo", "tight:ttft=-5"], "--class-slo"),
    (["simulate", "--trace", "tinyllm", "--class-slo", "tight:ttft=5"], "no request of class 'tight'"),
    (["traces", "gen", "bursty-classes", "--tight-share", "1.5", "-o", "OUT"], "--tight-share"),
])
def test_bad_queue_input_is_one_line_exit_2(args, needle, tmp_path, capsys):
    args = [str(tmp_path / "o") if a == "OUT" else a for a in args]
    code, out = _cli(args, capsys)
    err = out.strip()
    assert code == 2 and "Traceback" not in err and needle in err.splitlines()[-1], err


@pytest.mark.parametrize("row, needle", [
    ({"class": "a b"}, "class 'a b'"), ({"class": True}, "class must be a name"),
    ({"ttft_slo_ms": -1}, "ttft_slo_ms"), ({"ttft_slo_ms": "5"}, "ttft_slo_ms"),
])
def test_malformed_class_fields_are_refused(row, needle, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "a", "arrival": 0, "prompt_len": 5, "output_len": 3, **row}) + "\n")
    code, out = _cli(["simulate", "--trace", str(path)], capsys)
    assert code == 2 and needle in out and "line 1" in out and "Traceback" not in out, out
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,class\n0,5,3,a;b\n")
    code, out = _cli(["simulate", "--trace", str(csv)], capsys)
    assert code == 2 and "class 'a;b'" in out and "line 2" in out, out


def test_confirm_compares_each_class_predicted_against_measured():
    """`calibrate.confirm.score.compare_classes` on replays: the median over noisy replays per class, and
    measured figures as the median, min and max over runs (here: replays priced 10% slower)."""
    from calibrate.confirm.score import compare_classes
    from sim.cost.noise import CallNoise
    from sim.predict import predict_classes
    trace, = with_class_targets({"t": bursty_classes(12, rate=4.0, seed=2)}, {"tight": 300.0}).values()
    cost = LinearCostModel((5e-3, 2e-4, 1e-8), (2e-2, 1e-3, 1e-7), 1e-4)
    slow = LinearCostModel((5.5e-3, 2.2e-4, 1.1e-8), (2.2e-2, 1.1e-3, 1.1e-7), 1.1e-4)
    policy = lambda: policies.make("chunked", 16, queue="priority")
    noise = CallNoise(tuple(0.9 + 0.2 * i / 40 for i in range(41)), 100)
    pred = predict_classes(trace, policy, cost, noise, 5)
    typical = predict_classes(trace, policy, cost)
    assert set(pred) == {"tight", "bulk"} and pred != typical
    runs = [simulate(trace, policy(), slow), simulate(trace, policy(), slow, noise=noise.sampler(7))]
    out = compare_classes(trace, typical, runs)["classes"]
    tight = out["tight"]
    assert tight["ttft_target_ms"] == 300.0 and set(tight["measured"]) == {"p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
                                                                          "slo_attained"}
    assert tight["rel_error"]["p99_ttft_ms"] < 0  # predicted faster than the slower "measured" runs
    assert out["bulk"]["ttft_target_ms"] is None and "slo_attained" not in out["bulk"]["measured"]
    assert compare_classes(Trace([Request("0", 0.0, 5, 2)]), None, []) == {}
    json.dumps(out, allow_nan=False)

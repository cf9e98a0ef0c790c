"""The speed probes around each confirm run: a machine that runs slower than at its calibration is
seen by them, and the prediction follows it (the one at the calibration's speed kept beside it)."""
import pytest

import policies
from calibrate.confirm.score import compare, probed_speed
from calibrate.measure.speed_probe import SETTING, probe_speed, probe_trace, reference_probes, timed_speed
from calibrate.measure.worker import warmup_trace
from sim.cost.model import LinearCostModel
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.metrics.scoring import score
from sim.predict import replays
from sim.replay import simulate
from policies.settings import setting_label
from sim.cost.speed import XEON_VM, MachineSpeed

PROBE_WEIGHT, RUN_DECODE = XEON_VM.probe_weight, XEON_VM.run_decode  # a profile without speed_rules predates them
from sim.engine.log import EventLog
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
    both = {"prefill": 1 / SLOW, "decode": 1 / SLOW}
    got = probed_speed(runs[0], cost)
    assert [got[k] for k in ("prefill", "decode")] == pytest.approx([1 / SLOW] * 2)
    assert got["before"] == pytest.approx(both) and got["after"] == pytest.approx(both)
    (res,) = compare(prof, trace, [setting], runs, replicas=0)
    assert res["machine_speed"]["median"] == pytest.approx(both)
    # moved PROBE_WEIGHT of the way (in log scale), decodes then RUN_DECODE faster (pdsim's probes)
    partway = {"prefill": SLOW ** -PROBE_WEIGHT, "decode": SLOW ** -PROBE_WEIGHT * RUN_DECODE}
    assert res["machine_speed"]["predicted_at"] == pytest.approx(partway)
    assert [r["repeat"] for r in res["machine_speed"]["runs"]] == [0, 1, 2]
    # that much of the miss at the calibration's speed is gone (the host's time between calls is
    # not scaled); decode-bound figures a little more (these runs decode at their probes' speed)
    for k in ("decode_gap_max_ms", "p99_itl_ms", "p50_ttft_ms", "makespan_s"):
        assert SLOW ** (PROBE_WEIGHT - 1) / RUN_DECODE - 1.01 < res["rel_error"][k] < SLOW ** (PROBE_WEIGHT - 1) - 0.99, k
        assert res["at_calibration_speed"]["rel_error"][k] == pytest.approx(1 / SLOW - 1, abs=0.02), k
    assert res["rel_error"]["p99_itl_ms"] == pytest.approx(SLOW ** (PROBE_WEIGHT - 1) / RUN_DECODE - 1, abs=0.005)
    # the prediction is replays at that speed, and the one beside it at the calibration's
    at_speed, _ = replays(trace, lambda: policies.make(**setting), cost, None, 0, warmup_trace(trace),
                          MachineSpeed(1 / SLOW, 1 / SLOW).partway(XEON_VM))
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


def test_prefills_and_decodes_keep_their_own_speeds():
    """A machine whose prefills run 1.5x their price and decodes at it (memory-bound calls spared):
    the probes read the two apart, and the prediction of a run at them is the run."""
    prof = load_profile(BUILTIN)
    cost, trace = cost_model(prof), tinyllm(num_seqs=4, min_in=20, max_in=90, min_out=4, max_out=9, seed=5)
    setting = {"policy": "chunked", "budget": 16, "batch_size": 2}
    slow_prefills = MachineSpeed(prefill=1 / 1.5).of(cost)
    log = simulate(trace, policies.make(**setting, cost=cost), slow_prefills, warmup=warmup_trace(trace))
    probe = probe_trace(151_936)
    logs = [simulate(probe, policies.make(**SETTING), slow_prefills).to_dict() for _ in range(2)]
    run = {"label": setting_label(setting), "setting": setting, "repeat": 0, "log": log.to_dict(),
           "probe": {"trace": probe.to_dict(), "setting": SETTING, "logs": logs}}
    got = probe_speed([EventLog.from_dict(d) for d in logs], cost)
    assert (got.prefill, got.decode) == pytest.approx((1 / 1.5, 1.0))
    (res,) = compare(prof, trace, [setting], [run], replicas=0)
    assert res["machine_speed"]["median"] == pytest.approx({"prefill": 1 / 1.5, "decode": 1.0})
    assert res["machine_speed"]["predicted_at"] == pytest.approx({"prefill": 1.5 ** -PROBE_WEIGHT, "decode": RUN_DECODE})
    for k in ("decode_gap_max_ms", "p50_ttft_ms", "makespan_s"):
        miss = res["at_calibration_speed"]["rel_error"][k]
        assert miss < -0.02, k  # slower prefills: a miss without the probes
        assert miss < res["rel_error"][k] < 0, k  # and a smaller one, of the same sign, with them


def test_probe_speed_is_the_median_of_its_calls_and_needs_pdsim_prices():
    cost = cost_model(load_profile(BUILTIN))
    probe = probe_trace(151_936)
    # two requests that decode, then four unaligned prompts served by their prefill alone
    assert [(r.prompt_len, r.output_len) for r in probe.requests] == \
        [(32, 8), (64, 8), (21, 1), (37, 1), (45, 1), (53, 1)]
    log = simulate(probe, policies.make(**SETTING), cost, noise=iter([2.0] * 5 + [1.0] * 100).__next__)
    kinds = [c.kind for c in log.calls]
    assert kinds.count("prefill") == 6 and kinds.count("decode") == 14 and kinds[-4:] == ["prefill"] * 4
    # one slow prefill of six moves their median not at all, nor do a few slow decodes of 14
    got = probe_speed([log], cost)
    assert (got.prefill, got.decode) == pytest.approx((1.0, 1.0))
    # the four unaligned prefills slow (the last calls; a sync draws no noise): they set the median
    draws = len(kinds) - kinds.count("sync")
    log = simulate(probe, policies.make(**SETTING), cost, noise=iter([1.0] * (draws - 4) + [2.0] * 4).__next__)
    got = probe_speed([log], cost)
    assert (got.prefill, got.decode) == pytest.approx((0.5, 1.0))
    assert probe_speed([log], LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), pdsim_forms=False)) is None


def probes_at(cost, factor, n=2, probe_cost=1.0):
    """A run's probes as a worker keeps them, every call `factor` times its price, the probe's own
    calls `probe_cost` times more (a model that prices the probe's shapes wrong)."""
    probe = probe_trace(151_936)
    logs = [simulate(probe, policies.make(**SETTING), cost, noise=slow(factor * probe_cost)).to_dict() for _ in range(n)]
    return {"trace": probe.to_dict(), "setting": SETTING, "logs": logs}


def test_probes_are_timed_against_the_calibrations_own_with_no_price_in_it():
    """The model prices the probe's calls 10% fast: on the machine it was calibrated on they ran
    1.1x their price. On a machine 1.25x slower the probes' times against the calibration's read
    1/1.25, where their prices read 1/1.375. The prediction is made at the timed speed, each probe
    against the calibration's in the same place (`positional_speed`); the priced one is kept beside
    it, and used where the calibration kept no probe after its runs, the timed one against all of
    them where the profile cannot price the probe's calls either."""
    prof = load_profile(BUILTIN)
    cost, trace = cost_model(prof), tinyllm(num_seqs=4, min_in=20, max_in=90, min_out=4, max_out=9, seed=3)
    setting = {"policy": "fifo"}
    runs = [dict(measured(trace, setting, cost, SLOW, r), probe=probes_at(cost, SLOW, probe_cost=1.1)) for r in range(2)]
    calibrated = dict(prof, engine_runs=[{"name": f"w{i}", "probe": probes_at(cost, 1.0, probe_cost=1.1)}
                                         for i in range(3)])
    got = probed_speed(runs[0], cost, reference_probes(calibrated))
    assert got["method"] == "positional"
    assert (got["prefill"], got["decode"]) == pytest.approx((1 / SLOW, 1 / SLOW))
    assert got["priced"] == pytest.approx({"prefill": 1 / SLOW / 1.1, "decode": 1 / SLOW / 1.1})
    assert got["timed"] == pytest.approx({"prefill": 1 / SLOW, "decode": 1 / SLOW})
    (res,) = compare(calibrated, trace, [setting], runs, replicas=0)
    assert [r["priced"] for r in res["machine_speed"]["runs"]] == [pytest.approx(got["priced"])] * 2
    # predicted partway to the timed speed: the price's miss on the probe is not the machine's
    assert res["rel_error"]["makespan_s"] == pytest.approx(SLOW ** PROBE_WEIGHT / SLOW - 1, abs=0.02)
    alone = probed_speed(runs[0], cost)  # a profile from before its probes were kept
    assert alone["method"] == "priced" and alone["timed"] is None
    assert (alone["prefill"], alone["decode"]) == pytest.approx((1 / SLOW / 1.1, 1 / SLOW / 1.1))
    before_only = dict(prof, engine_runs=[{"name": f"w{i}", "probe": probes_at(cost, 1.0, n=1, probe_cost=1.1)}
                                          for i in range(3)])  # profiles from before the probe after the run
    assert probed_speed(runs[0], cost, reference_probes(before_only))["method"] == "priced"
    unpriced = LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), pdsim_forms=False)  # prices no pdsim call
    timed = probed_speed(runs[0], unpriced, reference_probes(before_only))
    assert timed["method"] == "timed" and (timed["prefill"], timed["decode"]) == pytest.approx((1 / SLOW, 1 / SLOW))


def test_each_probe_is_timed_against_the_calibrations_in_its_place():
    """A process's first calls fault their memory in: the probe before a run reads 1.3x slower than
    the one after it, in the calibration and in the confirm alike. Timed place by place, both read
    the machine's speed; priced by the profile (fitted on warm calls) or pooled, the before one drags it."""
    cost = cost_model(load_profile(BUILTIN))
    probe = probe_trace(151_936)

    def probes(factor):
        logs = [simulate(probe, policies.make(**SETTING), cost, noise=slow(factor * cold)).to_dict() for cold in (1.3, 1.0)]
        return {"trace": probe.to_dict(), "setting": SETTING, "logs": logs}

    reference = [probes(1.0) for _ in range(3)]
    got = probed_speed({"probe": probes(SLOW)}, cost, reference)
    assert got["method"] == "positional"
    for k in ("prefill", "decode"):
        assert [got[k], got["before"][k], got["after"][k]] == pytest.approx([1 / SLOW] * 3)
        assert got["priced"][k] < 0.95 / SLOW  # the cold probe read as a slower machine
    assert probed_speed({"probe": probes(1.0)}, cost, reference)["prefill"] == pytest.approx(1.0)


def test_a_probe_unlike_the_calibrations_is_not_timed():
    """Timing a call against another call would read the shapes' difference as the machine's: a
    reference probe of other calls (another setting, or the same probe making other calls) is not used."""
    cost = cost_model(load_profile(BUILTIN))
    run = {"probe": probes_at(cost, SLOW)}
    other = dict(probes_at(cost, 1.0), setting={"policy": "eager", "batch_size": 2})
    assert probed_speed(run, cost, [other])["timed"] is None
    cut = probes_at(cost, 1.0)
    cut["logs"] = [dict(log, calls=log["calls"][:-1]) for log in cut["logs"]]
    assert timed_speed([EventLog.from_dict(d) for d in run["probe"]["logs"]],
                       [EventLog.from_dict(d) for d in cut["logs"]]) is None
    same = probed_speed(run, cost, [probes_at(cost, 1.0)])
    assert same["timed"] == pytest.approx({"prefill": 1 / SLOW, "decode": 1 / SLOW})


def test_a_calibrations_engine_run_on_a_slowed_machine_is_brought_back_to_its_speed():
    """A calibration's engine runs are its probes' too: one run timed while the machine ran at 0.8x
    (its probe and its calls alike) has its calls' times brought back by its probe against the
    others', so it fits and scores as the runs at the calibration's speed do; the time as timed
    is kept beside (`measured`)."""
    from calibrate.measure.engine_runs import engine_samples, run_speeds
    cost = cost_model(load_profile(BUILTIN))
    trace = tinyllm(num_seqs=3, min_in=20, max_in=90, min_out=4, max_out=6, seed=8)
    setting = {"policy": "eager", "batch_size": 2}
    runs = [{"name": f"w{i}", "part": "train", "setting": setting, "trace": trace.to_dict(),
             "log": simulate(trace, policies.make(**setting), cost, warmup=warmup_trace(trace),
                             noise=slow(f)).to_dict(), "probe": probes_at(cost, f, n=1)}
            for i, f in enumerate((1.0, SLOW, 1.0))]
    speeds = run_speeds(runs)
    assert speeds["w1"] == MachineSpeed(pytest.approx(1 / SLOW), pytest.approx(1 / SLOW))
    assert speeds["w0"] == speeds["w2"] == MachineSpeed(pytest.approx(1.0), pytest.approx(1.0))
    samples = engine_samples(runs)
    by_run = {n: [s for s in samples if s["source"] == f"engine:{n}"] for n in ("w0", "w1")}
    assert len(by_run["w0"]) == len(by_run["w1"]) > 5
    for a, b in zip(by_run["w0"], by_run["w1"]):
        assert b["seconds"] == pytest.approx(a["seconds"], rel=1e-9)
        assert b["measured"] == pytest.approx(a["seconds"] * SLOW, rel=1e-9) and b["speed"] == pytest.approx(1 / SLOW)
    assert run_speeds(runs[:1]) == {}  # one run has no other to be timed against


def test_fresh_memorys_speed_is_timed_against_the_calibrations_and_said_when_slow(capsys):
    """Each probe also maps and touches 64 MiB of fresh memory (`allocation_seconds`): its time
    against the calibration's probes' is fresh memory's speed, reported beside the machine's and not
    predicted at (stop 32, round 5: joins and growths at 3-5x their prices for half an hour while
    the calls' speeds held, and the probes' calls, which allocate little, read normal). Probes
    timed another way (an MLX array, stop 33) are not compared with today's."""
    from sim.commands.confirm import print_report
    prof = load_profile(BUILTIN)
    cost, trace = cost_model(prof), tinyllm(num_seqs=3, seed=4)
    setting = {"policy": "fifo"}
    with_alloc = lambda probe, s, how="mmap": dict(probe, alloc_s=[s, s], alloc_bytes=64 << 20,  # noqa: E731
                                                   alloc_method=how)
    runs = [dict(measured(trace, setting, cost, 1.0, r), probe=with_alloc(probes_at(cost, 1.0), 0.3)) for r in range(2)]
    calibrated = dict(prof, engine_runs=[{"name": f"w{i}", "probe": with_alloc(probes_at(cost, 1.0), 0.1)}
                                         for i in range(3)])
    (res,) = compare(calibrated, trace, [setting], runs, replicas=0)
    assert res["machine_speed"]["memory"] == pytest.approx(1 / 3)
    assert [p["memory"] for p in res["machine_speed"]["runs"]] == pytest.approx([1 / 3, 1 / 3])
    before = dict(calibrated, engine_runs=[{"name": "w0", "probe": probes_at(cost, 1.0)}])  # probes before stop 33
    (old,) = compare(before, trace, [setting], runs, replicas=0)
    assert old["machine_speed"]["memory"] is None and old["predicted"] == res["predicted"]  # reported, not predicted at
    stop33 = dict(calibrated, engine_runs=[{"name": "w0", "probe": dict(with_alloc(probes_at(cost, 1.0), 0.1),
                                                                        alloc_method=None)}])
    assert compare(stop33, trace, [setting], runs, replicas=0)[0]["machine_speed"]["memory"] is None
    report = {"gate": {"logits": [], "greedy_tokens_identical": True, "timed_runs_identical_tokens": True},
              "protocol": {"repeats": 2}, "results": [res], "wall_s": 1.0}
    print_report(report, "r.json", None)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fresh memory's speed")]
    assert said == ["fresh memory's speed against the calibration (an allocation timed by each probe): r0 0.33 r1 0.33; "
                    "slow: a call that faults fresh pages in (the per-call table's faulted column) runs longer than "
                    "its price"]
    print_report(dict(report, results=[old]), "r.json", None)
    assert "fresh memory" not in capsys.readouterr().out


def test_the_fresh_memory_probe_maps_new_pages_and_gives_them_back():
    """`allocation_seconds` times pages no allocator held before (a new mapping, each page touched)
    and unmaps them: probing twenty times leaves the process no larger than one probe would."""
    import resource
    from pathlib import Path
    from calibrate.measure.speed_probe import ALLOC_BYTES, allocation_seconds
    if not Path("/proc/self/statm").exists():
        pytest.skip("reads the resident size from Linux's /proc")
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()  # noqa: E731
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # noqa: E731
    before, f0 = rss(), faults()
    times = [allocation_seconds() for _ in range(20)]
    assert min(times) > 0
    assert faults() - f0 >= 20 * ALLOC_BYTES // (2 << 20)  # new pages every time: a fault for each (huge) page
    assert rss() - before < ALLOC_BYTES


def test_a_probes_pages_stay_mapped_until_the_run_it_brackets_is_over():
    """The probes' fresh pages are given back only in `Probe.result`, after the run and the probe
    after it: unmapped at once, the run's first calls would fault in the guest's warm pages and
    pay a fraction of a cold fault (stop 42). Two probes hold two mappings; `result` gives both back."""
    import resource
    from pathlib import Path
    from calibrate.engine.model import build_model
    from calibrate.measure.speed_probe import ALLOC_BYTES, Probe
    if not Path("/proc/self/statm").exists():
        pytest.skip("reads the resident size from Linux's /proc")
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()  # noqa: E731
    probe = Probe(build_model("qwen3-tiny"), "pdsim")
    probe.run()  # the engine's first run builds its own buffers: measure from after it
    before = rss()
    probe.run()
    assert rss() - before >= 0.9 * ALLOC_BYTES  # the second probe's pages are still mapped
    held = rss()
    out = probe.result()
    assert held - rss() >= 1.8 * ALLOC_BYTES and len(out["alloc_s"]) == 2 and min(out["alloc_s"]) > 0
    assert probe.held == []

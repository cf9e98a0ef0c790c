"""Calibration on qwen3-tiny: the profile's content, resuming, and bad input."""
import json
import mmap
import statistics
import subprocess
import sys

import numpy as np
import pytest

import policies
from calibrate.calibration import add_rounds, calibrate
from calibrate.engine.kernels import DecodeBatch
from calibrate.engine.model import build_model
from calibrate.measure.engine_runs import EngineRuns, Workload, workloads
from calibrate.measure.grid import QUICK, TINY, Grid
from calibrate.measure.journal import Journal
from calibrate.measure.profiler import ONCE, batch_cache, master_cache, run_grid, sliced, typical_time
from calibrate.measure.speed_probe import SETTING
from calibrate.measure.worker import warmup_trace
from sim.core.errors import UserError
from sim.cost.model import LinearCostModel
from sim.cost.noise import MIN_CALLS, POINTS
from sim.cost.profile import cost_model, load_profile
from sim.replay import simulate


def pdsim(*args):
    p = subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def rounds(sample: dict) -> int:
    """How many timings a point of a TINY calibration has: one per round, or one in all."""
    return 1 if sample["step"] in ONCE else TINY.repeats


def test_calibrate_writes_a_usable_profile(tmp_path):
    out = tmp_path / "tiny.json"
    code, stdout, err = pdsim("calibrate", "--model", "qwen3-tiny", "--grid", "tiny", "-o", str(out))
    assert code == 0, err
    assert "held-out relative error" in stdout
    prof = load_profile(out)
    # every engine run's two probes allocated fresh memory and timed it (`speed_probe.allocation_seconds`)
    alloc = [r["probe"]["alloc_s"] for r in prof["engine_runs"]]
    assert all(len(a) == 2 and min(a) > 0 for a in alloc)
    assert f"median of {2 * len(alloc)} probes" in stdout
    assert prof["model"]["name"] == "qwen3-tiny" and prof["model"]["dtype"] == "float32"
    for key in ("kind", "cpu", "os", "mlx", "mlx_lm", "blas", "id"):
        assert key in prof["device"]
    steps = {s["step"] for s in prof["samples"]}
    assert steps == {"prefill", "decode", "sync", "overhead", "mixed"}  # syncs: batch rebuilds; mixed: vLLM's forwards
    grid = [s for s in prof["samples"] if "source" not in s]
    assert len(grid) == len(TINY.points())
    assert all(len(s["times"]) == rounds(s) for s in grid)
    assert any(s["chunk"] % 4 for s in grid if s["step"] == "prefill")  # unaligned chunks are timed
    # the executor's own calls: joins and leaves at every batch size of the grid, KV buffers written
    engine = [s for s in prof["samples"] if s.get("source", "").startswith("engine:")]
    assert {s["batch"] for s in engine if s.get("joined")} == set(TINY.batches)
    assert all(s["step"] == "sync" for s in engine if s.get("joined") or s.get("left"))  # timed apart from steps
    assert {s["batch"] for s in engine if s.get("left")} >= {1, 2, 3}
    assert any(s["written"] for s in engine if s["step"] == "prefill")
    assert all(s["faults"] >= 0 for s in engine) and any(s["faults"] for s in engine)  # each call's page faults
    # vLLM's forwards as the engine makes them, fitted beside the grid's (the grid's alone priced them 0.88-1.10x)
    assert any(s["step"] == "mixed" and "fitted" in s for s in engine)
    # the dear page price (`speed_probe.dear_page_seconds`) of the probes' readings, kept in the fit
    per_page = sorted(t * mmap.PAGESIZE / r["probe"]["alloc_bytes"] for r in prof["engine_runs"] for t in r["probe"]["alloc_s"])
    assert prof["fit"]["page_fault_s"] == pytest.approx(per_page[-2])
    replay = prof["fit"]["replay"]  # held-out engine runs, each call priced
    assert {r["kind"] for r in replay["by_kind"]} >= {"prefill", "decode", "join"}
    assert sum(r["calls"] for r in replay["by_kind"]) == replay["calls"] > 0
    assert all(r["ratio_p10"] <= r["ratio_median"] <= r["ratio_p90"] for r in replay["by_kind"])
    assert 0 <= replay["between_calls_share"] < 0.5 and "engine replay, held out" in stdout
    assert any(s.get("held_out") for s in prof["samples"] if s["step"] == "prefill")
    # each engine run was probed just before and just after it, as a confirm run: what confirms time theirs against
    assert all(r["probe"]["setting"] == SETTING and len(r["probe"]["logs"]) == 2 for r in prof["engine_runs"])
    assert all({c[0] for c in log["calls"]} >= {"prefill", "decode"} for r in prof["engine_runs"]
               for log in r["probe"]["logs"])
    for step in ("prefill", "decode", "sync"):
        e = prof["fit"]["errors"][step]
        assert 0 <= e["form_mean"] <= e["form_max"]
    for step in ("prefill", "decode"):
        assert all(c >= 0 for c in prof["cost"][step]["coef"])
        assert prof["cost"][step]["use"] in ("fit", "grid")
    noise = prof["fit"]["noise"]  # the timings' own noise, rounds' speeds divided out: for predicting tails
    assert MIN_CALLS <= noise["calls"] <= sum(len(s["times"]) for s in grid) and len(noise["quantiles"]) == POINTS
    assert noise["quantiles"] == sorted(noise["quantiles"]) and noise["quantiles"][0] <= 1.0 <= noise["quantiles"][-1]
    assert "call noise" in stdout
    model = cost_model(prof)
    assert model.prefill(32, 16) > model.prefill(4, 0) > 0
    assert not (tmp_path / "tiny.json.partial.jsonl").exists()
    # refitting the samples gives the same fit, and the samples are kept
    refit = tmp_path / "refit.json"
    code, _, err = pdsim("calibrate", "--refit", str(out), "-o", str(refit))
    assert code == 0, err
    again = load_profile(refit)
    assert again["cost"]["prefill"]["coef"] == prof["cost"]["prefill"]["coef"]
    assert again["fit"]["noise"] == prof["fit"]["noise"]
    assert again["samples"] == json.loads(out.read_text())["samples"] and again["refit_of"] == str(out)
    # of a point's two rounds, one 1.5x the other or more (another process ran): the faster sets its time
    doc = json.loads(out.read_text())
    point = next(s for s in doc["samples"] if "source" not in s and s["step"] == "prefill")
    point.update(times=[3 * point["seconds"], point["seconds"]], seconds=2 * point["seconds"])
    (tmp_path / "spiked.json").write_text(json.dumps(doc))
    code, _, err = pdsim("calibrate", "--refit", str(tmp_path / "spiked.json"), "-o", str(tmp_path / "despiked.json"))
    assert code == 0, err
    refitted_point = next(s for s in load_profile(tmp_path / "despiked.json")["samples"] if s.get("key") == point["key"])
    assert refitted_point["seconds"] == point["times"][1]
    assert typical_time([1.0, 1.4]) == pytest.approx(1.2) and typical_time([3.0, 1.0, 1.1]) == 1.1
    # an existing profile is not overwritten
    code, _, err = pdsim("calibrate", "--model", "qwen3-tiny", "--grid", "tiny", "-o", str(out))
    assert code == 2 and "exists" in err


def test_grids_time_unaligned_shapes_and_long_chunks_after_no_prefix_only_when_asked():
    full = Grid(chunks=[8, 64, 256], offsets=[0, 250], batches=[1], contexts=[10], odd_chunks=[37])
    trimmed = Grid(**{**full.to_dict(), "offset_chunk_max": 64})
    at = lambda g: {(p["prefix"], p["chunk"]) for p in g.points() if p["step"] == "prefill"}
    assert at(full) - at(trimmed) == {(250, 256)} and (0, 256) in at(trimmed) and (0, 37) in at(trimmed)
    quick = at(QUICK)
    assert {c for o, c in quick if o == 0} >= {256} and max(c for o, c in quick if o) < 256
    assert sum(c % 16 != 0 for _, c in quick) >= len(quick) // 3  # most engine chunks are unaligned
    assert {o for o, _ in quick} == set(QUICK.offsets)
    # whole prompts beyond 256 tokens (an eager policy's prefills) at offset 0 only; the engine runs
    # keep their prompts within prompt_max, so the grid's dearest points are not run again there
    assert {c for o, c in quick if c > 256} >= {384} and all(o == 0 for o, c in quick if c > 256)
    assert len({c for o, c in quick if c > 256 and c % 16}) >= 2  # and unaligned ones between them
    assert QUICK.max_context() < max(QUICK.offsets) + max(QUICK.chunks)
    loads = workloads(max(QUICK.batches), QUICK.longest_prompt(), 1000)
    lens = [r.prompt_len for ws in loads.values() for w in ws for r in w.trace.requests]
    assert max(lens) <= QUICK.prompt_max == 256 < max(QUICK.chunks) and min(lens) >= 9
    # one fitted run's first decodes grow a batch of one into arrays larger than its warm-up's: the
    # samples that price a step's own growth in fresh memory (`fresh_step`)
    fifo = next(w for w in loads["train"] if w.setting == {"policy": "fifo"})
    cost = LinearCostModel((1e-3, 0.0, 0.0), (1e-3, 0.0, 0.0), fresh=1e-9)  # prices fresh memory: the heap runs
    log = simulate(fifo.trace, policies.make("fifo"), cost, warmup=warmup_trace(fifo.trace))
    assert len([c for c in log.calls if c.kind == "decode" and c.fresh and not c.joined]) == 3
    # joins into a batch with rows to copy, most in warm memory: the samples that price a join's rows
    # (at a CPU's speeds, qwen3-0.6b's: 5 ms a prompt token, 0.4 s a decode step)
    cpu = LinearCostModel((0.02, 5e-3, 0.0), (0.4, 0.01, 1e-5), copy=2e-5, fresh=1e-9)
    chunked = next(w for w in loads["train"] if w.setting.get("policy") == "chunked")
    log = simulate(chunked.trace, policies.make(**chunked.setting), cpu, warmup=warmup_trace(chunked.trace))
    assert len([c for c in log.calls if c.kind == "sync" and c.joined and c.written and not c.fresh]) >= 6
    # and one decodes a request at a time (meTile's loop), each request's own cache growing past
    # 256 tokens while the others' are held: the samples that price such a growth (`grow_single`)
    alone = next(w for w in loads["train"] if w.setting.get("decode") == "single")
    log = simulate(alone.trace, policies.make(**alone.setting), cost, warmup=warmup_trace(alone.trace))
    grown = [c for c in log.calls if c.kind == "decode" and c.written and not c.batched]
    assert len(grown) == 3 and len({c.rids for c in grown}) == 3 and all(c.written == 512 for c in grown)
    assert any(c.rids == grown[0].rids and c.start > grown[1].end for c in log.calls)  # the first's cache held then


def test_interrupted_calibration_resumes(tmp_path):
    lm = build_model("qwen3-tiny")
    partial = tmp_path / "p.partial.jsonl"
    header = {"model": "qwen3-tiny", "grid": TINY.to_dict()}
    first = TINY.points()[0]
    kept = dict(first, seconds=9.0, batch=1, round=1)
    partial.write_text(json.dumps(header) + "\n" + json.dumps(kept) + "\n" + '{"key": "cut sh')
    samples = run_grid(lm, TINY, partial, header, progress=False)
    journal = [json.loads(line) for line in partial.read_text().splitlines()[1:]]
    timed = [s for s in journal if s.get("key") == first["key"] and s.get("round") == 1]
    assert timed[0]["seconds"] == 9.0 and not any("retry" not in s for s in timed[1:])  # kept, not re-measured...
    if len(timed) == 1:  # ...unless a busy machine made round 1 look disturbed, and it was timed again
        assert samples[0]["times"][1] == 9.0
    assert len(samples) == len(TINY.points())
    assert all(len(s["times"]) == rounds(s) for s in samples)
    assert all(s["seconds"] < 1.0 for s in samples[1:])
    # partial results of another calibration are refused, not deleted
    with pytest.raises(UserError, match="different calibration"):
        run_grid(lm, TINY, partial, dict(header, seed=5), progress=False)
    assert partial.exists()


def test_calibration_times_points_in_rounds(tmp_path):
    """Every round times every point once, in its own order, before the next round starts (a round
    found disturbed is timed again after them all: those lines say `retry`)."""
    lm = build_model("qwen3-tiny")
    partial = tmp_path / "p.partial.jsonl"
    run_grid(lm, TINY, partial, {"model": "qwen3-tiny"}, progress=False)
    timed = [json.loads(x) for x in partial.read_text().splitlines()[1:]]
    lines = [s for s in timed if "retry" not in s]
    assert timed[:len(lines)] == lines  # retries come last
    rounds = [s["round"] for s in lines]
    assert rounds == sorted(rounds) and set(rounds) == set(range(TINY.repeats))
    keys = {p["key"] for p in TINY.points()}
    once = {p["key"] for p in TINY.points() if p["step"] in ONCE}
    orders = [[s["key"] for s in lines if s["round"] == r] for r in range(TINY.repeats)]
    assert sorted(orders[0]) == sorted(keys)
    assert all(sorted(o) == sorted(keys - once) and len(o) == len(keys - once) for o in orders[1:])
    assert orders[1] != orders[2]  # reshuffled each round


def test_profiler_batch_cache_steps_as_the_executors_merged_one():
    """The profiler builds a decode batch's cache in one copy, with room to grow; one step on it
    must reach the state the executor reaches by merging per-request caches and stepping: same
    buffer, padding, positions and contents, and the same tokens."""
    lm = build_model("qwen3-tiny")
    master = master_cache(lm, 80)
    ctx, ids = [8, 64, 33], ["a", "b", "c"]
    real = DecodeBatch(lm)
    real.sync(ids, {rid: sliced(master, c) for rid, c in zip(ids, ctx)})
    built = DecodeBatch(lm, ids, batch_cache(master, ctx))
    assert built.cache[0].keys.shape[2] > real.cache[0].keys.shape[2]  # room: no regrowth on the timed step
    assert real.step([1, 2, 3]) == built.step([1, 2, 3])
    for a, b in zip(real.cache, built.cache):
        assert a.keys.shape == b.keys.shape and a._idx == b._idx
        assert a.offset.tolist() == b.offset.tolist() and a.left_padding.tolist() == b.left_padding.tolist()
        np.testing.assert_array_equal(np.array(a.keys[..., :a._idx, :]), np.array(b.keys[..., :b._idx, :]))
        np.testing.assert_array_equal(np.array(a.values[..., :a._idx, :]), np.array(b.values[..., :b._idx, :]))
    assert real.step([4, 5, 6]) == built.step([4, 5, 6])


def test_a_whole_prompt_longer_than_every_chunk_is_timed_at_its_length(monkeypatch):
    """A grid's odd prompts may be longer than its chunks (the quick grid's 414 against 384): each
    prefill point runs exactly its own number of tokens, from offset 0, through the real kernels."""
    import calibrate.measure.profiler as profiler
    fed = []
    real = profiler.prefill_chunk
    monkeypatch.setattr(profiler, "prefill_chunk", lambda lm, cache, ids: fed.append(len(ids)) or real(lm, cache, ids))
    grid = Grid(chunks=[4, 8], offsets=[0], batches=[1], contexts=[8], odd_prompts=[13])
    prof = profiler.Profiler(build_model("qwen3-tiny"), grid)
    for p in grid.points():
        if p["step"] == "prefill":
            fed.clear()
            prof.measure(p)
            assert fed[-1] == p["chunk"], p  # (the first builds the master cache before)


def test_more_rounds_join_the_earlier_ones(tmp_path):
    """--add-rounds times more rounds of some steps and fits every round; the source stays as it was."""
    src, out = tmp_path / "tiny.json", tmp_path / "more.json"
    calibrate("qwen3-tiny", TINY, src, progress=False)
    before = src.read_text()
    prof = add_rounds(src, out, rounds=2, steps=["decode"], progress=False)
    assert src.read_text() == before and load_profile(out)["samples"] == prof["samples"]
    old = {s["key"]: s for s in json.loads(before)["samples"] if "key" in s}
    shape = lambda s: {k: v for k, v in s.items() if k not in ("fitted", "held_out")}
    engine = [shape(s) for s in json.loads(before)["samples"] if "key" not in s]
    assert engine and [shape(s) for s in prof["samples"] if "key" not in s] == engine  # engine calls kept
    for s in (s for s in prof["samples"] if "key" in s):
        o = old[s["key"]]
        if s["step"] == "decode":
            assert len(s["times"]) == TINY.repeats + 2 and s["times"][:TINY.repeats] == o["times"]
            assert s["seconds"] == statistics.median(s["times"])
        else:
            assert s["times"] == o["times"] and s["seconds"] == o["seconds"]
    assert prof["rounds_added"][0]["steps"] == ["decode"]
    assert not (tmp_path / "more.json.partial.jsonl").exists()
    # a profile from another device is refused
    doc = json.loads(before)
    doc["device"]["id"] = "some-other-machine"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    code, _, err = pdsim("calibrate", "--add-rounds", str(other), "-o", str(tmp_path / "x.json"))
    assert code == 2 and "some-other-machine" in err and "Traceback" not in err


def test_calibrate_bad_input(tmp_path):
    code, _, err = pdsim("calibrate", "--model", "qwen3-99b", "-o", str(tmp_path / "x.json"))
    assert code == 2 and "qwen3-99b" in err and "Traceback" not in err
    code, _, err = pdsim("calibrate", "--model", "qwen3-tiny", "--weights", str(tmp_path / "nope"),
                         "-o", str(tmp_path / "x.json"))
    assert code == 2 and "nope" in err and "Traceback" not in err
    code, _, err = pdsim("calibrate", "--model", "qwen3-tiny", "--grid", "tiny", "--offsets", "5000",
                         "-o", str(tmp_path / "x.json"))
    assert code == 2 and "context" in err and "Traceback" not in err


def test_an_interrupted_calibrations_engine_runs_resume_with_their_probes(tmp_path):
    """An engine run (and its speed probes) finished before an interrupt is read back from the
    partial file, not served again; a row from before probes were kept resumes without one."""
    lm = build_model("qwen3-tiny")
    w = workloads(2, 16, lm.vocab_size)["held_out"][0]
    old = Workload("older", w.trace, w.setting)
    path, header = tmp_path / "p.partial.jsonl", {"model": "qwen3-tiny"}
    with Journal(path, header) as journal:
        EngineRuns(lm, {"held_out": [w]}, journal, progress=False).run([w])
    (row,) = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert row["workload"] == w.name and len(row["probe"]["logs"]) == 2
    with path.open("a") as f:  # a row as a partial file from before stop 25 has it
        f.write(json.dumps({"workload": old.name, "log": row["log"]}) + "\n")
    with Journal(path, header) as journal:
        runs = EngineRuns(lm, {"held_out": [w, old]}, journal, progress=False)
        mine, older = runs.records()  # nothing left to run: a new run would be timed again
    assert mine["log"] == row["log"] and mine["probe"] == row["probe"]
    assert older["log"] == row["log"] and "probe" not in older
    assert len(path.read_text().splitlines()) == 3

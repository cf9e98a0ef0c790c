"""Short runs of the real executor: calls timed exactly as the engine makes them.

A grid times one step at a time on prepared caches. What it cannot prepare is the engine's own
history: a request joining a batch whose buffer kept 256 tokens of spare room, a leave that
gathers every row, a buffer that grows mid-run, a chunk remainder of 37 tokens. So a calibration
also serves a few small mixed workloads through `RealEngine`: the `train` ones add their calls to
the fit (joins and leaves at every batch size in range), and a `held_out` one, never fitted,
says per call kind how well the fitted model prices the calls a real run makes.
"""
from __future__ import annotations

import random
import shutil
import time
from bisect import bisect_right
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

import policies
from calibrate.engine.model import LoadedModel
from calibrate.fit.common import HELD_OUT
from calibrate.measure.journal import Journal
from calibrate.measure.speed_probe import PREFILLS, timed_speed
from calibrate.measure.worker import RunFailed, run_fresh, warmup_of
from sim.core.errors import UserError
from sim.cost.model import LinearCostModel
from sim.cost.speed import MachineSpeed
from sim.engine.batchcache import STEP
from sim.engine.heap import GROUPS, Heap
from sim.engine.log import Call, EventLog
from sim.engine.relog import relog, served
from sim.metrics.residuals import call_kind, size_bucket
from sim.replay import warmed
from traces.generators import fixed, poisson
from traces.trace import Trace


@dataclass(frozen=True)
class Workload:
    """One engine run: a trace, the setting it is served under, and the engine (`calibrate.measure.worker`)."""
    name: str
    trace: Trace
    setting: dict
    engine: str = "pdsim"
    pipelined: bool = False  # mlx-lm's BatchGenerator as the server runs it (`calibrate.engine.batchgen`)


def workloads(max_batch: int, max_prompt: int, vocab: int, outputs: int = 12) -> dict[str, list[Workload]]:
    """`train`: all at t=0, eager at the largest batch (every request joins a batch one larger,
    then they leave one at a time: request i owes n + 1 + i tokens); chunked with an unaligned
    budget over spread arrivals, twice the batch's requests (a dozen joins into a batch, most in
    warm memory: what prices a join's rows; with as many requests as the batch, two such joins per
    calibration priced a row at 1.1-1.6x what the held-out run's joins paid, in five calibrations);
    fifo over three prompts of growing length, whose first decodes grow a batch of one into arrays
    larger than any before (a step's own growth in fresh memory, `fresh_step`: the batched runs'
    warm-ups leave no step that can); and three prompts ending at or just short of a 256-token
    buffer step decoded one call per request (meTile's loop), each request's own cache growing
    once, the second while the first's grown cache is held (`grow_single`: meTile's paid 100-980
    us a row, where the batch cache's growths cost 50-300); and vLLM's scheduler at a 128-token
    budget, whose mixed forwards are fitted beside the grid's (`Grid.fused`: the grid's forwards
    alone priced the engine's at 0.88-1.10x in four calibrations, each a steady bias; with one
    such run fitted, calibration D's confirms read 0.94-1.07 where they read 1.03-1.12).
    `held_out`: another seed, another budget, half the batch (one run: a calibration must fit in
    about 10 minutes, and the eager one timed the same calls again); and vLLM's scheduler on
    another seed and budget, whose forwards are only priced."""
    def staggered(n, seed):
        rng = random.Random(seed)
        return fixed([0.0] * n, [rng.randint(9, max_prompt) for _ in range(n)], [n + 1 + i for i in range(n)],
                     seed, vocab)

    def spread(n, seed, rate):
        return poisson(num_requests=n, rate=rate, min_in=9, max_in=max_prompt, min_out=2, max_out=outputs, seed=seed)
    half = max(2, max_batch // 2)
    top = max_prompt // STEP * STEP or max_prompt  # below one step (tiny grids): no growth, same calls
    return {
        "train": [Workload("eager-staggered", staggered(max_batch, 11), {"policy": "eager", "batch_size": max_batch}),
                  Workload("chunked-spread", spread(2 * max_batch, 12, 2.0),
                           {"policy": "chunked", "budget": 48, "batch_size": max_batch}),
                  Workload("fifo-growth", fixed([0.0] * 3, [max(9, max_prompt * k // 3) for k in (1, 2, 3)], [3] * 3,
                                                13, vocab), {"policy": "fifo"}),
                  Workload("single-growth", fixed([0.0] * 3, [top - j for j in range(3)], [5, 5, 4],
                                                  14, vocab), {"policy": "eager", "batch_size": 3, "decode": "single"}),
                  Workload("vllm-spread", spread(half + 2, 23, 1.5),
                           {"policy": "vllm", "max_num_batched_tokens": 128, "max_num_seqs": half})],
        "held_out": [Workload("chunked-held-out", spread(half + 2, 21, 1.5),
                              {"policy": "chunked", "budget": 40, "batch_size": half}),
                     Workload("vllm-held-out", spread(half + 2, 22, 1.5),  # vLLM's forwards, never fitted
                              {"policy": "vllm", "max_num_batched_tokens": 56, "max_num_seqs": half})],
    }


def run_workloads(model: dict, loads: list[Workload], folder: Path, progress: bool = True) -> Iterator[tuple[dict, dict]]:
    """Serve each workload once, each in a fresh process after an untimed warm-up, as confirm runs
    are (a process that timed the grid has touched gigabytes: its joins would never meet fresh
    memory); yield each timed run's log (a dict) as it finishes, with the speed probes served just
    before and just after it (`calibrate.measure.speed_probe`: what a confirm's probes are timed against).
    `model`: the worker's model spec."""
    folder.mkdir(parents=True, exist_ok=True)
    for w in loads:
        t0 = time.perf_counter()
        trace = folder / f"{w.name}.trace.jsonl"
        w.trace.save_jsonl(trace, overwrite=True)  # an interrupted run left one: the folder is ours (locked)
        try:
            out = run_fresh({"model": model, "trace_path": str(trace), "setting": w.setting, "warmup": 1,
                             "engine": w.engine, "probe": w.engine, "pipelined": w.pipelined},
                            folder / f"{w.name}.json")
        except RunFailed as e:
            raise UserError(f"engine run {w.name} failed: {e}") from None
        if progress:  # a line, not a bar: these run between the grid's rounds, under its bar
            tqdm.write(f"engine run {w.name}: {len(out['log']['calls'])} calls, {time.perf_counter() - t0:.0f} s")
        yield out["log"], out["probe"]


def samples_from_log(log: EventLog, source: str) -> list[dict]:
    """Every call of a measured run as a calibration sample (the fit's shape fields and seconds)."""
    faults = log.faults if log.faults is not None else [None] * log.call_count
    return [call_sample(c, source, n) for c, n in zip(log.calls, faults)
            if c.kind != "preempt"]  # a preemption runs no kernel


def call_sample(c: Call, source: str, faults: int | None = None) -> dict:
    """One call: the shape fields the fit reads (`calibrate.fit.pdsim`), its kind, its seconds and the
    minor page faults it took (where the run counted them)."""
    s = {"source": source, "call": call_kind(c), "bucket": size_bucket(c.kind, c.tokens, len(c.rids)),
         "seconds": c.end - c.start, "written": c.written, "fresh": c.fresh,
         **({"faults": faults} if faults is not None else {})}
    if c.kind == "prompt":  # mlx-lm's calls (`calibrate.fit.mlxlm`)
        return dict(s, step="prompt", rows=len(c.rids), chunk=c.tokens, idx=c.prefix, contexts=list(c.contexts))
    if c.kind in ("first", "generate"):
        return dict(s, step="generate", batch=c.tokens, contexts=list(c.contexts), context_max=max(c.contexts),
                    first=c.kind == "first", joined=c.joined, left=c.left)
    if c.kind == "prefill":
        return dict(s, step="prefill", chunk=c.tokens, prefix=c.prefix, batch=1)
    if c.kind == "mixed":  # vLLM's forwards (`calibrate.fit.mixed`)
        return dict(s, step="mixed", chunks=list(c.chunks), prefixes=list(c.contexts), batch=len(c.rids))
    return dict(s, step="sync" if c.kind == "sync" else "decode", batch=c.tokens, contexts=list(c.contexts),
                context_max=max(c.contexts), single=not c.batched, joined=c.joined, left=c.left)


def between_calls_share(logs: list[EventLog]) -> float:
    """The share of a run's busy time spent between calls (host work the cost model prices as
    `iteration`), idle waits for arrivals excluded."""
    between = inside = 0.0
    for log in logs:
        calls, arrivals = log.calls, sorted(r.arrival for r in log.requests.values())
        inside += sum(c.end - c.start for c in calls)
        for a, b in zip(calls, calls[1:]):  # a gap with an arrival in it was a wait for that arrival
            if bisect_right(arrivals, b.start) == bisect_right(arrivals, a.end):
                between += b.start - a.end
    return between / (between + inside) if inside else 0.0


def relogged(trace: Trace, log: dict, setting: dict, policy_cost=None, kv_bytes: int | None = None,
             warmup_with: str | None = "short", groups: int = GROUPS, state_tokens: int = 0) -> EventLog:
    """A worker run's log (`calibrate.measure.worker`: a warm-up, then `trace` under `setting`) with what
    the state machine derives from its calls (KV buffers written, fresh memory beyond what the
    warm-up left) recomputed by today's rules, at the measured times. `policy_cost`:
    the cost model the run's policy priced its chunks with (an `auto:MS` budget), so the warm-up
    replayed here makes the run's decisions; `kv_bytes`: the model's bytes per KV token, for a
    setting's KV limit in GB (`sim.engine.memory`); `warmup_with`: what the warm-up served
    (`calibrate.measure.worker.warmup_of`; None: no warm-up). A warm-up's own calls are not logged: the
    short one is replayed (its requests arrive at t=0, so any times give its path), the trace is
    taken to have gone the run's own path (`sim.engine.relog.served`). `groups`: the heap model's
    (`sim.engine.heap`; the profile's `cost.heap_groups`); `state_tokens`: a hybrid model's state per
    request, which its syncs copy (`sim.engine.kvcache.KVBuffers`)."""
    run = EventLog.from_dict(log)
    if warmup_with == "trace":
        return relog(trace, run, served(trace, run, Heap(groups=groups)), state_tokens=state_tokens)
    cost = LinearCostModel((1e-3, 0.0, 0.0), (1e-3, 0.0, 0.0), kv_bytes=kv_bytes)
    heap = Heap(groups=groups) if warmup_with is None else \
        warmed(warmup_of(trace, warmup_with), policies.make(**setting, cost=policy_cost or cost), cost, Heap(groups=groups))
    return relog(trace, run, heap, state_tokens=state_tokens)


class EngineRuns:
    """The calibration's engine workloads (`calibrate.measure.engine_runs`), each run once, between the grid's
    rounds: the machine's speed drifts over minutes, and runs timed after the whole grid would
    see another machine than the grid did. A finished run's log is kept in the partial file, so
    an interrupted calibration does not run it again."""

    def __init__(self, lm: LoadedModel, loads: dict[str, list[Workload]], journal: Journal, progress: bool = True):
        self.loads, self.journal, self.partial, self.progress = loads, journal, journal.path, progress
        self.model = {"name": lm.name, "dtype": lm.dtype, "quant_bits": lm.quant_bits, "weights": lm.source}
        self.done: dict[str, dict] = {}
        self.probes: dict[str, dict] = {}

    def schedule(self, rounds: int) -> list[list[Workload]]:
        """Which workloads run after each round: train and held-out ones alternating, spread evenly."""
        parts = list(self.loads.values())
        order = [w for group in zip_longest(*parts) for w in group if w is not None]
        return [order[len(order) * r // rounds:len(order) * (r + 1) // rounds] for r in range(rounds)]

    def run(self, loads: list[Workload]) -> None:
        self._read()
        todo = [w for w in loads if w.name not in self.done]
        folder = self.partial.with_name(self.partial.name + ".runs")
        for w, (log, probe) in zip(todo, run_workloads(self.model, todo, folder, self.progress)):  # saved as each ends
            self.done[w.name], self.probes[w.name] = log, probe
            self.journal.append({"workload": w.name, "log": log, "probe": probe})

    def records(self) -> list[dict]:
        """Every workload's run (running any not run yet): its part (train, held_out), setting,
        trace, log and speed probe, as the profile keeps them (`engine_samples` derives the
        samples again; a confirm times its probes against these, `calibrate.measure.speed_probe`)."""
        self.run([w for ws in self.loads.values() for w in ws])
        shutil.rmtree(self.partial.with_name(self.partial.name + ".runs"), ignore_errors=True)
        return [{"name": w.name, "part": part, "setting": w.setting, "trace": w.trace.to_dict(),
                 "log": self.done[w.name], **({"probe": self.probes[w.name]} if w.name in self.probes else {})}
                for part, ws in self.loads.items() for w in ws]

    def _read(self) -> None:
        for row in self.journal.records:
            if "workload" not in row:
                continue  # the grid's timings
            try:
                EventLog.from_dict(row["log"])  # a whole log, or skip it
                self.done.setdefault(row["workload"], row["log"])
                if row.get("probe"):  # partial files that predate speed probes kept none
                    self.probes.setdefault(row["workload"], row["probe"])
            except (KeyError, TypeError, ValueError):
                continue


def engine_samples(runs: list[dict], groups: int = GROUPS, state_tokens: int = 0) -> list[dict]:
    """The calls of the calibration's engine runs as samples (held-out runs marked), their KV
    buffers derived from the calls by today's state machine (`sim.engine.relog`), so a refit of an
    older profile prices them by today's rules; each call's time at the calibration's speed
    (`run_speeds`: `speed` the factor applied, `measured` the time as timed). `groups`: the
    profile's heap groups, `state_tokens` its model's state per request (`relogged`)."""
    out, speeds = [], run_speeds(runs)
    for r in runs:
        if r["log"].get("pipelined"):  # its calls' spans are host time, not their own (`sim.engine.pipeline`)
            continue
        log = relogged(Trace.from_dicts(r["trace"]["requests"], r["trace"]["meta"]), r["log"], r["setting"],
                       groups=groups, state_tokens=state_tokens)
        out += brought_back(samples_from_log(log, (HELD_OUT if r["part"] == "held_out" else "engine:") + r["name"]),
                            speeds.get(r["name"]))
    return out


def brought_back(samples: list[dict], speed: MachineSpeed | None) -> list[dict]:
    """Samples of a run timed at `speed` (None: the calibration's), their times at the
    calibration's speed: prefill chunks by the prefill speed, every other call by the decode speed."""
    out = []
    for s in samples:
        f = 1.0 if speed is None else speed.prefill if s["step"] in PREFILLS else speed.decode
        out.append(dict(s, seconds=s["seconds"] * f, measured=s["seconds"], speed=f) if f != 1.0 else s)
    return out


def run_speeds(runs: list[dict]) -> dict[str, MachineSpeed]:
    """Each engine run's machine speed against the calibration's: the probes served just before
    and after it timed against the median over every run's probes (`timed_speed`, no price in
    it; profiles from before the probe after have the one before only). A shared
    VM slows down for minutes at a time (one held-out run here at 0.77x on prefills, 0.84x on
    decodes, the others at 0.99-1.06x): unadjusted, its replay table reads the slowdown as the
    model's error, and a slowed training run moves the join and leave prices fitted from its
    calls. A probe lasts about 6 s: one before the run alone over-corrected by 7-10% there, and
    in another calibration read 0.72x for a run that ran at 1.0x."""
    probes = {r["name"]: [EventLog.from_dict(d) for d in r["probe"]["logs"]]
              for r in runs if (r.get("probe") or {}).get("logs")}
    reference = [log for logs in probes.values() for log in logs]
    speeds = {name: timed_speed(logs, reference) for name, logs in probes.items()} if len(probes) > 1 else {}
    return {name: s for name, s in speeds.items() if s is not None}

"""Time the engine's own step functions over a grid, in shuffled rounds; resumable, with progress.

Every timed call is a step function the real executor runs (`prefill_chunk`, `DecodeBatch.step`,
`decode_one`), on caches shaped as the executor's would be; joins, leaves and buffer growth are
timed in short runs of the executor itself (`calibrate.measure.engine_runs`). Cache states are sliced
from one long prefilled "master" cache, so a point at offset 2,048 does not pay a 2,048-token
prefill of its own. Finished timings are appended to a partial file, so an interrupted run resumes.
"""
from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Callable

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache
from tqdm import tqdm

import policies
from calibrate.engine.executor import RealEngine
from calibrate.engine.kernels import Cache, DecodeBatch, decode_one, first_kv, is_kv, new_cache, offset, prefill_chunk
from calibrate.engine.mixed import mixed_forward
from calibrate.engine.model import LoadedModel
from calibrate.measure.grid import Grid
from calibrate.measure.journal import Journal
from sim.cost.noise import DISTURBED
from sim.engine.batchcache import write
from traces.generators import tinyllm


def master_cache(lm: LoadedModel, length: int, chunk: int = 256) -> Cache:
    """One request's cache holding `length` tokens; the source of every sliced state.

    Its first chunk is a real prefill, which warms every kernel once. The rest is random keys and
    values at each layer's own scale: attention costs the same whatever the values, and prefilling
    2,500 real tokens would take minutes on a CPU before the first point is timed.
    """
    cache = new_cache(lm)
    rng = random.Random(0)
    prefill_chunk(lm, cache, [rng.randrange(lm.vocab_size) for _ in range(min(length, chunk))])
    rest = length - offset(cache)
    if rest > 0:
        for c in cache:
            if not is_kv(c):  # a linear layer's state: one size at any length (its values do not time)
                continue
            k, v = c.keys[..., :c.offset, :], c.values[..., :c.offset, :]
            shape = (*k.shape[:2], rest, k.shape[3])
            c.update_and_fetch(mx.random.normal(shape, k.dtype) * mx.std(k) + mx.mean(k),
                               mx.random.normal(shape, v.dtype) * mx.std(v) + mx.mean(v))
        mx.eval([c.state for c in cache])
    return cache


def kv_capacity(cache: Cache) -> int:
    """Token-rows the cache's KV buffers hold room for (its first attention layer's)."""
    c = first_kv(cache)
    return c.keys.shape[2] if c.keys is not None else 0


def _state_copy(m: ArraysCache, rows: int = 1) -> ArraysCache:
    """A linear layer's state for `rows` requests, copied from the master's (its values do not time)."""
    c = ArraysCache(len(m.cache))
    c.cache = [mx.array(x) if rows == 1 else mx.concatenate([x] * rows) for x in m.cache]
    return c


def sliced(master: Cache, n: int) -> Cache:
    """A cache holding the first `n` tokens, with room to grow as the executor's usually has.

    mlx-lm grows a cache by 256-token steps; a state whose buffer is exactly full would make
    every timed call pay a copy of the whole cache, which the engine pays once per 256 tokens.
    """
    step = KVCache.step
    alloc = (n // step + 1) * step
    out = []
    for m in master:  # copies, not views of the master: a step on a view of a longer buffer costs
        if not is_kv(m):
            out.append(_state_copy(m))
            continue
        c = KVCache()  # more per cached token (a single decode at 777 tokens: 299 ms, 246 on a copy)
        # `mx.array`, not `mx.contiguous`: where `alloc` is the master's whole capacity the slice is
        # contiguous already, `mx.contiguous` returns the master's own buffer, and the first write
        # then copies the whole cache (it cannot update a shared buffer in place): a copy the engine
        # never makes, seen in the measured peaks (qwen3-tiny: 197 KB for a 16-token chunk, 84 KB on a copy)
        c.state = (mx.array(m.keys[..., :alloc, :]), mx.array(m.values[..., :alloc, :]), n)
        out.append(c)
    mx.eval([c.state for c in out])
    return out


def batch_cache(master: Cache, contexts: list[int]) -> Cache:
    """The batch cache a `DecodeBatch` of requests with these contexts holds after its first step:
    rows left-padded to the longest, with room for 256 more tokens. Built in one copy from the
    master. The executor's way there (a per-request cache each, a merge, and the first step
    regrowing the buffer) copies every row three times: 22 GB for 16 rows of 2,048 tokens of
    Qwen3-1.7B, most of a calibration's time, and the first step after a merge pays for the
    regrowth (the engine runs of `calibrate.measure.engine_runs` time that)."""
    longest, step = max(contexts), BatchKVCache.step
    pads = [longest - c for c in contexts]
    out = []
    for m in master:
        if not is_kv(m):
            out.append(_state_copy(m, len(contexts)))
            continue
        k, v = m.keys, m.values
        keys = mx.zeros((len(contexts), k.shape[1], longest + step, k.shape[3]), k.dtype)
        values = mx.zeros((len(contexts), v.shape[1], longest + step, v.shape[3]), v.dtype)
        for i, (p, c) in enumerate(zip(pads, contexts)):
            keys[i:i + 1, :, p:p + c] = k[..., :c, :]
            values[i:i + 1, :, p:p + c] = v[..., :c, :]
        b = BatchKVCache(pads)
        b.state = (keys, values, mx.array(contexts), mx.array(pads), longest)
        out.append(b)
    mx.eval([c.state for c in out])
    return out


def _timed(fn) -> float:
    """Seconds `fn` takes, in the state the engine runs in: MLX's buffer cache holding what the
    call before it left (another shape: a round is shuffled and its warm-up is a round of its
    own), never emptied (on Metal emptying it hands the buffers back, and every call would pay
    for new ones that the engine's calls find cached).

    Consecutive calls differ in shape in the engine too; timing one shape back to back would
    reuse its exact buffers and read ~10% fast (measured on Qwen3-0.6B, CPU: a 32-token chunk
    0.68 s repeated, 0.74-0.78 s after another shape).
    """
    return _measured(fn)[0]


def _measured(fn) -> tuple[float, int]:
    """(seconds, peak bytes) of `fn`: its time as `_timed` takes it, and how far MLX's memory in
    use rose above what was in use before it (`mx.get_peak_memory` after `mx.reset_peak_memory`):
    the KV arrays it allocated and its temporaries, what `sim.engine.memory` fits. Read around the timed
    call itself, so the memory model costs the calibration no extra calls."""
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    return seconds, max(0, mx.get_peak_memory() - before)


class Profiler:
    """Times one grid point per call; `run_grid` warms every point up in a round of its own."""

    def __init__(self, lm: LoadedModel, grid: Grid):
        self.lm, self.grid = lm, grid
        self.master: Cache | None = None
        rng = random.Random(1)
        longest = max([q.get("chunk", q.get("prompt", 1)) for q in grid.points() if q["step"] in ("prefill", "mixed")]
                      + [1])  # odd prompts too
        self.ids = [rng.randrange(lm.vocab_size) for _ in range(longest)]

    def measure(self, point: dict) -> dict:
        """One timing of `point`: the point with `seconds` and the shape it ran at."""
        if self.master is None and point["step"] != "overhead":
            self.master = master_cache(self.lm, self.grid.max_context())
        seconds, extra = getattr(self, f"_{point['step']}")(point)
        return dict(point, seconds=seconds, **extra)

    def _prefill(self, p: dict):
        """A chunk at offset 0 starts a fresh cache, as a prompt's first chunk does in the engine."""
        chunk = self.ids[:p["chunk"]]
        cache = sliced(self.master, p["prefix"]) if p["prefix"] else new_cache(self.lm)
        cap = kv_capacity(cache)
        dt, peak = _measured(lambda: prefill_chunk(self.lm, cache, chunk))
        return dt, {"batch": 1, "written": write(cap, p["prefix"], p["chunk"])[1], "peak_extra": peak}

    def _decode(self, p: dict):
        """A steady decode step, on a batch cache with room to grow (`batch_cache`)."""
        ctx = p["contexts"]
        if p.get("batched", True):
            batch = DecodeBatch(self.lm, [str(i) for i in range(len(ctx))], batch_cache(self.master, ctx))
            step = lambda: batch.step([1] * len(ctx))
        else:
            cache = sliced(self.master, ctx[0])
            step = lambda: decode_one(self.lm, cache, 1)
        dt, peak = _measured(step)  # it writes token ctx + 1: its context, as the simulator counts it
        return dt, {"batch": len(ctx), "context_sum": sum(c + 1 for c in ctx), "context_max": max(ctx) + 1,
                    "single": not p.get("batched", True), "written": 0,  # both caches have room to grow
                    "peak_extra": peak}

    def _mixed(self, p: dict):
        """vLLM's one forward: `decodes` requests one token past `context`, and a prompt chunk of
        `prompt` tokens after `prompt_prefix` cached ones (on a fresh cache at offset 0)."""
        caches = [sliced(self.master, p["context"]) for _ in range(p["decodes"])]
        rows = [[1]] * p["decodes"]
        prefixes = [p["context"]] * p["decodes"]
        if p["prompt"]:
            caches.append(sliced(self.master, p["prompt_prefix"]) if p["prompt_prefix"] else new_cache(self.lm))
            rows.append(self.ids[:p["prompt"]])
            prefixes.append(p["prompt_prefix"])
        caps = [kv_capacity(c) for c in caches]
        dt, peak = _measured(lambda: mixed_forward(self.lm, caches, rows))
        written = sum(write(cap, pre, len(r))[1] for cap, pre, r in zip(caps, prefixes, rows))
        return dt, {"batch": len(rows), "chunks": [len(r) for r in rows], "prefixes": prefixes, "written": written,
                    "peak_extra": peak}

    def _overhead(self, p: dict):
        """Host work per iteration: time between engine calls on a short real run, over iterations."""
        engine = RealEngine(self.lm)
        # small on purpose: the gaps between calls do not depend on the calls' sizes
        trace = tinyllm(num_seqs=3, min_in=8, max_in=24, min_out=4, max_out=4, seed=3, vocab=self.lm.vocab_size)
        log = engine.run(trace, policies.make("chunked", 16, 2)).log
        between = sum(b.start - a.end for a, b in zip(log.calls, log.calls[1:]))
        return between / max(c.iteration for c in log.calls), {}


ONCE = {"overhead"}  # steps timed in a run's first round only: the host overhead is steady and tiny, its run is not (5 s)


def run_grid(lm: LoadedModel, grid: Grid, partial: Path | Journal, header: dict | None = None, seed: int = 0,
             progress: bool = True, rounds: range | None = None, keys: set[str] | None = None,
             after_round: Callable[[int], None] | None = None, profiler=None) -> list[dict]:
    """Time every grid point (or those in `keys`) once per round, each round in its own shuffled order.

    Rounds, not back-to-back repeats: this VM drifts by ~10% over minutes, and repeats timed
    together would carry the drift of their moment into one point's median; across rounds it
    spreads over every point. `after_round(r)` runs when round r is done (the calibration's engine
    runs, so they share the rounds' minutes). Each (point, round) is appended to `partial` (a
    path with its `header`, or an open `calibrate.measure.journal.Journal`) as it finishes, so an
    interrupted run resumes where it stopped. `profiler` times the points (default `Profiler`;
    mlx-lm's grid: `calibrate.measure.mlxlm_profiler.MlxLmProfiler`).
    """
    if not isinstance(partial, Journal):
        with Journal(partial, header or {}) as journal:
            return run_grid(lm, grid, journal, header, seed, progress, rounds, keys, after_round, profiler)
    rounds = rounds if rounds is not None else range(grid.repeats)
    points = [p for p in grid.points() if keys is None or p["key"] in keys]
    done = {(s["key"], s["round"]): s for s in partial.records if isinstance(s.get("key"), str) and "round" in s}
    todo: dict[int, list[dict]] = {}
    for r in rounds:
        order = list(points)
        random.Random(f"{seed}/{r}").shuffle(order)
        todo[r] = [p for p in order if (p["key"], r) not in done and (r == rounds[0] or p["step"] not in ONCE)]
    prof = profiler or Profiler(lm, grid)
    left = sum(map(len, todo.values()))
    if left:
        warm_up(prof, {p["key"]: p for r in rounds for p in todo[r] if p["step"] not in ONCE}, grid.warmup, seed,
                progress)
    with tqdm(desc="calibrating", unit="pt", disable=not progress, initial=len(done), total=len(done) + left) as bar:
        for r in rounds:
            for p in todo[r]:
                s = dict(prof.measure(p), round=r)
                done[p["key"], r] = s
                partial.append(s)
                bar.update()
            if after_round:
                after_round(r)
        for tries in range(1, RETRIES + 1):  # a round another process slowed is timed again
            slow = disturbed(done, points, rounds)
            if not slow:
                break
            r, ratio = slow
            bar.write(f"round {r + 1} ran {ratio:.2f}x slower than the others (another process?): timed again "
                      f"({tries} of {RETRIES} tries)")
            for p in [q for q in points if (q["key"], r) in done]:
                s = dict(prof.measure(p), round=r, retry=tries)
                done[p["key"], r] = s
                partial.append(s)
        else:
            if slow := disturbed(done, points, rounds):
                bar.write(f"round {slow[0] + 1} still ran {slow[1]:.2f}x slower after {RETRIES} tries: each point is "
                          "priced at its fastest round; calibrate again on a quiet machine")
                return [combine([done[p["key"], r] for r in rounds if (p["key"], r) in done], fastest=True)
                        for p in points]
    return [combine([done[p["key"], r] for r in rounds if (p["key"], r) in done]) for p in points]


def warm_up(prof, points: dict[str, dict], rounds: int, seed: int, progress: bool) -> None:
    """`rounds` untimed rounds over the points a run will time, before its first timing: every
    kernel variant compiled (Metal builds a pipeline per variant on first use) and MLX's buffer
    cache filled as a running engine's is. Per process: a resumed run warms up again."""
    order = list(points.values())
    with tqdm(desc="warming up", unit="pt", disable=not progress, total=rounds * len(order)) as bar:
        for r in range(rounds):
            random.Random(f"{seed}/warm-up/{r}").shuffle(order)
            for p in order:
                prof.measure(p)
                bar.update()


RETRIES = 2  # times a disturbed round is timed again before the calibration goes on without it


def disturbed(done: dict, points: list[dict], rounds) -> tuple[int, float] | None:
    """The round that ran slowest against the others, and by how much (the median over points of
    its time over the point's fastest time in the other rounds), if that is `DISTURBED` or more:
    another process only ever slows a call, so a whole round slower than the rest was disturbed.
    The calibration's summary calls a drift above the same bound disturbed (`pdsim calibrate`):
    at 1.25, a round that ran 1.17x slow (qwen3.5-0.8b, 2026-12-07) was fitted as if quiet, and
    its held-out engine run's decodes were priced at 0.82x."""
    worst = None
    for r in rounds:
        ratios = [done[p["key"], r]["seconds"] / min(done[p["key"], o]["seconds"] for o in rounds
                                                     if o != r and (p["key"], o) in done)
                  for p in points if (p["key"], r) in done and any((p["key"], o) in done for o in rounds if o != r)]
        if ratios:
            ratio = statistics.median(ratios)
            if ratio >= DISTURBED and (worst is None or ratio > worst[1]):
                worst = (r, ratio)
    return worst


SPIKE = 1.5  # one of two rounds this many times the other's: a disturbance, not the kernel (`typical_time`)


def typical_time(times: list[float]) -> float:
    """A point's time from its rounds: their median; of two rounds where one took `SPIKE` times
    the other or more, the faster. Another process on the machine only ever slows a call, and
    the median of two is their mean: a process run for 20 s beside a calibration's first round
    made six points 1.5-3.1x their second round (a 128-token prefill 3.7 s against 1.2 s), and the
    mean priced every whole 127-token prompt of the tune's confirm 24-35% over. Calibrations
    undisturbed by anything of ours have such pairs too: 2 of 224 points in four, 3 of 112 in two."""
    if len(times) == 2 and max(times) >= SPIKE * min(times):
        return min(times)
    return statistics.median(times)


def point_time(sample: dict) -> float:
    """A grid sample's time from its rounds: `typical_time`, or the fastest round where a round
    stayed disturbed after its retries (`run_grid`, the sample's `fastest`)."""
    return min(sample["times"]) if sample.get("fastest") else typical_time(sample["times"])


def combine(visits: list[dict], fastest: bool = False) -> dict:
    """One point's rounds as one sample: every timing, their typical time (`fastest`: the least,
    where a round stayed disturbed) and spread, the mean shape."""
    times = [v["seconds"] for v in visits]
    out = {k: v for k, v in visits[0].items() if k not in ("round", "retry")}
    if fastest:  # kept in the sample, so a refit prices it the same way (`point_time`)
        out["fastest"] = True
    out.update(times=times, spread=max(times) - min(times))
    out["seconds"] = point_time(out)
    peaks = [v["peak_extra"] for v in visits if "peak_extra" in v]
    if peaks:  # the same shape allocates the same bytes each round; the median guards a stray one
        out["peak_extra"] = int(statistics.median(peaks))
    faults = [v["faults"] for v in visits if "faults" in v]
    if faults:  # as its time: a typical round's
        out["faults"] = int(statistics.median(faults))
    for k in ("context_sum", "context_max"):
        if k in out:
            out[k] = statistics.fmean(v[k] for v in visits)
    return out


def merge(old: list[dict], more: list[dict]) -> list[dict]:
    """`old` samples with the rounds of `more` (same keys) added to them."""
    extra = {s["key"]: s for s in more}
    # every round timed so far, typical again (`fastest` chose among the first rounds only)
    rounds = lambda s: [dict({k: v for k, v in s.items() if k != "fastest"}, seconds=t) for t in s["times"]]
    return [combine(rounds(s) + rounds(extra[s["key"]])) if s.get("key") in extra else s for s in old]

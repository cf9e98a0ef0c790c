"""Time the engine's own step functions over a grid; resumable, in shuffled order, with progress.

Every timed call is a step function the real executor runs (`prefill_chunk`, `DecodeBatch.sync`
and `.step`, `decode_one`), on caches shaped as the executor's would be. Cache states are sliced
from one long prefilled "master" cache, so a point at offset 2,048 does not pay a 2,048-token
prefill of its own. Finished points are appended to a partial file, so an interrupted run resumes.
"""
from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache
from tqdm import tqdm

import policies
from calibrate.executor import RealEngine
from calibrate.grid import Grid
from calibrate.kernels import Cache, DecodeBatch, decode_one, new_cache, prefill_chunk
from calibrate.model import LoadedModel
from traces.generators import tinyllm


def master_cache(lm: LoadedModel, length: int, chunk: int = 256) -> Cache:
    """One request's cache holding `length` tokens; the source of every sliced state."""
    cache = new_cache(lm)
    rng = random.Random(0)
    ids = [rng.randrange(lm.vocab_size) for _ in range(length)]
    for i in range(0, length, chunk):
        prefill_chunk(lm, cache, ids[i:i + chunk])
    return cache


def sliced(master: Cache, n: int) -> Cache:
    """A cache holding the first `n` tokens, with room to grow as the executor's usually has.

    mlx-lm grows a cache by 256-token steps; a state whose buffer is exactly full would make
    every timed call pay a copy of the whole cache, which the engine pays once per 256 tokens.
    """
    step = KVCache.step
    alloc = (n // step + 1) * step
    out = []
    for m in master:
        c = KVCache()
        c.state = (m.keys[..., :alloc, :], m.values[..., :alloc, :], n)
        out.append(c)
    mx.eval([(c.keys, c.values) for c in out])
    return out


def _timed(fn) -> float:
    """Seconds `fn` takes, starting from an empty MLX buffer cache.

    In the engine consecutive calls differ in shape, so a call rarely finds its buffers cached;
    timing the same shape back to back would reuse them and read ~10% fast (measured on
    Qwen3-0.6B, CPU: a 32-token chunk 0.68 s repeated, 0.74-0.78 s after another shape).
    """
    mx.clear_cache()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Profiler:
    def __init__(self, lm: LoadedModel, grid: Grid):
        self.lm, self.grid = lm, grid
        self.master: Cache | None = None
        rng = random.Random(1)
        self.ids = [rng.randrange(lm.vocab_size) for _ in range(max(grid.chunks + [1]))]

    def measure(self, point: dict) -> dict:
        """Warm-up, then `repeats` timings of one grid point; returns the point with its raw times."""
        if self.master is None and point["step"] != "overhead":
            self.master = master_cache(self.lm, self.grid.max_context())
        fn = getattr(self, f"_{point['step']}")
        times, extra = fn(point)
        return dict(point, times=times, seconds=statistics.median(times),
                    spread=(max(times) - min(times)), **extra)

    def _prefill(self, p: dict):
        chunk = self.ids[:p["chunk"]]
        times = []
        for i in range(self.grid.warmup + self.grid.repeats):
            cache = sliced(self.master, p["prefix"])
            dt = _timed(lambda: prefill_chunk(self.lm, cache, chunk))
            if i >= self.grid.warmup:
                times.append(dt)
        return times, {"batch": 1}

    def _decode(self, p: dict):
        ctx = p["contexts"]
        ids = [str(i) for i in range(len(ctx))]
        caches = {rid: sliced(self.master, c) for rid, c in zip(ids, ctx)}
        times, grown = [], 0
        if p.get("batched", True):
            batch = DecodeBatch(self.lm)
            batch.sync(ids, caches)
            step = lambda: batch.step([1] * len(ids))
        else:
            step = lambda: decode_one(self.lm, caches["0"], 1)
        for i in range(self.grid.warmup + self.grid.repeats):
            dt = _timed(step)
            if i >= self.grid.warmup:
                times.append(dt)
                grown += 1
        # contexts grew by one per step: report the mean context of the timed steps
        mid = self.grid.warmup + (grown + 1) / 2
        return times, {"batch": len(ctx), "context_sum": sum(c + mid for c in ctx), "context_max": max(ctx) + mid}

    def _join(self, p: dict):
        return self._membership(p, join=True)

    def _leave(self, p: dict):
        return self._membership(p, join=False)

    def _membership(self, p: dict, join: bool):
        """The extra time of a decode call in which a request joins (merge/extend) or leaves (filter).

        Timed as sync + the first step after it, minus a steady step of the new batch: the first
        step on freshly copied buffers is slower too, and the real engine pays both.
        """
        ctx = p["contexts"]
        ids = [str(i) for i in range(len(ctx))]
        before, after = (ids[:-1], ids) if join else (ids, ids[:-1])
        times = []
        for i in range(self.grid.warmup + self.grid.repeats):
            caches = {rid: sliced(self.master, c) for rid, c in zip(ids, ctx)}
            batch = DecodeBatch(self.lm)
            batch.sync(before, caches)
            batch.step([1] * len(before))
            if not join:
                del caches[ids[-1]]  # a finished request leaves: nothing to write back
            changed = _timed(lambda: (batch.sync(after, caches), batch.step([1] * len(after))))
            steady = _timed(lambda: batch.step([1] * len(after)))
            if i >= self.grid.warmup:
                times.append(max(0.0, changed - steady))
        rows = ctx[:len(after)]
        return times, {"batch": len(rows), "context_sum": sum(rows), "context_max": max(rows)}

    def _overhead(self, p: dict):
        """Host work per iteration: time between engine calls on a short real run, over iterations."""
        engine = RealEngine(self.lm)
        trace = tinyllm(num_seqs=4, min_in=16, max_in=48, min_out=6, max_out=6, seed=3, vocab=self.lm.vocab_size)
        times = []
        for i in range(self.grid.warmup + self.grid.repeats):
            log = engine.run(trace, policies.make("chunked", 16, 2)).log
            between = sum(b.start - a.end for a, b in zip(log.calls, log.calls[1:]))
            iterations = max(c.iteration for c in log.calls)
            if i >= self.grid.warmup:
                times.append(between / iterations)
        return times, {}


def run_grid(lm: LoadedModel, grid: Grid, partial: Path, header: dict, seed: int = 0,
             progress: bool = True) -> list[dict]:
    """Measure every grid point not already in `partial`, appending each as it finishes."""
    done: dict[str, dict] = {}
    if partial.exists():
        lines = partial.read_text().splitlines()
        if lines and json.loads(lines[0]) == header:
            for line in lines[1:]:
                try:
                    s = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by an interrupt
                    continue
                done[s["key"]] = s
        else:
            partial.unlink()
    if not partial.exists():
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(header) + "\n")
    todo = [p for p in grid.points() if p["key"] not in done]
    random.Random(seed).shuffle(todo)
    # group prefill points needing the same master cache is unnecessary: one master serves all
    prof = Profiler(lm, grid)
    with open(partial, "a") as f:
        for p in tqdm(todo, desc="calibrating", unit="pt", disable=not progress,
                      initial=len(done), total=len(done) + len(todo)):
            s = prof.measure(p)
            done[s["key"]] = s
            f.write(json.dumps(s) + "\n")
            f.flush()
    return [done[p["key"]] for p in grid.points()]

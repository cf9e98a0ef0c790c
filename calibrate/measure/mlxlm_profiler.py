"""Time mlx-lm BatchGenerator's calls on its own path, one grid point per call (`calibrate.measure.grid.MlxLmGrid`).

Every point runs mlx-lm's own batch classes, the ones `BatchGenerator.next()` drives: a prompt
call is `PromptProcessingBatch.prompt` (right padding, the model, the roll of the padding), a
generation step `GenerationBatch.next`, a first forward `PromptProcessingBatch.split(...).generate`,
a join the step after `GenerationBatch.extend`. Their caches are prepared from one prefilled
master cache (`calibrate.measure.profiler.master_cache`) with room to grow, and the KV token-rows each
point writes come from pdsim's own KV model (`sim.engine.batchcache.BatchCache`), as for the engine's
calls, a hybrid model's state copies among them (`state_tokens` token-rows a row's state).
Each timing ends by synchronizing the stream: the step's forward is pipelined otherwise.
"""
from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from calibrate.engine.executor import minor_faults
from calibrate.engine.kernels import is_kv
from calibrate.engine.mlxlm_batches import G
from calibrate.engine.model import LoadedModel
from calibrate.measure.grid import MlxLmGrid
from calibrate.measure.profiler import _state_copy, _timed, master_cache
from sim.engine.batchcache import BatchCache, write
from sim.engine.memory import state_tokens

MAX_TOKENS = 1 << 20  # a prepared row never finishes while timed


def _batch_cache(master, rows: int, idx: int, cap: int) -> list:
    """One `BatchKVCache` per layer: `rows` rows of `idx` tokens (no padding) in buffers of `cap`,
    laid out as the engine's own: zeros with the tokens written in. (`mx.repeat` of a slice of the
    master builds an array that copies 2.2x slower; every split and merge copies the cache, so a
    first forward on it read 0.96 s for 4 rows at 100 tokens, 0.58 s on the engine's path.)
    A hybrid model's linear layer gets the master's state once per row, as `ArraysCache.merge`
    stacks the rows' states."""
    out = []
    for m in master:
        if not is_kv(m):
            out.append(_state_copy(m, rows))
            continue
        c = BatchKVCache([0] * rows)
        keys = mx.zeros((rows, *m.keys.shape[1:2], cap, m.keys.shape[3]), m.keys.dtype)
        values = mx.zeros((rows, *m.values.shape[1:2], cap, m.values.shape[3]), m.values.dtype)
        keys[..., :idx, :] = m.keys[..., :idx, :]
        values[..., :idx, :] = m.values[..., :idx, :]
        c.state = (keys, values, mx.array([idx] * rows), mx.array([0] * rows), idx)
        out.append(c)
    mx.eval([c.state for c in out])
    return out


def _timed_faults(fn) -> tuple[float, int]:
    """`_timed`, and the minor page faults the call took. A call that builds a new cache (a
    merge) may fault in pages the engine's own call would find reused: qwen3-0.6b's grid merges
    cost 115-165 us a row written, the engine's 20-45 us, when every timing started from an
    emptied buffer cache. The fit tells the two costs apart by these counts."""
    before = minor_faults()
    dt = _timed(fn)
    return dt, minor_faults() - before


def _room(n: int) -> int:
    """A capacity holding n tokens with room to spare, as 256-token growth leaves buffers."""
    return write(0, 0, n + 1)[0]


class MlxLmProfiler:
    """Times one point of an `MlxLmGrid` per call; `run_grid` warms every point up in a round of its own."""

    def __init__(self, lm: LoadedModel, grid: MlxLmGrid):
        self.lm, self.grid, self.model = lm, grid, lm.model
        self.master = None
        self.state = state_tokens(lm.config, lm.dtype)
        rng = random.Random(1)
        self.ids = [rng.randrange(lm.vocab_size) for _ in range(max(max(p) for p in grid.prompts))]

    def measure(self, point: dict) -> dict:
        if self.master is None:
            self.master = master_cache(self.lm, self.grid.max_context() + 256)
        run = self._prompt if point["step"] == "prompt" else self._generate
        seconds, shape = run(point)
        return dict(point, seconds=seconds, fresh=0, **shape)

    def _batch(self, rows: int, kind, **kw):
        greedy = G.greedy_sampler
        return kind(self.model, list(range(rows)), **kw, samplers=[greedy] * rows, fallback_sampler=greedy,
                    logits_processors=[() for _ in range(rows)], stop_sequences=[G.StopSequences()] * rows,
                    max_tokens=[MAX_TOKENS] * rows)

    def _prompt_batch(self, rows: int, idx: int, cap: int):
        pb = self._batch(rows, G.PromptProcessingBatch, caches=[make_prompt_cache(self.model) for _ in range(rows)],
                         tokens=[[] for _ in range(rows)], prefill_step_size=MAX_TOKENS)
        if idx:
            for c, b in zip(pb.prompt_cache, _batch_cache(self.master, rows, idx, cap)):
                c.state = b.state
        return pb

    def _prompt(self, p: dict):
        """A prompt call: every row its chunk at write position `idx` (0: fresh rows, no buffers)."""
        chunks, idx = p["chunks"], p["idx"]
        longest, cap = max(chunks), _room(idx + max(chunks))
        pb = self._prompt_batch(len(chunks), idx, cap)
        mirror = BatchCache([str(i) for i in range(len(chunks))], [0] * len(chunks), idx, cap if idx else 0, bool(idx))
        mirror.update(longest)
        mirror.roll([longest - n for n in chunks])
        tokens = [self.ids[:n] for n in chunks]
        dt, faults = _timed_faults(lambda: (pb.prompt(tokens), mx.synchronize()))
        return dt, {"rows": len(chunks), "chunk": longest, "written": self._written(mirror),
                    "contexts": [idx] * len(chunks), "faults": faults}

    def _generation_batch(self, rows: int, context: int):
        """A generation batch whose next step attends `context` tokens per row (its first forward,
        run here, writes context - 1)."""
        cache = _batch_cache(self.master, rows, context - 2, _room(context))
        gb = self._batch(rows, G.GenerationBatch, inputs=mx.array([1] * rows, dtype=mx.uint32), prompt_cache=cache,
                         tokens=[[1] for _ in range(rows)])
        mx.synchronize()
        return gb

    def _generate(self, p: dict):
        b, x = p["batch"], p["context"]
        if p["call"] == "first":  # split every row off a prepared prompt batch, then its first forward
            pb = self._prompt_batch(b, x - 1, _room(x))
            mirror = BatchCache([str(i) for i in range(b)], [0] * b, x - 1, _room(x), True)
            split = mirror.split(list(range(b)))
            split.update(1)
            dt, faults = _timed_faults(lambda: (pb.split(list(range(b))).generate([[1] for _ in range(b)]),
                                                mx.synchronize()))
            return dt, {"context_max": x, "contexts": [x] * b, "written": self._written(split), "first": True,
                        "faults": faults}
        gb = self._generation_batch(b, x)
        mirror = BatchCache([str(i) for i in range(b)], [0] * b, x - 1, _room(x), True)
        contexts = [x] * b
        if p["call"] == "merge":  # rows just split off join: the step pays the rebuild
            j, y = p["joining"], p["joining_context"]
            gb.extend(self._generation_batch(j, y))
            mirror.extend(BatchCache([f"j{i}" for i in range(j)], [0] * j, y - 1, _room(y), True))
            contexts += [y] * j
        mirror.update(1)
        dt, faults = _timed_faults(lambda: (gb.next(), mx.synchronize()))
        return dt, {"batch": len(contexts), "context_max": max(contexts), "contexts": contexts,
                    "written": self._written(mirror), "first": False, "joined": p.get("joining", 0), "faults": faults}

    def _written(self, mirror: BatchCache) -> int:
        """Token-rows a call evaluating `mirror` writes: its owed arrays and its rows' states."""
        return sum(mirror.owed) + mirror.states * self.state

"""Where mlx-lm's KV caches copy themselves: their buffer sizes, followed without data.

mlx-lm keeps every cache in a buffer grown in 256-token steps (`KVCache`, `BatchKVCache`): a
write that does not fit allocates a larger buffer and copies what is held. A batch cache is
rebuilt by copies when requests join (`merge`, then `extend`: pad and concatenate) or leave
(`filter`: a gather of the kept rows), and the new buffers keep the old spare room, so how much a
call writes depends on the buffers' history, not only on the contexts: a request joining three
others at context 128 writes 4 rows of a 384-token buffer. On this CPU a token-row of Qwen3-0.6B
(229 KB over 28 layers) costs ~0.04 ms to write once, a fifth of a decode step per 1,000 rows.

`KVBuffers` follows the sizes exactly as mlx-lm 0.32 computes them, for the executor's calls
(`calibrate.engine.kernels`), so both executors log, and the cost model prices, the token-rows of KV
buffer each call writes (`written`: buffer growth, pad, concatenate, gather; not the merge of
joining caches, which costs next to nothing here). A pad writes its rows twice: MLX fills the new
array with the pad value, then copies the old rows in (CPU and GPU alike): counted twice, copying
joins price 0.99-1.09x what they ran (counted once, 1.11-1.27x). A test checks the sizes against
the real caches, call by call.

Memory the process has not used before costs more: the kernel maps and zeroes every fresh page
(a 700 MB copy took 1.9 s the first time and 0.45 s after, in one process). So `KVBuffers`
follows what the caches free as well as what they allocate, on a model of the process's heap
(`sim.engine.heap`), and `fresh` counts the token-rows a call faults in there; the real engine
counts each call's page faults (`EventLog.faults`), what this estimates. Freed memory is not one
pool any array can take from: so modelled, a join's faults came out at twice what they were.

mlx-lm's `BatchGenerator` keeps two batch caches, the prompt batch and the generation batch
(`sim.engine.batchcache.BatchCache`), rebuilt by the same operations plus a roll of the right
padding after a padded prompt call, lazily: the call that evaluates a cache is charged its
rebuilds (`KVBuffers.join_prompt`, `batch_prefill`, `first_forward`, `generate`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sim.engine.batchcache import BatchCache, write
from sim.engine.heap import Heap


@dataclass
class KVBuffers:
    """Buffer capacity of every request's own cache and of the batch cache (rows, `_idx`, capacity).
    A hybrid model's rows also hold a linear-layer state each (`state` token-rows' worth, no heap
    model: it is not a KV array), copied where the row is: written back, gathered, concatenated."""
    own: dict[str, int] = field(default_factory=dict)  # rid -> capacity of its per-request cache
    rows: tuple[str, ...] = ()  # the batch cache's rows, in order
    idx: int = 0  # the batch cache's `_idx`: its longest row, left padding included
    cap: int = 0
    heap: Heap = field(default_factory=Heap)  # the process's heap: where the caches' arrays lie (`sim.engine.heap`)
    written: int = 0  # token-rows allocated and filled since `take` last ran
    built: int = 0  # the largest of those arrays; `take` moves it to `call_largest` (the last call's)
    call_largest: int = 0
    prompt: "BatchCache" = field(default_factory=lambda: BatchCache())  # mlx-lm's prompt batch
    gen: "BatchCache" = field(default_factory=lambda: BatchCache())  # mlx-lm's generation batch
    state: int = 0  # token-rows of a request's linear-layer state (`sim.engine.memory.state_tokens`)
    counts: ClassVar[bool] = True  # follows every buffer's size (`RowsOnly` does not)

    def what_if(self) -> "KVBuffers":
        """A copy to follow a call on without changing these buffers (the batch caches copied too)."""
        return KVBuffers(dict(self.own), self.rows, self.idx, self.cap, self.heap.copy(), self.written,
                         self.built, self.call_largest, self.prompt.copy(), self.gen.copy(), self.state)

    def _new(self, rows: int, passes: int = 1) -> None:
        """One new array of `rows` token-rows (each layer's keys and values alike), written by the
        call `passes` times (a pad's: filled, then the rows copied in)."""
        self.written += rows * passes
        self.built = max(self.built, rows)
        self.heap.take(rows)

    def _drop(self, rows: int) -> None:
        """An array of `rows` token-rows freed: the process keeps its memory for the next."""
        self.heap.give(rows)

    def released(self) -> Heap:
        """The heap once a run drops every cache: what it freed, and every buffer still held (the
        next run's start, `calibrate.engine.executor`)."""
        out = self.heap.copy()
        for rows in (*self.own.values(), len(self.rows) * self.cap, *self.prompt.buffers(), *self.gen.buffers()):
            out.give(rows)
        out.settle()
        return out

    def resident(self) -> int:
        """Token-rows of KV buffer held now, by capacity: every request's own cache (kept while the
        request decodes in the batch cache), the batch cache, and mlx-lm's two batches (`sim.engine.memory`)."""
        return sum(self.own.values()) + len(self.rows) * self.cap + self.prompt.held() + self.gen.held()

    def take(self) -> tuple[int, int]:
        """(written, fresh) since the last take: one call's, its arrays placed on the heap now. A
        merge's own rows are neither (see `sync`), so its faults are left out with it."""
        out = self.written, min(self.written, self.heap.settle())
        self.call_largest, self.written, self.built = self.built, 0, 0
        return out

    def prefill(self, rid: str, prefix: int, n: int) -> tuple[int, int]:
        """A prompt chunk of n tokens after `prefix` cached ones, on the request's own cache:
        (written, fresh) token-rows."""
        old = self.own.get(rid, 0)
        self.own[rid], grown = write(old, prefix, n)
        if grown:  # a new buffer, the old one copied into it and freed
            self._new(grown)
            self._drop(old)
        return self.take()

    def mixed(self, rows: list[tuple[str, int, int]]) -> tuple[int, int]:
        """One forward over several requests' own caches (`sim.engine.work.Mixed`): each row
        (request, cached tokens, tokens written) grows its buffer as a chunk would; the arrays
        are placed together, as one call's."""
        for rid, prefix, n in rows:
            old = self.own.get(rid, 0)
            self.own[rid], grown = write(old, prefix, n)
            if grown:
                self._new(grown)
                self._drop(old)
        return self.take()

    def decode_one(self, rid: str, cached: int) -> tuple[int, int]:
        """One token on the request's own cache, which holds `cached` tokens."""
        return self.prefill(rid, cached, 1)

    def decode_batch(self, rids: tuple[str, ...], cached: dict[str, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        """`DecodeBatch.sync(rids)` then one step; `cached[rid]` is what each request's cache holds
        before the step (its own cache for a joining request, its row for a member). Returns
        (written, fresh) of the sync (0, 0 when the rows are unchanged) and of the step."""
        synced = (0, 0)
        if rids != self.rows:
            self.sync(rids, cached)
            synced = self.take()
        old = self.cap
        self.cap, grown = write(self.cap, self.idx, 1)
        self.idx += 1
        if grown:
            self._new(len(rids) * grown)
            self._drop(len(rids) * old)
        return synced, self.take()

    def sync(self, rids: tuple[str, ...], cached: dict[str, int]) -> None:
        wanted, present = set(rids), set(self.rows)
        kept = [r for r in self.rows if r in wanted]
        joining = [r for r in rids if r not in present]
        for r in self.rows:
            if r not in wanted and r in cached:  # a leaver that still owes tokens: its row copied out
                self.own[r] = cached[r]
                self._new(cached[r])
                self.written += self.state
        if not kept:
            self._drop(len(self.rows) * self.cap)
            self.idx = self.cap = 0
        elif len(kept) < len(self.rows):
            self._filter(kept, cached, len(self.rows))
        if joining:
            # merge: an exact-size buffer, no spare room, filled from caches just written; it copies
            # at memory speed from memory the allocator just freed (one request at 60-290 tokens:
            # 1-2 ms, no page faults, against ~40 us per token-row for a concatenation or a gather
            # and twice that for a pad), so it is not counted, only followed as memory taken
            longest = max(cached[r] for r in joining)
            merged = len(joining) * longest
            self.heap.take(merged)  # freed below with the other inputs, or the batch cache itself if none
            if not kept:
                self.idx = self.cap = longest
            else:  # extend: both sides padded to one size where they differ, then concatenated
                idx, size = max(self.idx, longest), max(self.cap, longest)
                copies = [merged, len(kept) * self.cap]  # the inputs, freed once the concatenation is built
                for n, i, c in ((len(kept), self.idx, self.cap), (len(joining), longest, longest)):
                    left = idx - i
                    if left or size - c - left > 0:  # `mx.pad`
                        self._new(n * size, passes=2)
                        copies.append(n * size)
                self._new((len(kept) + len(joining)) * size)
                self.written += (len(kept) + len(joining)) * self.state
                for rows in copies:
                    self._drop(rows)
                self.idx, self.cap = idx, size
        if kept + joining != list(rids):  # same members, another order: a gather of every row
            self._filter(list(rids), cached, len(kept) + len(joining))
        self.rows = tuple(rids)

    def _filter(self, kept: list[str], cached: dict[str, int], held: int) -> None:
        """`BatchKVCache.filter` of a batch of `held` rows: gather the kept rows (the old buffer
        freed), then drop the padding they all share (a view)."""
        self._new(len(kept) * self.cap)
        self.written += len(kept) * self.state
        self._drop(held * self.cap)
        shift = self.idx - max(cached[r] for r in kept)
        self.idx -= shift
        self.cap -= shift

    def finish(self, rid: str) -> None:
        """A finished request's own cache is dropped (its batch row goes at the next sync)."""
        self._drop(self.own.pop(rid, 0))

    def preempt(self, rid: str, freed: object) -> None:
        """A preempted request's own cache is dropped, and its batch row is marked `freed` (an
        object no request's id equals), so the next sync filters it out as a leave, as the real
        executor's batch does (`calibrate.engine.executor`), even if the request has rejoined by then."""
        self._drop(self.own.pop(rid, 0))
        if rid in self.rows:
            self.rows = tuple(freed if r == rid else r for r in self.rows)

    # --- mlx-lm's BatchGenerator: the prompt batch and the generation batch ---------------------

    def _settle(self, cache: "BatchCache") -> None:
        """A call evaluates `cache`: the lazy arrays it owes are allocated and filled now, each
        built from the one before it, which is freed, and so are the buffers it was built from.
        A growth among them is placed as the rebuilds' arrays are: mlx-lm builds it lazily, with
        the batch's other copies."""
        for rows in cache.owed:
            self._new(rows)
            self._drop(cache.live)
            cache.live = rows
        for rows in cache.dropped:
            self._drop(rows)
        self.written += cache.states * self.state  # a hybrid's states, gathered and concatenated: no heap model
        cache.owed, cache.dropped, cache.states = [], [], 0

    def join_prompt(self, rids: tuple[str, ...]) -> tuple[int, int]:
        """Requests with empty caches join the prompt batch (merge, then `extend`): lazy, (0, 0)."""
        self.prompt.extend(BatchCache(list(rids), [0] * len(rids)))
        return self.take()

    def batch_prefill(self, chunks: list[int]) -> tuple[int, int]:
        """One call of the prompt batch, row i prefilling chunks[i] tokens (in the batch's order):
        every row writes the longest chunk's positions; with padding, the buffers are rolled."""
        c, longest = self.prompt, max(chunks)
        self._settle(c)  # the rebuilds since the last prompt call (joins, the split's gather)
        c.update(longest)
        c.roll([longest - n for n in chunks])
        self._settle(c)
        return self.take()

    def first_forward(self, rids: tuple[str, ...]) -> tuple[int, int]:
        """Split `rids` off the prompt batch, write their last prompt token, join them to the
        generation batch (its copies are lazy: the next `generate` pays them)."""
        split = self.prompt.split([self.prompt.rows.index(r) for r in rids])
        split.update(1)
        self._settle(split)  # the split's gather (and any join it read from), the write's growth
        self.gen.extend(split)
        return self.take()

    def generate(self, rids: tuple[str, ...], leaving: set[str]) -> tuple[int, int]:
        """One step of the generation batch (rows `rids`, its order); the rows in `leaving`
        return their last token and are filtered out after it (lazily, for the next step)."""
        c = self.gen
        self._settle(c)  # the joins and leaves since the last step
        c.update(1)
        self._settle(c)
        self.leave_gen(leaving)
        return self.take()

    def leave_gen(self, leaving: set[str]) -> None:
        """Rows that returned their last token are filtered out of the generation batch (a lazy
        gather); the last ones leave no cache at all."""
        c = self.gen
        keep = [i for i, r in enumerate(c.rows) if r not in leaving]
        if not keep:
            for rows in (c.live, *c.dropped):
                self._drop(rows)
            self.gen = BatchCache()
        elif len(keep) < len(c.rows):
            c.filter(keep)


class RowsOnly(KVBuffers):
    """The buffers of a replay whose profile prices no KV copy and no memory (the built-in one):
    only which requests the batch cache holds, in order (what makes a sync), and mlx-lm's two
    batches' rows (what its policy reads). pdsim's and vLLM's calls write nothing it counts, and no
    buffer's growth ends a steady stretch (`sim.steady`): a replay pays for what its profile prices."""
    counts: ClassVar[bool] = False

    def what_if(self) -> "RowsOnly":
        return RowsOnly(dict(self.own), self.rows, self.idx, self.cap, self.heap.copy(), self.written,
                        self.built, self.call_largest, self.prompt.copy(), self.gen.copy())

    def prefill(self, rid: str, prefix: int, n: int) -> tuple[int, int]:
        return 0, 0

    def decode_batch(self, rids: tuple[str, ...], cached: dict[str, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        self.rows = tuple(rids)
        return (0, 0), (0, 0)

    def mixed(self, rows: list[tuple[str, int, int]]) -> tuple[int, int]:
        return 0, 0

"""Where mlx-lm's KV caches copy themselves: their buffer sizes, followed without data.

mlx-lm keeps every cache in a buffer grown in 256-token steps (`KVCache`, `BatchKVCache`): a
write that does not fit allocates a larger buffer and copies what is held. A batch cache is
rebuilt by copies when requests join (`merge`, then `extend`: pad and concatenate) or leave
(`filter`: a gather of the kept rows), and the new buffers keep the old spare room, so how much a
call writes depends on the buffers' history, not only on the contexts: a request joining three
others at context 128 writes 4 rows of a 384-token buffer. On a CPU these fresh buffers cost
~0.1-0.3 ms per token-row for Qwen3-0.6B, a large part of the call they happen in.

`KVBuffers` follows the sizes exactly as mlx-lm 0.32 computes them, for the executor's calls
(`calibrate.kernels`), so both executors log, and the cost model prices, the token-rows of KV
buffer each call writes (`written`). A test checks the sizes against the real caches, call by call.

Memory the process has never held before costs more again: the kernel maps and zeroes every fresh
page (a 700 MB copy took 1.9 s the first time and 0.45 s after, in one process). Freed memory is
reused, so what is fresh is what lifts the run's high-water mark of KV buffers: `fresh`, counted
with every buffer a call writes alive at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

STEP = 256  # KVCache.step and BatchKVCache.step


def write(cap: int, idx: int, n: int) -> tuple[int, int]:
    """`update_and_fetch` of n tokens at `idx` into a buffer of `cap` tokens (0: none yet):
    the new capacity, and the token-rows of the new buffer when it had to grow (else 0)."""
    if idx + n <= cap:
        return cap, 0
    grown = -(-n // STEP) * STEP
    new = grown if cap == 0 else (idx if idx % STEP else cap) + grown
    return new, new


@dataclass
class KVBuffers:
    """Buffer capacity of every request's own cache and of the batch cache (rows, `_idx`, capacity)."""
    own: dict[str, int] = field(default_factory=dict)  # rid -> capacity of its per-request cache
    rows: tuple[str, ...] = ()  # the batch cache's rows, in order
    idx: int = 0  # the batch cache's `_idx`: its longest row, left padding included
    cap: int = 0
    peak: int = 0  # the most token-rows of KV buffer held at once so far, transient copies included

    @property
    def held(self) -> int:
        """Token-rows of KV buffer held: every request's own cache and the batch cache."""
        return sum(self.own.values()) + len(self.rows) * self.cap

    def fresh(self, held: int, written: int) -> int:
        """Token-rows beyond the high-water mark when `written` new rows are allocated on top of
        `held` (the old buffers are freed only after the call); raises the mark."""
        top = held + written
        fresh, self.peak = max(0, top - self.peak), max(self.peak, top)
        return fresh

    def prefill(self, rid: str, prefix: int, n: int) -> int:
        """A prompt chunk of n tokens after `prefix` cached ones, on the request's own cache."""
        self.own[rid], written = write(self.own.get(rid, 0), prefix, n)
        return written

    def decode_one(self, rid: str, cached: int) -> int:
        """One token on the request's own cache, which holds `cached` tokens."""
        return self.prefill(rid, cached, 1)

    def decode_batch(self, rids: tuple[str, ...], cached: dict[str, int]) -> int:
        """`DecodeBatch.sync(rids)` then one step; `cached[rid]` is what each request's cache holds
        before the step (its own cache for a joining request, its row for a member)."""
        written = self.sync(rids, cached) if rids != self.rows else 0
        self.cap, grown = write(self.cap, self.idx, 1)
        self.idx += 1
        return written + len(rids) * grown

    def sync(self, rids: tuple[str, ...], cached: dict[str, int]) -> int:
        wanted, present = set(rids), set(self.rows)
        kept = [r for r in self.rows if r in wanted]
        joining = [r for r in rids if r not in present]
        written = 0
        for r in self.rows:
            if r not in wanted and r in cached:  # a leaver that still owes tokens: its row copied out
                self.own[r] = cached[r]
                written += cached[r]
        if not kept:
            self.idx = self.cap = 0
        elif len(kept) < len(self.rows):
            written += self._filter(kept, cached)
        if joining:
            longest = max(cached[r] for r in joining)  # merge: an exact-size buffer, no spare room
            written += len(joining) * longest
            if not kept:
                self.idx = self.cap = longest
            else:  # extend: both sides padded to one size where they differ, then concatenated
                idx, size = max(self.idx, longest), max(self.cap, longest)
                for n, i, c in ((len(kept), self.idx, self.cap), (len(joining), longest, longest)):
                    left = idx - i
                    if left or size - c - left > 0:
                        written += n * size
                written += (len(kept) + len(joining)) * size
                self.idx, self.cap = idx, size
        if kept + joining != list(rids):  # same members, another order: a gather of every row
            written += self._filter(list(rids), cached)
        self.rows = tuple(rids)
        return written

    def _filter(self, kept: list[str], cached: dict[str, int]) -> int:
        """`BatchKVCache.filter`: gather the kept rows, then drop the padding they all share (a view)."""
        written = len(kept) * self.cap
        shift = self.idx - max(cached[r] for r in kept)
        self.idx -= shift
        self.cap -= shift
        return written

    def finish(self, rid: str) -> None:
        """A finished request's own cache is dropped (its batch row goes at the next sync)."""
        self.own.pop(rid, None)

"""Where mlx-lm's KV caches copy themselves: their buffer sizes, followed without data.

mlx-lm keeps every cache in a buffer grown in 256-token steps (`KVCache`, `BatchKVCache`): a
write that does not fit allocates a larger buffer and copies what is held. A batch cache is
rebuilt by copies when requests join (`merge`, then `extend`: pad and concatenate) or leave
(`filter`: a gather of the kept rows), and the new buffers keep the old spare room, so how much a
call writes depends on the buffers' history, not only on the contexts: a request joining three
others at context 128 writes 4 rows of a 384-token buffer. On this CPU a token-row of Qwen3-0.6B
(229 KB over 28 layers) costs ~0.06-0.08 ms to write, a third of a decode step per 1,000 rows.

`KVBuffers` follows the sizes exactly as mlx-lm 0.32 computes them, for the executor's calls
(`calibrate.kernels`), so both executors log, and the cost model prices, the token-rows of KV
buffer each call writes (`written`: buffer growth, pad, concatenate, gather; not the merge of
joining caches, which costs next to nothing here). A test checks the sizes against the real
caches, call by call.

Memory the process has not used before costs more: the kernel maps and zeroes every fresh page
(a 700 MB copy took 1.9 s the first time and 0.45 s after, in one process). An allocator reuses
freed blocks up to the size it has seen freed (glibc's malloc raises its mmap threshold to the
largest freed block; MLX's buffer caches likewise serve what they hold), so an array larger than
any before is fresh memory and a smaller one mostly reuses: `fresh` counts the token-rows of the
arrays a call allocates that are larger than every array before them in the run.
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
    largest: int = 0  # the largest array allocated so far in the run (token-rows, one layer's keys)
    written: int = 0  # token-rows allocated and filled, and of them fresh, since `take` last ran
    fresh: int = 0

    def _new(self, rows: int) -> None:
        """One new array of `rows` token-rows (each layer's keys and values alike)."""
        self.written += rows
        if rows > self.largest:
            self.fresh += rows
            self.largest = rows

    def take(self) -> tuple[int, int]:
        """(written, fresh) since the last take: one call's."""
        out = self.written, self.fresh
        self.written = self.fresh = 0
        return out

    def prefill(self, rid: str, prefix: int, n: int) -> tuple[int, int]:
        """A prompt chunk of n tokens after `prefix` cached ones, on the request's own cache:
        (written, fresh) token-rows."""
        self.own[rid], grown = write(self.own.get(rid, 0), prefix, n)
        if grown:
            self._new(grown)
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
        self.cap, grown = write(self.cap, self.idx, 1)
        self.idx += 1
        if grown:
            self._new(len(rids) * grown)
        return synced, self.take()

    def sync(self, rids: tuple[str, ...], cached: dict[str, int]) -> None:
        wanted, present = set(rids), set(self.rows)
        kept = [r for r in self.rows if r in wanted]
        joining = [r for r in rids if r not in present]
        for r in self.rows:
            if r not in wanted and r in cached:  # a leaver that still owes tokens: its row copied out
                self.own[r] = cached[r]
                self._new(cached[r])
        if not kept:
            self.idx = self.cap = 0
        elif len(kept) < len(self.rows):
            self._filter(kept, cached)
        if joining:
            # merge: an exact-size buffer, no spare room, filled from caches just written; it copies
            # at memory speed from memory the allocator just freed (one request at 60-290 tokens:
            # 1-2 ms, no page faults, against ~50 us per token-row for pad, concatenate and
            # gather), so it is not counted
            longest = max(cached[r] for r in joining)
            if not kept:
                self.idx = self.cap = longest
            else:  # extend: both sides padded to one size where they differ, then concatenated
                idx, size = max(self.idx, longest), max(self.cap, longest)
                for n, i, c in ((len(kept), self.idx, self.cap), (len(joining), longest, longest)):
                    left = idx - i
                    if left or size - c - left > 0:
                        self._new(n * size)
                self._new((len(kept) + len(joining)) * size)
                self.idx, self.cap = idx, size
        if kept + joining != list(rids):  # same members, another order: a gather of every row
            self._filter(list(rids), cached)
        self.rows = tuple(rids)

    def _filter(self, kept: list[str], cached: dict[str, int]) -> None:
        """`BatchKVCache.filter`: gather the kept rows, then drop the padding they all share (a view)."""
        self._new(len(kept) * self.cap)
        shift = self.idx - max(cached[r] for r in kept)
        self.idx -= shift
        self.cap -= shift

    def finish(self, rid: str) -> None:
        """A finished request's own cache is dropped (its batch row goes at the next sync)."""
        self.own.pop(rid, None)

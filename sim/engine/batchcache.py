"""mlx-lm's caches by their sizes: the growth rule every KV cache shares, and `BatchKVCache`.

mlx-lm keeps every cache in a buffer grown in 256-token steps (`KVCache`, `BatchKVCache`): a
write that does not fit allocates a larger buffer and copies what is held (`write`).
`BatchCache` is a batch cache of `BatchGenerator`'s as pdsim follows it, without data: its rows,
their left padding, the shared write position and capacity, and the copies its rebuilds owe.
Those rebuilds are lazy in mlx-lm (a copy is made when a later call evaluates the cache), so
`owed` keeps the arrays built and not yet evaluated, and `sim.engine.kvcache.KVBuffers` charges
them to the call that evaluates the cache. A hybrid model's linear layers keep an
`ArraysCache` beside each batch's KV caches, gathered and concatenated with it (`filter`,
`extend`): `states` counts the rows' states those copies owe.
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
class BatchCache:
    """mlx-lm's `BatchKVCache` by its sizes: the rows, each row's left padding, the shared write
    position `_idx`, the buffers' capacity, and the lazy arrays built from it and not yet
    evaluated (token-rows each, one layer's keys). No rows: no cache at all (mlx-lm's list of
    caches is emptied when a batch loses its last row, and a batch joining it is taken as is)."""
    rows: list[str] = field(default_factory=list)
    pad: list[int] = field(default_factory=list)
    idx: int = 0
    cap: int = 0
    keys: bool = False  # whether it holds buffers (a merge of empty caches holds none)
    owed: list[int] = field(default_factory=list)
    live: int = 0  # token-rows of the buffer allocated last (`KVBuffers.heap` follows it)
    dropped: list[int] = field(default_factory=list)  # buffers freed once the owed arrays are built
    states: int = 0  # rows' linear-layer states the owed rebuilds copy (a hybrid model's `ArraysCache`)

    def copy(self) -> "BatchCache":
        return BatchCache(list(self.rows), list(self.pad), self.idx, self.cap, self.keys, list(self.owed), self.live,
                          list(self.dropped), self.states)

    def buffers(self) -> list[int]:
        """Token-rows of every buffer allocated for this batch and not yet freed."""
        return [self.live, *self.dropped]

    def held(self) -> int:
        """Token-rows of buffer this batch holds (every row at the shared capacity)."""
        return len(self.rows) * self.cap if self.keys else 0

    def lengths(self) -> list[int]:
        """Each row's tokens in the cache (real, padding excluded)."""
        return [self.idx - p for p in self.pad]

    def update(self, n: int) -> None:
        """`update_and_fetch` of n positions in every row: grow in 256-token steps if needed."""
        cap, grown = write(self.cap if self.keys else 0, self.idx, n)
        if grown:
            self.owed.append(len(self.rows) * grown)
        self.cap, self.keys, self.idx = cap, True, self.idx + n

    def roll(self, right: list[int]) -> None:
        """`prepare(right_padding)` before a padded call and `finalize` after it: each row's
        padding is rolled to its left, a new buffer of every row's whole capacity."""
        if max(right) > 0:
            self.owed.append(len(self.rows) * self.cap)
            self.pad = [p + r for p, r in zip(self.pad, right)]

    def filter(self, keep: list[int]) -> None:
        """Keep these rows (a gather of the whole buffer, and of their states), then drop the left
        padding they all share."""
        if self.keys:
            self.owed.append(len(keep) * self.cap)
            self.states += len(keep)
        self.rows = [self.rows[i] for i in keep]
        self.pad = [self.pad[i] for i in keep]
        shift = min(self.pad)
        if shift > 0:
            if self.keys:
                self.cap -= shift  # a view
            self.idx -= shift
            self.pad = [p - shift for p in self.pad]

    def split(self, idx: list[int]) -> "BatchCache":
        """`PromptProcessingBatch.split`: rows `idx` (sorted) leave in a batch of their own,
        returned; both sides are gathers of these buffers. The split side is evaluated first (its
        first forward runs before the prompt call), so it owes what the two share."""
        idx = sorted(idx)
        other = self.copy()
        other.live, other.dropped = 0, []  # its gather is built from this batch's buffer
        rest = [i for i in range(len(self.rows)) if i not in idx]
        self.owed, self.states = [], 0
        if rest:
            self.filter(rest)
        else:  # the buffer goes once the split's gather is built
            other.dropped, self.live, self.dropped = [self.live, *self.dropped], 0, []
            self.rows, self.pad, self.idx, self.cap, self.keys = [], [], 0, 0, False
        other.filter(idx)
        return other

    def extend(self, other: "BatchCache") -> None:
        """`BatchKVCache.extend`: rows of `other` join at the end. Both sides are padded to the
        larger write position and capacity where they differ, then concatenated, and so are their
        states (zeros for a side that has none yet)."""
        self.states += other.states
        if not self.rows:  # no cache yet: the joining batch's own
            self.rows, self.pad, self.idx, self.cap, self.keys = (list(other.rows), list(other.pad), other.idx,
                                                                  other.cap, other.keys)
            self.owed = self.owed + other.owed
            self.dropped = self.dropped + [self.live] + other.dropped
            self.live = other.live
            return
        self.owed = self.owed + other.owed
        self.dropped = self.dropped + other.buffers()  # the joining batch's buffer: an input of the concatenation
        if not self.keys and not other.keys:
            self.rows += other.rows
            self.pad += other.pad
            return
        idx = max(self.idx, other.idx)
        size = max(self.cap if self.keys else 0, other.cap if other.keys else 0)
        pads = []
        for c in (self, other):
            left = idx - c.idx
            right = size - (c.cap if c.keys else 0) - left
            if left or right > 0:
                self.owed.append(len(c.rows) * size)
            pads.append([p + left for p in c.pad])
        self.owed.append((len(self.rows) + len(other.rows)) * size)
        self.states += len(self.rows) + len(other.rows)
        self.rows = self.rows + other.rows
        self.pad = pads[0] + pads[1]
        self.idx, self.cap, self.keys = idx, size, True

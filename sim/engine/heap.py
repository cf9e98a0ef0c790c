"""The engine process's heap as far as the KV caches go: where each array lands, and which calls
fault pages in.

The engine's process keeps what it frees (`calibrate.host.malloc`: glibc serves every block up to
32 MiB from its heap and never trims it), so a page is faulted in once, when the heap first
grows over it: with glibc's calls traced, every call's page faults were its growth of the heap's
high-water mark, to the page. Which calls grow it is glibc's placement: a block takes the
smallest free block that holds it (best fit, the rest left free), a freed block merges with its
free neighbours, and one next to the top merges into the top.

`Heap` follows that placement for the KV arrays only, in token-rows. A buffer of R rows is one
array per layer's keys and values; they are followed in `groups` groups (the model's layers),
each block R units long (a unit: one row of one group). A call's arrays are built group after
group, and an array's inputs are freed `WINDOW` groups later: MLX evaluates a call's graph in
breadth-first order, 20 nodes wide (`MLX_BFS_MAX_WIDTH`), so about six of Qwen3-0.6B's 56 arrays
are built before the first one's inputs go. Activations, logits and MLX's own buffer cache are
left out, which is where the model misses most: before a traced mlx-lm merge the process had
37 MB free in 328 pieces and the model 4 MB in one, and the merge faulted 293 rows where the
model said 101. Over 15 pdsim confirm reports, joins were predicted at 59.2k fresh rows where
they faulted 63.3k (a join's faulted/predicted 0.86-1.03-2.01, p10-p50-p90), prefills at 5.6k
where they faulted 7.4k.

A replay follows the heap only where its profile prices fresh memory (`NoHeap` otherwise,
`CostModel.fresh_heap`): placing every array is most of a replay's time.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

GROUPS = 28  # groups a profile that does not say follows the arrays in (Qwen3-0.6B's layers, keys and values)
WINDOW = 3  # groups built before the first group's inputs are freed
SHIFT = 48  # a free block's key in `sizes`: size << SHIFT | address, one int that sorts as (size, address)
LOW = (1 << SHIFT) - 1


@dataclass
class Heap:
    """Free blocks (by start, by end and in size order), the top, the high-water mark, and the
    blocks each group holds by size; `take` and `give` record a call's arrays, `settle` places
    them. A freed block finds its free neighbours by its two ends, and a placement the best fit
    by size, without a list kept in address order. Sizes sort as one int and a group's blocks
    are tuples, so a copy (`EngineState.kv_rows` follows a call on one) copies no inner list:
    this is a replay's most frequent work, 1.4x faster so than with (size, address) pairs."""
    free: dict[int, int] = field(default_factory=dict)  # address -> size
    ends: dict[int, int] = field(default_factory=dict)  # address + size -> address
    sizes: list[int] = field(default_factory=list)  # size << SHIFT | address, in order
    top: int = 0  # where the top starts: everything from here up is free
    high: int = 0  # the high-water mark: every page below it has been faulted in
    held: list[dict[int, tuple[int, ...]]] = field(default_factory=list)  # per group: size -> addresses
    pending: list[tuple[bool, int]] = field(default_factory=list)  # (allocate?, rows) since `settle`
    groups: int = GROUPS  # the model's layers: each layer's keys and values are one group's arrays

    def __post_init__(self) -> None:
        if not self.held:
            self.held = [{} for _ in range(self.groups)]

    def copy(self) -> "Heap":
        return Heap(self.free.copy(), self.ends.copy(), self.sizes.copy(), self.top, self.high,
                    [g.copy() for g in self.held], self.pending.copy(), self.groups)

    def take(self, rows: int) -> None:
        """An array of `rows` token-rows allocated (placed at the next `settle`)."""
        if rows > 0:
            self.pending.append((True, rows))

    def give(self, rows: int) -> None:
        """An array of `rows` token-rows freed."""
        if rows > 0:
            self.pending.append((False, rows))

    def settle(self) -> int:
        """Place the arrays recorded since the last call, group by group, each group's inputs
        freed `WINDOW` groups later; the token-rows of fresh memory they faulted in (the
        high-water mark's growth)."""
        ops, self.pending = self.pending, []
        first = next((i for i, (alloc, _) in enumerate(ops) if alloc), len(ops))
        held, drop = self.held, self._drop
        for _, n in ops[:first]:  # freed before the call began (a finished request's cache)
            for g in held:
                drop(g, n)
        ops = ops[first:]
        if not ops:
            return 0
        new = [n for alloc, n in ops if alloc]
        gone = [n for alloc, n in ops if not alloc]
        before, place = self.high, self._place
        for g, group in enumerate(held):
            for n in new:
                at = place(n)
                group[n] = group.get(n, ()) + (at,)
            if g >= WINDOW:
                for n in gone:
                    drop(held[g - WINDOW], n)
        for group in held[max(0, len(held) - WINDOW):]:  # the last groups' inputs, freed after the call
            for n in gone:
                drop(group, n)
        return (self.high - before + self.groups // 2) // self.groups

    def _place(self, size: int) -> int:
        """glibc's best fit: the smallest free block that holds `size` (the lowest of equal ones),
        else the top."""
        sizes = self.sizes
        i = bisect_left(sizes, size << SHIFT)
        if i < len(sizes):
            k = sizes.pop(i)
            n, at = k >> SHIFT, k & LOW
            del self.free[at], self.ends[at + n]
            if n > size:
                rest, left = at + size, n - size
                self.free[rest], self.ends[at + n] = left, rest
                insort(sizes, left << SHIFT | rest)
            return at
        at = self.top  # no free block ends at the top: `_drop` merges such a block into it
        self.top = top = at + size
        if top > self.high:
            self.high = top
        return at

    def _drop(self, held: dict, size: int) -> None:
        """Free a block of `size` a group holds (the newest), merged with its free neighbours or
        into the top; a view's buffer is larger than the view (a filter's shared padding
        dropped), so else the smallest larger one."""
        ats = held.get(size)
        if ats is None:
            larger = [n for n in held if n > size]
            if not larger:
                return
            size = min(larger)
            ats = held[size]
        at = ats[-1]
        if len(ats) > 1:
            held[size] = ats[:-1]
        else:
            del held[size]
        free, ends, sizes = self.free, self.ends, self.sizes
        n = free.pop(at + size, None)
        if n is not None:
            del ends[at + size + n], sizes[bisect_left(sizes, n << SHIFT | (at + size))]
            size += n
        before = ends.pop(at, None)
        if before is not None:
            n = free.pop(before)
            del sizes[bisect_left(sizes, n << SHIFT | before)]
            at, size = before, size + n
        if at + size >= self.top:
            self.top = at
        else:
            free[at], ends[at + size] = size, at
            insort(sizes, size << SHIFT | at)


class NoHeap:
    """The heap of a replay whose profile prices no fresh memory: it places nothing, and no call
    meets fresh memory (a replay pays only for what its profile prices; placing every KV array
    was two thirds of a replay's time)."""

    def copy(self) -> "NoHeap":
        return self

    def take(self, rows: int) -> None:
        pass

    def give(self, rows: int) -> None:
        pass

    def settle(self) -> int:
        return 0

"""What a call pays for writing KV buffers: per token-row written, and more per row of fresh
memory, at the price of the kind of write (a gather, a step's own growth, a single decode's)
where the profile measured one apart. `sim.engine.kvcache` counts the rows; this prices them.
"""
from __future__ import annotations

from sim.cost.model import CostModel


def is_gather(kind: str, joined: int, left: int) -> bool:
    """A sync in which requests only leave: its rows are written by a gather of the kept rows
    (`BatchKVCache.filter`), priced apart (`gather`) where its calibration timed one. With a pad's
    fill counted as a write of its own (`sim.engine.kvcache`), the two fit alike on a Xeon VM
    (37-39 us a row against 38)."""
    return kind == "sync" and left > 0 and not joined


def is_step_growth(kind: str, joined: int, left: int) -> bool:
    """A prefill or decode that grows a buffer (no batch change inside it): its fresh rows cost a
    fifth of a join's on a Xeon VM (1-3 us a page fault against 7-12 us), so a profile may price
    them apart (`fresh_step`)."""
    return kind in ("prefill", "decode") and not joined and not left


def kv_copies(cost: CostModel, written: int, fresh: int, gather: bool = False, step: bool = False,
              grow: bool = False, single: bool = False) -> float:
    """Seconds a call spends writing KV buffers: per token-row written (a leave's gather, or a
    decode's own growth: `grow`, each at its own price where the profile has one), and more per
    fresh one (a step's growth at its own price, where the profile has one). A single decode's own
    growth (a request's own cache, 256 -> 512 tokens) has one price per row, `grow_single`, where
    the profile has one: on meTile's runs it cost 100-980 us a row, a median of about 450 (the
    batch cache's growths 50-300). What it costs is its page faults, priced at the dear page
    (`calibrate.fit.pdsim.fit_grow_single`), so a growth that meets any fresh memory pays the
    faults on every row (charged to its fresh rows only, meTile's first growth priced 512 ms where
    it ran 278); one that meets none (the heap already held it, after a warm-up that served the
    trace) pays the row's copy alone, `grow_single` less its faults (such growths faulted nothing
    and ran 440-500 ms where the faults priced them at 595)."""
    if grow and single and cost.grow_single is not None:
        faults = cost.grow_single_faults
        return (cost.grow_single if fresh or faults is None else cost.grow_single - faults) * written
    per_row = cost.gather if gather and cost.gather is not None else cost.copy
    if grow and cost.grow is not None:
        per_row = cost.grow
    per_fresh = cost.fresh_step if step and cost.fresh_step is not None else cost.fresh
    return per_row * written + per_fresh * fresh


def call_copies(cost: CostModel, kind: str, joined: int, left: int, written: int, fresh: int,
                single: bool = False) -> float:
    """`kv_copies` of a call of this kind and batch change (a gather, a step's own growth, or neither);
    `single`: a decode of one request on its own cache."""
    step = is_step_growth(kind, joined, left)
    return kv_copies(cost, written, fresh, is_gather(kind, joined, left), step, step and kind == "decode", single)

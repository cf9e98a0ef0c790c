"""Fresh memory is what a call allocates beyond what the process freed and holds (`sim.kvcache.Heap`):
the state machine follows frees as well as allocations, so a growth that can reuse a finished
request's cache is not fresh, and one that cannot is."""
import pytest

import policies
from calibrate.worker import warmup_trace
from sim.costmodel import LinearCostModel
from sim.kvcache import Heap, KVBuffers
from sim.replay import simulate
from traces.generators import metile_ab

COST = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-6, 0.0))


def test_an_array_takes_freed_memory_first_and_the_rest_is_fresh():
    heap = Heap()
    assert heap.take(300, step=True) == 300  # nothing freed yet: all of it is fresh
    heap.give(300)
    assert heap.take(256, step=True) == 0
    assert heap.take(100, step=True) == 56  # 44 rows left, 56 fresh
    assert heap.free == 0 and heap.largest == 300
    copy = heap.copy()
    copy.give(10)
    assert heap.free == 0 and copy.free == 10


def test_a_rebuilds_array_is_fresh_where_it_is_a_new_largest_shape():
    heap = Heap()
    assert heap.take(500) == 500  # a batch rebuild's first array: a new shape
    assert heap.take(400) == 0  # nothing freed, but a shape no larger than before: freed pieces hold it
    heap.give(900)
    assert heap.take(600) == 600  # a new largest shape: fresh, whatever was freed
    assert heap.free == 300 and heap.largest == 600
    heap.reuse(50)  # a merge: memory taken, no shape
    assert heap.free == 250 and heap.largest == 600
    assert heap.take(300, step=True) == 50  # a step's growth: what the freed memory lacks


def test_a_grown_cache_frees_its_old_buffer_and_a_finished_one_its_own():
    kv = KVBuffers()
    assert kv.prefill("a", 0, 100) == (256, 256)  # a first buffer: fresh
    assert kv.prefill("a", 256, 10) == (512, 512)  # grown: the old 256 rows freed after the copy
    assert kv.heap.free == 256
    assert kv.prefill("b", 0, 100) == (256, 0)  # b's buffer reuses a's old one
    kv.finish("a")
    assert kv.heap.free == 512
    assert kv.released().free == 512 + 256  # the next run starts with every buffer freed


def growths(setting: dict) -> list[tuple[str, int, int]]:
    """(request, written, fresh) of every single decode that grew a request's own cache, in
    meTile's A/B scenario (B arrives while A decodes) after the confirm's warm-up."""
    trace = metile_ab(prompt_len=256, output_len=32)
    log = simulate(trace, policies.make(**setting), COST, warmup=warmup_trace(trace))
    return [(c.rids[0], c.written, c.fresh) for c in log.calls if c.kind == "decode" and not c.batched and c.written]


def test_metile_b_grows_into_a_freed_cache_under_fifo_and_into_fresh_memory_under_chunked():
    # fifo: A has finished and freed its 512-row cache when B's grows to 512: nothing fresh
    fifo = growths({"policy": "fifo", "decode": "single"})
    assert [(r, w) for r, w, _ in fifo] == [("A", 512), ("B", 512)]
    assert fifo[1][2] == 0
    # chunked, decode-first: A still holds its grown cache when B's grows: fresh memory
    chunked = growths({"policy": "chunked", "budget": 16, "order": "decode-first", "decode": "single"})
    assert [(r, w) for r, w, _ in chunked] == [("A", 512), ("B", 512)]
    assert chunked[1][2] > 0

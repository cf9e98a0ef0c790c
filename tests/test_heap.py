"""Fresh memory is the pages a call faults in: where the process's heap first grows over them
(`sim.engine.heap`). The heap model places arrays as glibc does (best fit, merged free blocks, a freed
block next to the top merged into it), and glibc itself, driven through the same sequence in a
process set up as the engine's (`calibrate.host.malloc`), faults what the model says."""
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

import policies
import sim.engine.heap
from calibrate.measure.worker import warmup_of, warmup_trace
from sim.cost.model import LinearCostModel
from sim.engine.heap import Heap
from sim.engine.kvcache import KVBuffers
from sim.replay import simulate
from traces.generators import gamma, metile_ab, tinyllm

COST = LinearCostModel((1e-3, 1e-5, 0.0), (1e-3, 1e-6, 0.0), fresh=1e-9)  # prices fresh memory: the heap runs


def call(heap: Heap, *ops: int) -> int:
    """One call's arrays: a positive number allocates that many rows, a negative one frees."""
    for n in ops:
        heap.take(n) if n > 0 else heap.give(-n)
    return heap.settle()


@pytest.fixture
def one_array(monkeypatch):
    """One array per buffer, inputs freed as soon as their array is built: glibc's placement alone."""
    monkeypatch.setattr(sim.engine.heap, "WINDOW", 0)
    return Heap(groups=1)


def test_only_memory_above_the_high_water_mark_is_fresh(one_array):
    heap = one_array
    assert call(heap, 100, 50, 200) == 350
    assert call(heap, -100, -200) == 0  # the 200 next to the top merges into it; 100 stays free below
    assert call(heap, 80) == 0  # into the freed 100
    assert call(heap, 150) == 0  # at the top, below the high-water mark: its pages were faulted before
    assert call(heap, 100) == 50  # past the mark by 50


def test_a_block_takes_the_smallest_free_block_that_holds_it(one_array):
    heap = one_array
    assert call(heap, 100, 10, 60, 10) == 180
    assert call(heap, -100, -60) == 0  # free blocks of 100 and 60, not adjacent
    assert call(heap, 50) == 0  # best fit: into the 60, so the 100 stays whole
    assert call(heap, 100) == 0  # first fit would have split the 100 and grown the heap here


def test_freed_neighbours_merge_into_one_block(one_array):
    heap = one_array
    assert call(heap, 100, 100, 10) == 210
    assert call(heap, -100) == 0
    assert call(heap, -100) == 0
    assert call(heap, 200) == 0  # the two freed 100s are one 200


def test_the_window_keeps_inputs_alive_while_later_arrays_are_built(monkeypatch):
    """Two arrays per buffer, each of 200 rows replaced by one of 150: each group's new array is
    placed, and its old one freed WINDOW groups later. Freed at once, the second group's new array
    fits the first group's old one; freed one group later, it does not."""
    faulted = {}
    for window in (0, 1):
        monkeypatch.setattr(sim.engine.heap, "WINDOW", window)
        heap = Heap(groups=2)
        assert call(heap, 200) == 200
        faulted[window] = call(heap, 150, -200)
    assert faulted == {0: 75, 1: 150}


def test_frees_before_a_call_are_settled_before_its_arrays():
    heap = Heap()
    call(heap, 256)
    heap.give(256)  # a finished request's cache, freed between calls
    assert call(heap, 256) == 0


def test_a_grown_cache_frees_its_old_buffer_and_a_finished_one_its_own():
    kv = KVBuffers()
    assert kv.prefill("a", 0, 100) == (256, 256)  # a first buffer: fresh
    written, fresh = kv.prefill("a", 256, 10)  # grown: the old buffer freed layer by layer behind the new
    # one: the first layers' new arrays go above everything, later ones into two neighbouring freed 256s
    assert written == 512 and 256 < fresh < 512
    kv.finish("a")
    assert kv.prefill("b", 0, 300) == (512, 0)  # b's buffer takes a's grown one
    before = kv.heap.copy()
    assert kv.released().high == before.high  # dropping every cache faults nothing


def test_a_join_counts_a_pads_rows_twice_and_the_concatenation_once():
    """`BatchKVCache.extend` pads each side to one size where they differ (`mx.pad` fills the new
    array, then copies the rows in: two writes a row) and concatenates them (one)."""
    kv = KVBuffers(rows=("a",), idx=130, cap=256)
    kv.sync(("a", "b"), {"a": 130, "b": 144})
    # a is shifted 14 and b (a 144-row merge) widened to 256: two pads of 256 rows, then 2 x 256
    assert kv.take()[0] == 2 * 256 * 2 + 2 * 256
    kv = KVBuffers(rows=("a",), idx=144, cap=144)
    kv.sync(("a", "b"), {"a": 144, "b": 144})
    assert kv.take()[0] == 2 * 144  # both sides already one size: the concatenation alone


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


@pytest.mark.parametrize("setting", [{"policy": "fifo"}, {"policy": "eager", "batch_size": 4},
                                     {"policy": "chunked", "budget": 16, "batch_size": 4},
                                     {"policy": "mlx-lm", "prefill_step": 32, "prompt_concurrency": 2,
                                      "decode_concurrency": 4}])
def test_a_process_that_served_the_trace_faults_nothing_serving_it_again(setting):
    """A confirm's default warm-up is the trace itself (`calibrate.measure.worker.warmup_of`): the timed run
    then finds a heap that already held everything this traffic needs, as a server's does once it
    has served it, and no call grows it. Every request arrives at once, so no call's time (a fresh
    row's price in the warm-up) can change the path; after the short warm-up the same run faults."""
    trace = tinyllm(6, 20, 200, 4, 12, seed=3)
    fresh = {kind: sum(c.fresh for c in simulate(trace, policies.make(**setting), COST,
                                                 warmup=warmup_of(trace, kind)).calls)
             for kind in ("short", "trace")}
    assert fresh["trace"] == 0 and fresh["short"] > 0


def test_arrivals_spread_over_time_fault_little_after_the_trace_warm_up():
    """With arrivals in time, the warm-up's calls (fresh rows priced) can interleave arrivals
    otherwise than the timed run's; what that path fault in is still a small part of a cold run's."""
    trace = gamma(12, 1.5, 1 / 3, 9, 333, 3, 21, seed=5)
    for setting in ({"policy": "chunked", "budget": 32, "batch_size": 4}, {"policy": "eager", "batch_size": 4}):
        cold, warm = (sum(c.fresh for c in simulate(trace, policies.make(**setting), COST,
                                                    warmup=warmup_of(trace, kind)).calls)
                      for kind in ("short", "trace"))
        assert cold > 0 and warm <= cold / 10


CALLS = [[40], [60, -40], [40], [120, -60, -40], [40, 100, -40, -120], [200, -100], [30, 250, -30, -200]]

GLIBC = textwrap.dedent("""
    import ctypes, json, resource, sys
    from calibrate.host.malloc import keep_freed_memory
    import sim.engine.heap as H
    state = keep_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    unit, held, out = 64 << 10, [{} for _ in range(H.GROUPS)], []
    for ops in json.loads(sys.argv[1]):
        new, gone = [n for n in ops if n > 0], [-n for n in ops if n < 0]
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for g in range(H.GROUPS + H.WINDOW):  # as `Heap.settle` plays a call
            if g < H.GROUPS:
                for n in new:
                    p = libc.malloc(n * unit)
                    libc.memset(p, 1, n * unit)  # the call writes its arrays
                    held[g].setdefault(n, []).append(p)
            if g >= H.WINDOW:
                for n in gone:
                    libc.free(held[g - H.WINDOW][n].pop())
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        out.append(faults * 4096 / (H.GROUPS * unit))
    print(json.dumps({"malloc": state, "faulted": out}))
""")


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's heap")
def test_glibc_faults_what_the_heap_model_says_call_by_call():
    """The same allocations and frees, in the order the model plays them, made with glibc's
    malloc and free in a process that keeps freed memory: the pages each call faults in."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", GLIBC, json.dumps(CALLS)], capture_output=True, text=True,
                          cwd=root, env=dict(os.environ, PYTHONPATH=root), timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["malloc"].startswith("keeps freed memory")
    heap = Heap()
    predicted = [call(heap, *ops) for ops in CALLS]
    assert predicted[0] == 40 and predicted[4] == 0  # a first array; a call that fits the freed blocks
    for p, m in zip(predicted, out["faulted"]):
        assert abs(p - m) <= max(2.0, 0.3 * m), (predicted, out["faulted"])
    assert sum(predicted) == pytest.approx(sum(out["faulted"]), rel=0.15)


def test_a_replay_follows_the_heap_only_where_its_profile_prices_fresh_memory():
    """A host effect is paid for only where the profile measured it: the built-in profile prices
    no fresh memory, so its replays place nothing and no call meets fresh memory; a CPU profile
    whose calibration priced page faults follows the heap, and some calls fault."""
    from pathlib import Path

    from sim.cost.profile import BUILTIN, cost_model, load_profile
    from sim.engine.heap import NoHeap
    cpu = Path(__file__).parents[1] / "benchmarks" / "fixtures" / "cpu-qwen3-0.6b.json"
    trace = gamma(40, 2.0, 1 / 3, 9, 333, 3, 21, seed=5)
    for path, prices in ((BUILTIN, False), (cpu, True)):
        cost = cost_model(load_profile(path))
        assert cost.prices_fresh is prices
        assert isinstance(cost.fresh_heap(), NoHeap) is not prices
        log = simulate(trace, policies.make("chunked", 64, 4, cost=cost), cost)
        assert any(c.fresh for c in log.calls) is prices

"""Where a confirm run's page faults come from: the run again with glibc's calls traced (HISTORY, stop 43).

Re-runs one setting of a confirm report's runs (its warm-up and probes too, as `pdsim confirm`
ran it, on pdsim's executor or mlx-lm's BatchGenerator as the report did) with
`benchmarks/malloc_trace.c` preloaded, which logs every malloc and free of 64 KiB or more with
the heap's top. Then, per work item of the timed run: the page faults the run
counted, the growth of the heap's high-water mark the trace shows, and the fresh rows
`sim.engine.heap` said, all in token-rows. In stop 43 the first two agreed to the page. Needs Linux,
glibc and gcc; prints figures, asserts nothing.

    python3 benchmarks/heap_trace.py REPORT.json.runs '{"policy": "chunked", "budget": 32, "batch_size": 4}'
    python3 benchmarks/heap_trace.py MLX_REPORT.json.runs '{"policy": "mlx-lm", "prefill_step": 32,
        "prompt_concurrency": 1, "decode_concurrency": 4}' 54

With a call number, also the work item that holds that call, in the process (the trace) and in
`sim.engine.heap` (the run's own state): the free memory just before it (the pieces between live blocks,
from the first block the runs allocated up, and the room below the high-water mark above the
top, in MB), and the blocks it allocated and freed, in order (HISTORY, stop 45).
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHIM = "malloc_trace"


def relaunch() -> None:
    """Build the shim and run this script again with it (and the engine's BLAS) preloaded."""
    from calibrate.host.blas import MARK, core_override, find_openblas
    tmp = Path(tempfile.mkdtemp(prefix="heap-trace-"))
    lib = tmp / f"{SHIM}.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(ROOT / "benchmarks" / f"{SHIM}.c")],
                   check=True)
    blas = find_openblas()
    env = dict(os.environ, MTRACE_OUT=str(tmp / "trace.txt"), **{MARK: "1"})
    env["LD_PRELOAD"] = " ".join(p for p in (str(lib), blas, env.get("LD_PRELOAD", "")) if p)
    if blas and (core := core_override(blas)):
        env["OPENBLAS_CORETYPE"] = core
    os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)


@dataclass
class Followed:
    """What `sim.engine.heap` did in one run, by work item (keyed by the calls done before it)."""
    heaps: dict = field(default_factory=dict)  # the heap the run starts from (0), and after each item
    settles: dict = field(default_factory=dict)  # each item's settles: lists of (allocate?, rows)
    start: int = 0  # calls done before the item running now


def run(runs_dir: Path, setting: dict) -> tuple[dict, list[int], list[Followed]]:
    """The setting's run as the confirm ran it (pdsim's executor, or mlx-lm's BatchGenerator
    where the report's engine is mlx-lm), a marker after every work item (one `next()` of
    BatchGenerator); (log, calls per run, what `sim.engine.heap` did in each run)."""
    import calibrate.engine.batchgen as batchgen
    import calibrate.engine.executor as executor
    import calibrate.measure.worker as worker
    from sim.engine.heap import Heap
    mark = ctypes.CDLL(None).pdsim_mark
    mark.argtypes = (ctypes.c_long,)
    served, followed = [], []
    plain, plain_bg, plain_settle = executor.RealEngine.run, batchgen.run_batch_generator, Heap.settle

    def settle(heap):
        if followed:
            followed[-1].settles.setdefault(followed[-1].start, []).append(list(heap.pending))
        return plain_settle(heap)

    def item_done(state) -> None:
        mark(state.log.call_count)
        followed[-1].heaps[state.log.call_count] = state.kv.heap.copy()
        followed[-1].start = state.log.call_count

    def marked(self, trace, policy, on_call=None):
        mark(-1000 - len(served))  # a run starts: -1000, -1001, ... (warm-up, probes, the run)
        followed.append(Followed({0: self.heap.copy()}))  # the heap the run starts from
        out = plain(self, trace, policy, item_done)
        served.append(out.log.call_count)
        mark(-2000)
        return out

    def marked_bg(lm, trace, setting, heap=None, on_call=None):
        mark(-1000 - len(served))
        followed.append(Followed({0: heap.copy() if heap is not None else Heap()}))
        out = plain_bg(lm, trace, setting, heap, lambda state, gen: item_done(state))
        served.append(out[0].log.call_count)
        mark(-2000)
        return out
    executor.RealEngine.run, batchgen.run_batch_generator, Heap.settle = marked, marked_bg, settle
    what = json.loads((runs_dir / "what.json").read_text())
    spec = {"model": what["model"], "trace_path": str(runs_dir / "trace.jsonl"), "setting": setting,
            "warmup": 1, "engine": what.get("engine", "pdsim")}
    spec["probe"] = spec["engine"]  # as the confirm probed it (`speed_probe.probe_engine`)
    return worker.run_spec(spec)["log"], served, followed


def trace_lines(trace_file: Path) -> Iterator[tuple[str, int, int, int]]:
    """The shim's lines, parsed: ("M", k, 0, 0) for a marker (k signed), else ("A" or "F", bytes,
    address, the heap's top) for a block of the heap (one glibc mapped on its own, above 32 MiB,
    is skipped: it is not the heap)."""
    for line in trace_file.read_text().splitlines():
        op, a, b, c = (line.split() + ["0", "0"])[:4]
        if op == "M":
            yield op, int(a) - (1 << 64) if int(a) >= 1 << 63 else int(a), 0, 0
        elif int(b, 16) < int(c, 16):
            yield op, int(a), int(b, 16), int(c, 16)


def item_blocks(trace_file: Path, run_index: int, start: int) -> list[tuple[str, int]]:
    """(A or F, bytes) of each heap block the item of run `run_index` that starts at call
    `start` allocated or freed, in order."""
    out, inside, now = [], False, None
    for op, a, _, _ in trace_lines(trace_file):
        if op == "M":
            if a == -1000 - run_index:
                inside, now = True, 0
            elif inside and a == -2000:
                break
            elif inside:
                now = a
        elif inside and now == start:
            out.append((op, a))
    return out


def runs_of(labels: list[str]) -> str:
    """Labels with repeats run together: "A768r x10 F256r x2 ..."."""
    out: list[list] = []
    for x in labels:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return " ".join(f"{x} x{n}" if n > 1 else x for x, n in out)


def real_free(trace_file: Path, run_index: int, before: int) -> tuple[list[int], int]:
    """(free pieces between live blocks, bytes, from the first block the runs allocated up; the
    top chunk) just before the item of run `run_index` that starts at call `before`."""
    live, runs_began, first, inside, top = {}, False, None, False, 0
    for op, size, at, now in trace_lines(trace_file):
        if op == "M":
            runs_began = runs_began or -2000 < size <= -1000
            if size == -1000 - run_index:
                inside = True
            elif inside and size == before:
                break
            continue
        top = now
        if op == "A":
            live[at] = size
            first = at if runs_began and (first is None or at < first) else first
        else:
            live.pop(at, None)
    pieces, end = [], first
    for at, size in sorted(live.items()):
        if at + size <= first:
            continue
        if end < at < end + (1 << 30):  # a gap of a gigabyte or more parts two mappings, not the heap
            pieces.append(at - end)
        end = max(end, at + size)
    return pieces, top - end


def show_free(label: str, pieces: list[int], room: int) -> None:
    mb = lambda n: f"{n / (1 << 20):.1f}"  # noqa: E731
    big = sorted((p for p in pieces if p >= 1 << 20), reverse=True)
    print(f"{label}: {mb(sum(pieces))} MB free in {len(pieces)} pieces (of 1 MB or more: "
          f"{', '.join(map(mb, big[:8])) or 'none'}{' ...' if len(big) > 8 else ''}); {mb(room)} MB above the top")


def growth_by_item(trace_file: Path, run_index: int) -> list[tuple[int, int, int]]:
    """(first call, end call, bytes the heap's high-water mark grew by) of each work item of run
    `run_index`: the shim's markers give the calls each item ended with."""
    high, inside, items, start, grew = 0, False, [], 0, 0
    for op, size, at, _ in trace_lines(trace_file):
        if op == "M":
            if size == -1000 - run_index:
                inside, start, grew = True, 0, 0
            elif inside and size == -2000:
                break
            elif inside:
                items.append((start, size, grew))
                start, grew = size, 0
        elif op == "A" and at + size > high:
            if inside and high:
                grew += at + size - max(high, at)
            high = at + size
    return items


def arguments() -> tuple[Path, dict]:
    """The runs folder and the setting, or one line saying what is wrong (exit 2)."""
    if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and not sys.argv[3].isdigit()):
        sys.exit(print(f"usage: {sys.argv[0]} REPORT.json.runs SETTING_JSON [CALL]", file=sys.stderr) or 2)
    runs_dir = Path(sys.argv[1])
    if not (runs_dir / "what.json").is_file():
        sys.exit(print(f"{runs_dir}: not a confirm report's runs folder (no what.json)", file=sys.stderr) or 2)
    try:
        setting = json.loads(sys.argv[2])
    except json.JSONDecodeError as e:
        sys.exit(print(f"setting {sys.argv[2]!r}: not JSON ({e.msg})", file=sys.stderr) or 2)
    if not isinstance(setting, dict):
        sys.exit(print(f"setting {sys.argv[2]!r}: must be a JSON object", file=sys.stderr) or 2)
    return runs_dir, setting


def main() -> None:
    runs_dir, setting = arguments()
    if SHIM not in os.environ.get("LD_PRELOAD", ""):
        relaunch()
    from calibrate.engine.model import QWEN3_CONFIGS
    from sim.engine.heap import GROUPS
    from sim.engine.memory import kv_bytes_per_token
    log, served, followed = run(runs_dir, setting)
    model = json.loads((runs_dir / "what.json").read_text())["model"]
    row = kv_bytes_per_token(QWEN3_CONFIGS[model["name"]], model["dtype"])
    timed = next(i for i, n in enumerate(served) if n == len(log["calls"]))
    k = {name: i for i, name in enumerate(log["call_fields"])}
    calls, faults = log["calls"], log["faults"]
    print(f"runs served (calls): {served}; the timed run is run {timed}; a token-row is {row:,} bytes")
    print("calls     faulted  heap grew  sim.engine.heap fresh  | the item's calls (kind, requests, written)")
    for a, b, grew in growth_by_item(Path(os.environ["MTRACE_OUT"]), timed):
        faulted = sum(faults[a:b]) * 4096 / row
        fresh = sum(c[k["fresh"]] for c in calls[a:b])
        if faulted < 5 and grew < 5 * row and not fresh:
            continue
        what = ", ".join(f"{c[k['kind']]}({len(c[k['rids']])}, w{c[k['written']]})" for c in calls[a:b])
        print(f"{a:3}-{b:<3}  {faulted:8.0f}  {grew / row:9.0f}  {fresh:14}  | {what}")
    if len(sys.argv) == 4:
        # the item that holds the call (a run's path can differ from the report's: its calls too)
        mine = followed[timed]
        before = max(n for n in mine.heaps if n <= int(sys.argv[3]))
        unit, trace_file = row / GROUPS, Path(os.environ["MTRACE_OUT"])  # sim.engine.heap's unit: a token-row of one group
        show_free(f"before call {before}, the process", *real_free(trace_file, timed, before))
        heap = mine.heaps[before]
        show_free(f"before call {before}, sim.engine.heap   ", [round(n * unit) for n in heap.free.values()],
                  round((heap.high - heap.top) * unit))
        array_row = row // (2 * GROUPS)  # one token-row of one layer's keys (or values)
        label = lambda size: (f"{(size - 8) // array_row}r" if (size - 8) % array_row == 0 and size - 8 >= 128 * array_row
                              else f"{size // 1024}K")  # noqa: E731  MLX adds 8 bytes to every buffer
        print(f"the item's blocks, in order (r: 128 or more whole KV rows of one array, which an activation can "
              f"also be; K: KiB), the process: "
              f"{runs_of([op + label(size) for op, size in item_blocks(trace_file, timed, before)])}")
        print("sim.engine.heap's settles (T: taken, G: given, rows of every layer's keys and values): " + " | ".join(
            " ".join(("T" if take else "G") + str(n) for take, n in ops) for ops in mine.settles.get(before, [])))

if __name__ == "__main__":
    main()

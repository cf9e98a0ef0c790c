"""Trace loading speed: the Azure 2023 conversation trace (19,366 rows), and a synthetic file in the
Azure 2024 week-long format to show the streaming reader's rows/s and the memory it needs on the way.

Run: python benchmarks/bench_trace_load.py [--repeats N] [--azure2024-rows N]. Prints figures; asserts
nothing. The issue's target: the conversation trace loads in under 1 s.
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from traces.formats import read
from traces.load import load_file
from traces.shape import Shaping

ROOT = Path(__file__).resolve().parents[1]
CONV = ROOT / ".." / "shared" / "traces" / "azure-2023" / "AzureLLMInferenceTrace_conv.csv"


def bench_conv(repeats: int) -> None:
    if not CONV.is_file():
        print(f"skipped: {CONV.resolve()} is absent")
        return
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trace = load_file(CONV)
        times.append(time.perf_counter() - t0)
    best, med = min(times), statistics.median(times)
    print(f"Azure 2023 conv ({len(trace):,} requests): load_file best {best * 1e3:.0f} ms, "
          f"median {med * 1e3:.0f} ms over {repeats} runs ({len(trace) / best:,.0f} requests/s)")
    code = ("import time; t0 = time.perf_counter(); from traces.load import load_file; "
            f"load_file({str(CONV)!r}); print(time.perf_counter() - t0)")
    cold = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=ROOT).stdout)
    print(f"  in a fresh process, imports included: {cold * 1e3:.0f} ms")


def bench_azure2024(rows: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "azure2024.csv"
        with open(path, "w") as f:
            f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
            for i in range(rows):
                s = i // 10
                f.write(f"2024-05-{10 + s // 86400:02d} {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}."
                        f"{i % 10 * 100000:06d}+00:00,{100 + i % 4000},{1 + i % 500}\n")
        size = path.stat().st_size
        t0 = time.perf_counter()
        requests, _ = read(path, "azure")
        dt = time.perf_counter() - t0
        del requests
        tracemalloc.start()
        requests, _ = read(path, "azure")
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del requests
        t0 = time.perf_counter()
        first = load_file(path, shaping=Shaping(first=1000))
        dt_first = time.perf_counter() - t0
    print(f"Azure 2024 format, synthetic {rows:,} rows ({size / 1e6:.1f} MB): read {dt:.2f} s "
          f"({rows / dt:,.0f} rows/s); memory kept {kept / 1e6:.1f} MB (the requests), extra on the way "
          f"{(peak - kept) / 1e6:.2f} MB; --first 1000 reads {first.meta['rows_read']:,} rows in {dt_first * 1e3:.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--azure2024-rows", type=int, default=200_000)
    a = p.parse_args()
    bench_conv(a.repeats)
    if a.azure2024_rows > 0:
        bench_azure2024(a.azure2024_rows)


if __name__ == "__main__":
    main()

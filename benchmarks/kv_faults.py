"""Page faults of every real call beside the KV token-rows the model counts as written and fresh.

The tails that still miss sit on KV copies into memory the process has not used before
(HISTORY, stop 27), and `sim/engine/kvcache.py`'s rule for "fresh" does not say when that happens. This
prints, for every call that writes KV buffers or faults a lot, the minor page faults between
calls (`getrusage`), in token-rows (4 KiB pages over a token-row's keys and values), and the time:
what a better rule has to match. Prints figures; asserts nothing.

Run (on Linux, OpenBLAS preloaded as `pdsim` does itself):
    LD_PRELOAD=$(python -c 'from calibrate.host.blas import find_openblas; print(find_openblas())') \\
      python benchmarks/kv_faults.py TRACE.jsonl '{"policy": "eager", "batch_size": 4}'
"""
import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import policies  # noqa: E402
from calibrate.engine.executor import RealEngine  # noqa: E402
from calibrate.engine.model import build_model  # noqa: E402
from calibrate.measure.worker import warmup_trace  # noqa: E402
from sim.engine.memory import kv_bytes_per_token  # noqa: E402
from sim.metrics.residuals import call_kind  # noqa: E402
from traces.trace import load_jsonl  # noqa: E402


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(trace_path: str, setting: str, model: str = "qwen3-0.6b") -> None:
    lm = build_model(model)
    trace, policy = load_jsonl(trace_path), policies.make(**json.loads(setting))
    engine = RealEngine(lm)
    engine.run(warmup_trace(trace), policy)  # as a confirm's worker does
    marks = [(0, faults())]
    run = engine.run(trace, policy, on_call=lambda state: marks.append((len(state.log.calls), faults())))
    row_pages = kv_bytes_per_token(lm.config, lm.dtype) / resource.getpagesize()
    print(f"{'calls':14s} {'batch':>5s} {'written':>7s} {'fresh':>6s} {'faults':>7s} {'as rows':>7s} {'ms':>7s}")
    for (n0, f0), (n1, f1) in zip(marks, marks[1:]):
        group = run.log.calls[n0:n1]
        written = sum(c.written for c in group)
        if written or f1 - f0 > 2000:
            print(f"{'+'.join(call_kind(c) for c in group):14s} {max(len(c.contexts) for c in group):5d} "
                  f"{written:7d} {sum(c.fresh for c in group):6d} {f1 - f0:7d} {(f1 - f0) / row_pages:7.0f} "
                  f"{1e3 * sum(c.end - c.start for c in group):7.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])

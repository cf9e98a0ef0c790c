"""One timed run in a fresh process: `python -m calibrate.measure.worker SPEC.json OUT.json`.

The measurement protocol wants every (setting, repeat) in its own process, so no run inherits
another's allocator, caches or warmed-up kernels. The spec names the model, the trace file and the
setting; the result (event log, greedy tokens, host) is written atomically.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx

import policies
from calibrate.engine.executor import RealEngine
from calibrate.engine.model import build_as_profiled
from calibrate.host.machine import host_info
from calibrate.measure.speed_probe import Probe
from sim.core.files import atomic_write_json
from sim.cost.profile import cost_model
from traces.trace import Request, Trace, load_jsonl


def warmup_trace(trace: Trace, n: int = 2, outputs: int = 4, prompt: int = 64) -> Trace:
    """The first requests of the trace, cut short: every step function runs a few times untimed."""
    reqs = []
    for r in trace.requests[:n]:
        p = min(r.prompt_len, prompt)
        ids = None if r.prompt_ids is None else r.prompt_ids[:p]
        reqs.append(Request(r.id, 0.0, p, min(r.output_len, outputs), ids, prefilled=r.prefilled, cls=r.cls,
                            ttft_slo_ms=r.ttft_slo_ms))
    return Trace(reqs, {"source": "warmup"})


WARMUPS = ("trace", "short")  # what a warm-up pass serves: the trace itself, or its start cut short


def warmup_of(trace: Trace, kind: str = "short") -> Trace:
    """What a run's warm-up serves (`WARMUPS`). "trace": the trace itself, so the timed run finds
    the process as a server already serving this traffic leaves it (its heap grown to what this
    traffic needs: `sim.engine.heap`); "short": `warmup_trace`, a process that has just started."""
    if kind not in WARMUPS:
        raise ValueError(f"unknown warm-up {kind!r}; known: {', '.join(WARMUPS)}")
    return trace if kind == "trace" else warmup_trace(trace)


def warmed_with(report: dict) -> tuple[int, str]:
    """A confirm report's warm-up: its passes and what they served (`warmup_of`); reports from
    before `--warmup-with` warmed up short."""
    protocol = report.get("protocol") or {}
    return protocol.get("warmup", 1), protocol.get("warmup_with", "short")


def run_spec(spec: dict) -> dict:
    """The spec's run: `engine` "pdsim" (the default: pdsim's executor runs the setting's policy)
    or "mlx-lm" (the installed BatchGenerator itself, `calibrate.engine.batchgen`), after the warm-ups."""
    lm = build_as_profiled(spec["model"])
    trace = load_jsonl(spec["trace_path"])
    if spec.get("engine", "pdsim") == "mlx-lm":
        return _run_batch_generator(lm, trace, spec)
    # the device's KV capacity as the profile gives it, so both executors enforce the same limit
    engine, probe = RealEngine(lm, kv_capacity=spec.get("kv_capacity")), Probe(lm, spec.get("probe"))
    # an auto:MS budget prices its chunks with the profile confirm was given, as the simulator does
    cost = cost_model({"cost": spec["cost"]}) if "cost" in spec else None
    policy = policies.make(**spec["setting"], cost=cost)
    probe.run()  # before the warm-up: the run finds the heap as the warm-up left it (`sim.engine.heap`)
    for _ in range(spec.get("warmup", 1)):
        engine.run(warmup_of(trace, spec.get("warmup_with", "short")), policy)
    t0 = time.perf_counter()
    run = engine.run(trace, policy)
    wall = time.perf_counter() - t0
    probe.run()
    return {"log": run.log.to_dict(), "outputs": run.outputs, "idle_s": run.idle_s,
            "wall_s": wall, "host": host_info(), "setting": spec["setting"], "probe": probe.result(),
            "trace_sha256": trace.sha256(), "warmup": spec.get("warmup", 1),
            "warmup_with": spec.get("warmup_with", "short")}  # what was measured, to resume by


def _run_batch_generator(lm, trace: Trace, spec: dict) -> dict:
    from calibrate.engine.batchgen import run_batch_generator
    from calibrate.engine.mlxlm_batches import installed_version
    heap, checks, probe = None, [], Probe(lm, spec.get("probe"))
    probe.run()  # before the warm-up, as pdsim's
    for _ in range(spec.get("warmup", 1)):  # the warm-ups' calls are checked too, not kept (as pdsim's)
        _, check, heap = run_batch_generator(lm, warmup_of(trace, spec.get("warmup_with", "short")),
                                             spec["setting"], heap)
        checks.append(check)
    t0 = time.perf_counter()
    run, check, _ = run_batch_generator(lm, trace, spec["setting"], heap, pipelined=spec.get("pipelined", False))
    wall = time.perf_counter() - t0
    probe.run()
    checks.append(check)
    return {"log": run.log.to_dict(), "outputs": run.outputs, "idle_s": run.idle_s,
            "wall_s": wall, "host": host_info(), "setting": spec["setting"], "probe": probe.result(),
            "engine": {"name": "mlx-lm", "version": installed_version()},
            "check": {"policy_mismatches": [m for c in checks for m in c.policy_mismatches],
                      "shape_mismatches": [m for c in checks for m in c.shape_mismatches]}}


class RunFailed(RuntimeError):
    """A fresh-process run exited with an error; the message is its last line."""


def run_fresh(spec: dict, out: Path) -> dict:
    """`run_spec` in a new Python process (the protocol: no run inherits another's allocator,
    buffers or warm kernels); the result is also left in `out`. This process hands its MLX buffer
    cache back first: on unified memory a parent's cached buffers are the timed run's memory too."""
    mx.clear_cache()
    spec_path = out.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, "-m", "calibrate.measure.worker", str(spec_path), str(out)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RunFailed((p.stderr.strip().splitlines() or ["(no output)"])[-1])
    spec_path.unlink()
    return json.loads(out.read_text())


def main() -> int:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    atomic_write_json(out_path, run_spec(spec), overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

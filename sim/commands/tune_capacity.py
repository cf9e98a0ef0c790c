"""`pdsim tune`'s question for pdsim's engine and vLLM's scheduler: which setting serves the most
traffic while the SLOs hold, answered by `pdsim capacity` on the profile, then confirmed on the
real engine at the pick's capacity.

Both SLOs come from the calibration, so that chunked settings compete: tokens may wait at most a
decode step and a chunk midway between the grid's middle budget and the next (a whole long prompt
breaks it, a chunked one need not), and the first token at most ten times the prefill of the
trace's longest prompt. The gap target sits between two budgets, not on one: a setting whose own
step is the target has a p95 gap that creeps towards it with the rate (chunked/b32 on the
calibration of 2026-12-07: 1,000 ms at 1/14 of its capacity, 1,101 at it, 1,134 at 1.4x), so its
capacity would be where a flat curve crosses, which machine noise moves. With the margin, the
pick's capacity is set by the TTFT target, which rises steeply near saturation (13.1 s at 0.73x,
19.5 s at the capacity, 21.2 s at 1.06x), so the SLOs break above it as they should (on the real
engine at 1.3x: 21.2 s predicted, 21.9 measured, docs/results.md). A user's own `--slo` replaces them.
"""
from __future__ import annotations

import shlex
from pathlib import Path

from sim.sweep.capacity import DEFAULT_RANGE

# Traffic per device kind: a gamma stream (burstiness 1/2) whose rate the search scales, at first
# the rate one request at a time would serve (`base_rate`): the search's range then brackets it.
TRAFFIC = {
    "cpu": {"num_requests": 24, "burstiness": 0.5, "min_in": 16, "max_in": 128, "min_out": 8, "max_out": 16, "seed": 7},
    "gpu": {"num_requests": 200, "burstiness": 0.5, "min_in": 64, "max_in": 1024, "min_out": 32, "max_out": 256,
            "seed": 7},
}
BUDGETS = {"cpu": [8, 16, 32, 64, 128], "gpu": [32, 64, 128, 256, 512, 1024]}
# Within the device kind's quick grid (`calibrate.measure.grid.QUICK_FOR`: vLLM's forwards of up to 4
# decode rows on a CPU, 64 on a GPU, beside up to 211 and 1,024 prompt tokens), so no pick rests on
# extrapolation (tests/test_presets_in_grid.py).
VLLM_GRID = {"cpu": {"max_num_batched_tokens": [16, 32, 64, 128, 256], "max_num_seqs": [2, 4]},
             "gpu": {"max_num_batched_tokens": [128, 256, 512, 1024], "max_num_seqs": [16, 32, 64]}}
BATCH_SIZE = 4


def default_slos(cost, kind: str) -> list[str]:
    """p95 decode gap <= a full-batch decode step (context 128) and a chunk midway between the
    middle budget and the next; p99 TTFT <= 10x the prefill of the longest prompt."""
    budgets, traffic = BUDGETS[kind], TRAFFIC[kind]
    middle = len(budgets) // 2
    chunk = (budgets[middle] + budgets[middle + 1]) // 2
    gap = cost.decode([128] * BATCH_SIZE) + cost.prefill(chunk, traffic["min_in"])
    ttft = 10 * (cost.prefill(traffic["max_in"], 0) + cost.decode([traffic["max_in"]] * BATCH_SIZE))
    return [f"decode_gap_p95_ms<={gap * 1e3:.0f}", f"p99_ttft_ms<={ttft * 1e3:.0f}"]


def base_rate(cost, kind: str) -> float:
    """Requests per second one request at a time serves: a mean prompt's prefill, then its mean
    outputs' decodes, on the profile."""
    t = TRAFFIC[kind]
    prompt, outputs = (t["min_in"] + t["max_in"]) // 2, (t["min_out"] + t["max_out"]) / 2
    return 1.0 / (cost.prefill(prompt, 0) + outputs * cost.decode([prompt]))


def settings_for(engine: str, kind: str) -> list[dict]:
    from policies.settings import grid_settings
    if engine == "vllm":
        g = VLLM_GRID[kind]
        return grid_settings(["vllm"], max_num_batched_tokens=g["max_num_batched_tokens"], max_num_seqs=g["max_num_seqs"])
    return grid_settings(["fifo", "eager", "chunked"], BUDGETS[kind], [BATCH_SIZE])


def constraints_of(slo: list[str]) -> tuple[str, ...]:
    """The `METRIC<=X` items of `--slo`, which the confirm checks on the real engine (a per-request
    goodput target, `ttft:2000`, is the sweep's alone)."""
    from sim.sweep.pick import split_slo
    return tuple(str(c) for c in split_slo(slo)[1])


def above_command(pick: dict, best: dict, slo: list[str], profile: Path, out: Path) -> str:
    """The confirm of the pick at 1.3x its capacity (the trace tune saved, sped up), checking the SLOs."""
    options = ",".join(f"{k}={v}" for k, v in pick.items() if k != "policy" and v is not None)
    return shlex.join(["pdsim", "confirm", "--profile", str(profile), "--trace", str(out / "trace.jsonl"),
                       "--speed", f"{best['capacity_scale'] * 1.3:.6g}", "--setting", f"{pick['policy']}:{options}",
                       "--slo", *constraints_of(slo), "-o", str(out / "confirm-above.json")])


def tune_capacity(args, prof: dict, profile: Path, out: Path, host: dict) -> int:
    """Steps 2-4: the capacity search, the confirm of the pick (and eager, pdsim's baseline) at the
    pick's capacity, the report; for vLLM, the flags to serve it with."""
    from calibrate.confirm.protocol import confirm
    from policies.settings import setting, setting_label
    from policies.vllm import server_flags
    from sim.commands import capacity as capacity_cmd
    from sim.commands import confirm as confirm_cmd
    from sim.commands import report as report_cmd
    from sim.core.files import atomic_write_text, dumps, jsonable
    from sim.cost.profile import cost_model
    from sim.report import make_report
    from sim.sweep.capacity import CapacityError, curve, mean_rate, search
    from sim.sweep.results import SweepPlan
    from sim.sweep.run import scale_rate
    from traces.generators import gamma

    kind = host["kind"]
    trace = gamma(rate=round(base_rate(cost_model(prof), kind), 4), **TRAFFIC[kind])
    trace.save_jsonl(out / "trace.jsonl")
    slo = args.slo or default_slos(cost_model(prof), kind)
    settings = settings_for(args.engine, kind)
    plan = SweepPlan({"trace": trace}, settings, prof, slo=slo)
    inputs = plan.inputs()
    rate = mean_rate(trace)
    print(f"wrote {out / 'trace.jsonl'}: {len(trace)} requests, {rate:.3g} requests/s, sha256 {trace.sha256()}")
    print(f"\n[2/4] capacity of {len(settings)} settings under {' and '.join(slo)}: the most traffic each serves")
    try:
        found = search(settings, "trace", inputs, plan.constraints, DEFAULT_RANGE, progress=False)
    except CapacityError as e:
        print(f"no answer: {e}")
        return 1
    result = capacity_cmd.summary(found, "trace", inputs, plan.constraints)
    from sim.core.table import table
    print(table(result["settings"], ["label", "capacity_req_s", "breaks_at_req_s", "slo_margin"]))
    print(result["why"])
    (out / "capacity").mkdir(exist_ok=True)
    curve(found, "trace", inputs).to_csv(out / "capacity" / "curve.csv", index=False)
    atomic_write_text(out / "capacity" / "capacity.json", dumps(jsonable({"pdsim_capacity": 1, "slo": slo, **result}),
                                                                indent=1) + "\n")
    if result["pick"] is None:
        print("no setting meets the SLOs at any rate searched; pass looser --slo targets")
        return 1
    best = result["settings"][0]
    pick = setting({k: best[k] for k in ("policy", "budget", "batch_size", "decode", "order", "max_num_batched_tokens",
                                         "max_num_seqs", "long_prefill_token_threshold") if k in best})
    baseline = setting({"policy": "eager", "batch_size": BATCH_SIZE})
    chosen = [pick] + ([baseline] if pick != baseline else [])
    at = scale_rate(trace, best["capacity_scale"])
    print(f"\n[3/4] confirm {setting_label(pick)}" + (" and eager" if len(chosen) > 1 else "")
          + f" on the real engine at the pick's capacity, {best['capacity_req_s']:.3g} requests/s")
    report_path = out / "confirm.json"
    report = confirm(prof, at, chosen, report_path, args.repeats, slo=constraints_of(slo))
    if code := confirm_cmd.print_report(report, str(report_path), None):
        return code
    print("\n[4/4] report")
    doc = make_report(out / "report", None, report_path, profile, capacity_dir=out / "capacity")
    report_cmd.print_written(doc, out / "report")
    print(f"\nto see the SLOs break above the pick's capacity (1.3x it):\n  {above_command(pick, best, slo, profile, out)}")
    if args.engine == "vllm":
        print(f"\nserve it with: vllm serve MODEL {server_flags(pick)}")
    return 0

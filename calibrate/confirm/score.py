"""A confirm's scoring: each setting's measured runs against the prediction, metric by metric
(relative error of the median over runs), call kind by call kind (`sim.metrics.residuals`), and
at the speed the machine ran at around each run (`calibrate.measure.speed_probe`)."""
from __future__ import annotations

import math
import statistics
from functools import partial

import policies
from calibrate.measure.engine_runs import relogged
from calibrate.measure.speed_probe import (
    SETTING,
    memory_speed,
    page_price,
    positional_speed,
    probe_speed,
    reference_probes,
    timed_speed,
)
from calibrate.measure.worker import warmup_of
from policies.settings import setting_label
from sim.core.files import jsonable
from sim.cost.model import CostModel
from sim.cost.noise import CallNoise
from sim.cost.profile import cost_model
from sim.cost.speed import MachineSpeed, SpeedRules
from sim.engine.log import EventLog
from sim.metrics.decisions import paths_of
from sim.metrics.registry import CONFIRMED, CONFIRMED_KV
from sim.metrics.residuals import call_ratios, off_stretches, residual_table
from sim.metrics.scoring import CLASS_CONFIRMED, log_class_metrics, score
from sim.predict import REPLICAS, classes_of, metrics_of, replays
from sim.sweep.pick import OPS, Constraint, Objective, PickError, check_names, split_slo
from traces.trace import Trace


def compare(prof: dict, trace: Trace, settings: list[dict], runs: list[dict], stall_ms: float = 100.0,
            replicas: int = REPLICAS, warmup: int = 1, warmup_with: str = "short",
            slo: tuple[str, ...] = ()) -> list[dict]:
    """Predicted (simulator; with the profile's call noise, the median and range over `replicas`
    replays, `sim.predict`) against measured (median, min, max over repeats), per setting and
    metric; and per call kind (and size bucket), predicted/measured over the setting's runs; and
    for each run, the replays that took its path and where the one at typical times left it
    (`sim.metrics.decisions`): a tail can miss by the path, not by the prices.

    Where the runs carry speed probes (`calibrate.measure.speed_probe`), the prediction is made at the
    machine's speed around them (prefill and decode apart, each the median over runs,
    `probed_speed`), moved part of the way by the profile's `sim.cost.speed.SpeedRules`
    (`predicted_at`; decodes then faster, where pdsim's probes read them), and the
    one at the calibration's speed is kept beside it (`at_calibration_speed`): how much of a miss
    the machine's drift made. `warmup`, `warmup_with`: what each run's process served untimed
    first (`calibrate.measure.worker.warmup_of`); the prediction serves it too. `slo`: constraints
    (`METRIC<=X`) whose metrics are scored too, and whether each holds, predicted and measured."""
    constraints = slo_constraints(slo)
    cost, noise = cost_model(prof), CallNoise.from_json(prof.get("fit", {}).get("noise"))
    reference, results = reference_probes(prof), []
    page = page_price(runs, prof.get("fit", {}).get("page_fault_s"))
    for s in settings:
        label = setting_label(s)
        # the worker served a warm-up first, in the same process: predict that process
        warm = warmup_of(trace, warmup_with) if warmup else None
        policy = partial(policies.make, **s, cost=cost)  # a fresh policy per replay
        mine = [r for r in runs if r["label"] == label]
        probes = [probed_speed(r, cost, reference) for r in mine]
        known = [p for p in probes if p]
        memory = [p["memory"] for p in known if p.get("memory")]
        probed = MachineSpeed(statistics.median(p["prefill"] for p in known),
                              statistics.median(p["decode"] for p in known), page) if known else MachineSpeed()
        # runs in a trace-warmed process decode faster than pdsim's probes say (`SpeedRules.run_decode`)
        pdsim_probes = bool(known) and all(r["probe"]["setting"] == SETTING for r in mine if r.get("probe"))
        speed = probed.partway(SpeedRules.of(prof), pdsim_probes)
        predictions, noisy = replays(trace, policy, cost, noise, replicas, warm, speed)  # made once, read twice
        predicted, spread = metrics_of(predictions, noisy, stall_ms)
        at_calibration = metrics_of(*replays(trace, policy, cost, noise, replicas, warm), stall_ms)[0] \
            if known else predicted
        logs = [relogged(trace, r["log"], s, cost, cost.kv_bytes, warmup_with if warmup else None, cost.heap_groups,
                         cost.state_tokens) for r in mine]
        typical = replays(trace, policy, cost, None, 0, warm, speed)[0][0] if noisy else predictions[0]
        for r, log in zip(mine, logs):
            r["metrics"] = score(log, stall_ms=stall_ms)
        measured, errors, errors_at_calibration = {}, {}, {}
        kv = CONFIRMED_KV if s.get("kv_limit") is not None else ()
        for k in dict.fromkeys(CONFIRMED + kv + tuple(c.metric for c in constraints)):
            vals = [r["metrics"].get(k, math.nan) for r in mine]
            vals = [v for v in vals if not math.isnan(v)]
            if not vals or math.isnan(predicted.get(k, math.nan)):
                continue
            med = statistics.median(vals)
            measured[k] = {"median": med, "min": min(vals), "max": max(vals)}
            errors[k] = relative_error(predicted[k], med)
            if not math.isnan(at_calibration.get(k, math.nan)):
                errors_at_calibration[k] = relative_error(at_calibration[k], med)
        results.append({"label": label, "setting": s, "predicted": {k: predicted[k] for k in measured},
                        "predicted_range": {k: list(spread[k]) for k in measured if k in spread},
                        "measured": measured, "rel_error": errors,
                        "machine_speed": {"median": probed.to_json() if known else None,
                                          "memory": statistics.median(memory) if memory else None,
                                          "predicted_at": speed.to_json() if known else None,
                                          "runs": [dict(p or {}, repeat=r["repeat"]) for r, p in zip(mine, probes)]},
                        "at_calibration_speed": {"predicted": {k: at_calibration[k] for k in errors_at_calibration},
                                                 "rel_error": errors_at_calibration},
                        "run_speed": [{"repeat": r["repeat"], "pred_over_meas": run_speed(log, cost),
                                       "off_stretches": off_stretches(log, cost)} for r, log in zip(mine, logs)],
                        "calls": call_rows(logs, cost), "calls_by_kind": call_rows(logs, cost, by_size=False),
                        "paths": jsonable(paths_of(logs, [r["repeat"] for r in mine], predictions, typical)),
                        **({"slo": slo_verdicts(constraints, predicted, measured)} if constraints else {}),
                        **compare_classes(trace, classes_of(trace, predictions), logs)})
    return results


def slo_constraints(slo: tuple[str, ...] | list[str]) -> list[Constraint]:
    """`METRIC<=X` constraints a confirm checks (`pdsim confirm --slo`), each on a known metric; a
    per-request goodput target (`ttft:2000`) is refused: a confirm scores metrics, not requests."""
    goodput, constraints = split_slo(list(slo))
    if goodput:
        raise PickError(f"--slo {goodput[0]}: a confirm checks METRIC<=X constraints (e.g. p99_ttft_ms<=2000)")
    check_names(constraints, Objective(), None, False, columns=())
    return constraints


def slo_verdicts(constraints: list[Constraint], predicted: dict, measured: dict) -> list[dict]:
    """Each constraint's metric predicted and measured (median over runs), and whether it holds in each:
    the capacity question asked of the real engine (`pdsim capacity`, then a confirm at its rate)."""
    rows = []
    for c in constraints:
        m = measured.get(c.metric, {}).get("median")
        p = predicted[c.metric] if m is not None else None  # a metric a run cannot score: neither (strict JSON)
        holds = lambda v: v is not None and math.isfinite(v) and bool(OPS[c.op](v, c.bound))
        rows.append({"slo": str(c), "predicted": p, "measured": m, "holds_predicted": holds(p),
                     "holds_measured": holds(m), "as_predicted": holds(p) == holds(m)})
    return rows


def probed_speed(run: dict, cost: CostModel, reference: list[dict] = ()) -> dict | None:
    """The machine's speed around one run, from its probes (`calibrate.measure.speed_probe`): prefill and
    decode over both probes, and each probe's alone (`before`, `after`). Read, in this order, by
    the first that can: each probe timed against the calibration's probes in its own place
    (`positional_speed`), priced by the profile (`probe_speed`), timed against all of the
    calibration's probes (`timed_speed`); `method` says which. `priced` and `timed`: those
    readings beside it. `memory`: fresh memory's speed against the calibration's
    (`memory_speed`; reported, not predicted at). None for a run without probes (measured before
    them) or a profile that can do none."""
    probe = run.get("probe")
    if not probe or not probe.get("logs"):
        return None
    logs = probe_logs(probe)
    places = [probe_logs(p) for p in reference if p["setting"] == probe["setting"] and p["trace"] == probe["trace"]]
    then = [log for ls in places for log in ls]
    placed, priced, timed = positional_speed(logs, places), probe_speed(logs, cost), timed_speed(logs, then)
    if placed:
        method, before, after = "positional", timed_speed(logs[:1], [ls[0] for ls in places]), \
            timed_speed(logs[-1:], [ls[-1] for ls in places])
    elif priced or timed:
        method = "priced" if priced else "timed"
        read = (lambda ls: probe_speed(ls, cost)) if priced else (lambda ls: timed_speed(ls, then))
        before, after = read(logs[:1]), read(logs[-1:])
    else:
        return None
    return {**(placed or priced or timed).to_json(), "method": method, "priced": priced and priced.to_json(),
            "timed": timed and timed.to_json(), "before": before and before.to_json(),
            "after": after and after.to_json(), "memory": memory_speed([probe], reference)}


def probe_logs(probe: dict) -> list[EventLog]:
    trace = Trace.from_dicts(probe["trace"]["requests"], probe["trace"]["meta"], source="speed probe")
    return [relogged(trace, log, probe["setting"]) for log in probe["logs"]]


def run_speed(log: EventLog, cost: CostModel) -> float | None:
    """The median over a run's calls of predicted/measured: how fast the machine ran this run
    against the calibration (every call kind moves together when the machine changes speed
    between processes, 10-20% on a shared VM; a call kind the model prices wrong stands apart)."""
    ratios = [r for _, _, r in call_ratios([log], cost)]
    return statistics.median(ratios) if ratios else None


def compare_classes(trace: Trace, predicted: dict[str, dict] | None, logs: list[EventLog]) -> dict:
    """Per priority class (`sim.metrics.scoring.class_metrics`): predicted (`sim.predict.classes_of`)
    against measured (median, min, max over repeats) of `CLASS_CONFIRMED`; {} for a trace without classes."""
    if predicted is None:
        return {}
    runs = [log_class_metrics(trace, log) for log in logs]
    out = {}
    for cls, pred in predicted.items():
        row = {"requests": pred["requests"], "ttft_target_ms": pred["ttft_target_ms"], "predicted": {},
               "measured": {}, "rel_error": {}}
        for k in CLASS_CONFIRMED:
            vals = [r[cls][k] for r in runs if not math.isnan(r[cls][k])]
            if not vals or math.isnan(pred[k]):
                continue
            med = statistics.median(vals)
            row["predicted"][k] = pred[k]
            row["measured"][k] = {"median": med, "min": min(vals), "max": max(vals)}
            row["rel_error"][k] = relative_error(pred[k], med)
        out[cls] = row
    return {"classes": jsonable(out)}


def call_rows(logs: list[EventLog], cost: CostModel, by_size: bool = True) -> list[dict]:
    """`residual_table` of the measured runs: a miss in a run metric, located call by call
    (non-finite numbers as None, as the report file holds them)."""
    return jsonable(residual_table(logs, cost, by_size))


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured; signed, so the direction of a miss is visible."""
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return (predicted - measured) / abs(measured)

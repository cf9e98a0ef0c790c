"""Data frames for the charts: aggregated first (quantiles, a window of requests), so a chart of a
20,000-request replay stays small."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd

from policies.budget import auto_target
from policies.settings import KEYS, variant_label
from sim.engine.log import EventLog
from sim.engine.memory import attention_layers
from sim.metrics import registry
from sim.metrics.scoring import decode_gaps
from sim.report.sources import LogSeries, ReportError


def budget_label(b) -> str:
    if isinstance(b, str):  # auto:MS (or a number read back from a CSV cell)
        return b
    return "whole prompt" if b is None or (isinstance(b, float) and math.isnan(b)) else str(int(b))


def budget_order(labels) -> list[str]:
    """Fixed budgets by size, then auto:MS ones by target, then whole prompts."""
    def key(s: str):
        auto = auto_target(s)
        return (s == "whole prompt", auto is not None, auto or (int(s) if s.isdigit() else 0))
    return sorted(set(labels), key=key)


def group_name(row) -> str:
    parts = []
    if "trace" in row and row["trace"] is not None:
        parts.append(str(row["trace"]))
    if "rate_scale" in row and row["rate_scale"] is not None:
        parts.append(f"rate x{row['rate_scale']:g}")
    return ", ".join(parts) or "all"


def pick_marks(picks) -> tuple[set, set]:
    """(picked, front) as (group name, label) pairs, from `sim.sweep.pick.Pick`s or their JSON form."""
    picked, front = set(), set()
    for pk in picks:
        if isinstance(pk, dict):
            group, best, labels = pk.get("group", {}), pk.get("best"), pk.get("front", [])
        else:
            group, best, labels = pk.group, None if pk.best is None else pk.best["label"], list(pk.front["label"])
        g = group_name(group)
        if best:
            picked.add((g, best))
        front |= {(g, lab) for lab in labels}
    return picked, front


def tradeoff_frame(df: pd.DataFrame, latency: str, throughput: str, picked: set[tuple[str, str]] = frozenset(),
                   front: set[tuple[str, str]] = frozenset()) -> pd.DataFrame:
    """One row per setting: its latency and throughput, budget, policy, front and pick marks.

    `picked` and `front` hold (group name, label) pairs.
    """
    for col in (latency, throughput):
        if col not in df.columns:
            raise ReportError(f"sweep results have no column {col!r}")
    out = pd.DataFrame({
        "group": [group_name(r) for _, r in df.iterrows()],
        "label": df["label"], "policy": df["policy"],
        "budget": [budget_label(b) for b in df["budget"]],
        "latency": pd.to_numeric(df[latency], errors="coerce"),
        "throughput": pd.to_numeric(df[throughput], errors="coerce")})
    out["front"] = [(g, lab) in front for g, lab in zip(out["group"], out["label"])]
    out["picked"] = [(g, lab) in picked for g, lab in zip(out["group"], out["label"])]
    return out[np.isfinite(out["latency"]) & np.isfinite(out["throughput"])]


def _setting_of(row) -> dict:
    return {k: (None if isinstance(row.get(k), float) and math.isnan(row.get(k)) else row.get(k))
            for k in KEYS if k in row}


def gap_percentile_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Long form: per setting, each gap percentile the sweep recorded (`metric_registry.GAP_CHART`).

    `variant` is the rest of the setting (batch size, decode mode, order): a chart by budget draws
    one line per statistic and variant, never one line through two settings at the same budget."""
    rows = []
    metrics = registry.gap_chart_metrics()
    for _, r in df.iterrows():
        variant = variant_label(_setting_of(r)) or r["policy"]  # fifo: nothing besides the policy
        for m in metrics:
            v = r.get(m.name)
            if v is None or not np.isfinite(v) or v <= 0:
                continue
            rows.append({"group": group_name(r), "policy": r["policy"], "budget": budget_label(r["budget"]),
                         "variant": variant, "label": r["label"], "family": m.family, "statistic": m.statistic,
                         "ms": float(v)})
    return pd.DataFrame(rows)


def log_gaps(log: EventLog) -> dict[str, np.ndarray]:
    """Inter-token gaps pooled over requests, and decode-completion gaps, in milliseconds."""
    per = [np.diff(np.asarray(t, float)) for t in log.tokens.values() if len(t) > 1]
    itl = np.concatenate(per) * 1e3 if per else np.zeros(0)
    return {"inter-token gap": itl, "decode-completion gap": decode_gaps(log) * 1e3}


def trace_names(series: list[LogSeries]) -> dict[str, str]:
    """One display name per trace identity (its SHA-256 where known, else its name), told apart by
    the hash's first characters where two traces share a name."""
    first: dict[str, str] = {}
    for s in series:
        first.setdefault(s.trace_sha256 or s.trace, s.trace or "?")
    counts = Counter(first.values())
    return {k: f"{n} ({k[:8]})" if counts[n] > 1 else n for k, n in first.items()}


def ecdf_frame(series: list[LogSeries], points: int = 101) -> pd.DataFrame:
    """Each series' gap distribution as `points` quantiles, plus a finer tail (the stalls live in the
    last percent): a few hundred rows for any log size. `trace` names the run's trace."""
    q = np.unique(np.concatenate([np.linspace(0, 1, points), 1 - np.logspace(-4, -2, 7)]))
    names = trace_names(series)
    rows = []
    for s in series:
        for family, gaps in log_gaps(s.log).items():
            gaps = gaps[gaps > 0]
            if not len(gaps):
                continue
            for qi, v in zip(q, np.quantile(gaps, q)):
                rows.append({"series": f"{s.label} ({s.source})", "label": s.label, "policy": s.policy,
                             "source": s.source, "trace": names[s.trace_sha256 or s.trace], "family": family,
                             "ms": float(v),
                             "fraction": float(qi), "n": int(len(gaps))})
    return pd.DataFrame(rows)


def timeline_frame(log: EventLog, max_requests: int = 16, max_marks: int = 4000) -> pd.DataFrame:
    """Per-request bars for every prefill chunk and decode call of the first requests to arrive.

    Requests are taken in arrival order while the bars stay under `max_marks`, so a chart of a long
    trace shows its beginning in full rather than all of it unreadably.
    """
    order = sorted(log.requests.values(), key=lambda r: (r.arrival, r.rid))
    chosen, marks = {}, 0
    for r in order:
        n = r.output_len + 4  # its decodes, and a few prefill chunks
        if len(chosen) >= max_requests or (chosen and marks + n > max_marks):
            break
        chosen[r.rid] = len(chosen)
        marks += n
    rows = []
    done_by = max((log.tokens[rid][-1] for rid in chosen if log.tokens.get(rid)), default=math.inf)
    for c in log.calls:
        if c.start > done_by:
            break
        for rid in c.rids:
            if rid in chosen:
                rows.append({"request": rid, "order": chosen[rid], "kind": f"{c.kind}",
                             "start": c.start, "end": max(c.end, c.start), "tokens": c.tokens,
                             "prefix": c.prefix, "call": c.iteration})
        if len(rows) > max_marks:
            break
    for rid, k in chosen.items():
        info = log.requests[rid]
        rows.append({"request": rid, "order": k, "kind": "arrival", "start": info.arrival, "end": info.arrival,
                     "tokens": info.prompt_len, "prefix": 0, "call": -1})
    return pd.DataFrame(rows)


def confirm_frame(doc: dict, metrics: list[str] | None = None) -> pd.DataFrame:
    """Predicted vs measured (median, min, max) and relative error, per setting and metric; with the
    runs' probed machine speed and the error at the calibration's speed where the report has them."""
    rows = []
    for r in doc["results"]:
        for m, pred in r["predicted"].items():
            meas = r["measured"].get(m)
            if not isinstance(meas, dict) or pred is None or meas.get("median") is None:
                continue
            rel = (r.get("rel_error") or {}).get(m)  # confirm's convention: (predicted - measured) / measured
            if rel is None and meas["median"]:
                rel = (pred - meas["median"]) / abs(meas["median"])
            # reports since speed probes: the error of the prediction at the calibration's speed, and the probed speed
            drift = (r.get("at_calibration_speed") or {}).get("rel_error", {}).get(m)
            ms = r.get("machine_speed") or {}
            speed = ms.get("predicted_at") or ms.get("median")  # the speed predicted at; older reports: the median
            rows.append({"label": r["label"], "metric": m, "predicted": float(pred), "measured": float(meas["median"]),
                         "min": float(meas.get("min", meas["median"])), "max": float(meas.get("max", meas["median"])),
                         "rel_error": None if rel is None else float(rel),
                         **{f"{k}_speed": (speed or {}).get(k) for k in ("prefill", "decode")},
                         "rel_error_at_calibration_speed": None if drift is None else float(drift)})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["metric"] = df["metric"].map(registry.canonical)  # reports written under earlier names
    wanted = metrics or [m for m in registry.CONFIRM_CHART if m in set(df["metric"])] or sorted(set(df["metric"]))[:9]
    df = df[df["metric"].isin(wanted)]
    return df[np.isfinite(df["predicted"]) & np.isfinite(df["measured"])]


def call_frame(doc: dict) -> pd.DataFrame:
    """Predicted/measured per call kind and size bucket of every confirmed setting; empty for a report
    written before confirm kept them."""
    rows = [{"setting": r["label"], "kind": c["kind"], "size": c["size"], "calls": c["calls"],
             "median": c["ratio_median"], "p10": c["ratio_p10"], "p90": c["ratio_p90"],
             "faulted": c.get("faulted"), "faulted_median": c.get("faulted_ratio_median"),
             "fresh_rows": c.get("fresh_rows"), "faulted_rows": c.get("faulted_rows")}
            for r in doc["results"] for c in r.get("calls") or []]
    columns = ["setting", "kind", "size", "calls", "median", "p10", "p90"]
    if any(row["faulted"] is not None for row in rows):  # runs that counted page faults
        columns += ["faulted", "faulted_median"]
    if any(row["fresh_rows"] is not None for row in rows):  # and the rows of fresh memory
        columns += ["fresh_rows", "faulted_rows"]
    return pd.DataFrame(rows, columns=columns)


def path_frame(doc: dict) -> pd.DataFrame:
    """For each measured run of every confirmed setting: the replays that took its path, and where
    the replay at typical times parted from it (`sim.metrics.decisions`); empty for a report written before
    confirm compared paths."""
    rows = []
    for r in doc["results"]:
        paths = r.get("paths")
        for run in (paths or {}).get("runs", ()):
            p = run["parted"] or {}
            rows.append({"setting": r["label"], "run": run["repeat"],
                         "same_path": f"{run['same']} of {paths['replays']}",
                         "parted_at_s": p.get("at_s"), "engine": p.get("engine", ""), "replay": p.get("replay", ""),
                         "replay_ahead_s": p.get("replay_ahead_s"), "missed_most": p.get("missed", "")})
    return pd.DataFrame(rows, columns=["setting", "run", "same_path", "parted_at_s", "engine", "replay",
                                       "replay_ahead_s", "missed_most"])


def calibration_frame(profile: dict) -> pd.DataFrame:
    """Each timed step: measured median, fitted, relative error, and its shape."""
    samples = profile.get("samples") or []
    rows = []
    for s in samples:
        if s.get("seconds") is None or s.get("fitted") is None:
            continue
        step = s.get("step")
        size = s.get("chunk") if step == "prefill" else s.get("batch")
        rows.append({"step": step, "measured": float(s["seconds"]), "fitted": float(s["fitted"]),
                     "spread": float(s.get("spread") or 0.0), "held_out": "held out" if s.get("held_out") else "fit",
                     "size": size, "prefix": s.get("prefix", 0), "batch": s.get("batch"),
                     "context_sum": s.get("context_sum"),
                     "rel_error": float(s["fitted"]) / float(s["seconds"]) - 1 if s["seconds"] else None})
    return pd.DataFrame(rows)





def capacity_frame(curve: pd.DataFrame, slo: list[str]) -> pd.DataFrame:
    """Each SLO metric against the arrival rate, setting by setting (`pdsim capacity`'s runs), long
    form: label, rate, metric, value, bound."""
    from sim.sweep.pick import parse_constraint
    rows = []
    for c in map(parse_constraint, slo):
        if c.metric not in curve.columns:
            continue
        for _, r in curve.sort_values("rate_req_s").iterrows():
            v = r[c.metric]
            if pd.notna(v):
                rows.append({"label": r["label"], "rate": float(r["rate_req_s"]), "metric": c.metric, "value": float(v),
                             "bound": c.bound})
    return pd.DataFrame(rows, columns=["label", "rate", "metric", "value", "bound"])


def offset_frame(profiles: list[dict]) -> pd.DataFrame:
    """Each profile's measured prefill samples: a chunk's seconds against its offset (the tokens
    already cached), by model; only chunk sizes timed at two offsets or more say how cost grows."""
    rows = []
    for prof in profiles:
        name = prof["model"].get("name", "?")
        for s in prof.get("samples") or []:
            if s.get("step") == "prefill" and s.get("seconds") is not None:
                rows.append({"model": name, "chunk": int(s["chunk"]), "prefix": int(s.get("prefix", 0)),
                             "measured": float(s["seconds"]), "fitted": s.get("fitted")})
    frame = pd.DataFrame(rows, columns=["model", "chunk", "prefix", "measured", "fitted"])
    if frame.empty:
        return frame
    offsets = frame.groupby(["model", "chunk"])["prefix"].transform("nunique")
    return frame[offsets >= 2].sort_values(["model", "chunk", "prefix"]).reset_index(drop=True)


def offset_terms(profiles: list[dict], chunk: int = 64) -> list[dict]:
    """The fitted terms that say how a chunk's cost grows with its offset: the prefill form's
    c*L + d, per 1,000 tokens of offset for an L-token chunk (`sim.cost.model.LinearCostModel`)."""
    rows = []
    for prof in profiles:
        pf = prof["cost"]["prefill"]
        coef = list(pf["coef"]) + [0.0] * (4 - len(pf["coef"]))
        c, d = coef[2], coef[3]
        shapes = prof["model"].get("shapes") or {}
        rows.append({"model": prof["model"].get("name", "?"), "chunk": chunk,
                     "ms per 1k offset tokens": round((c * chunk + d) * 1e6, 3),
                     "layers": shapes.get("num_hidden_layers"), "attention layers": attention_layers(shapes)
                     if shapes.get("num_hidden_layers") else None})
    return rows


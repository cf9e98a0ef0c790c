"""Reports: altair charts of sweeps, confirmations, calibrations and single runs, as one HTML page.

The page carries the Vega JavaScript inline (from vl-convert), so it opens without a network; each
chart is also written as a PNG by the same renderer. Charts whose input was not given are skipped
with a note on the page and in report.json. Data going into a chart is aggregated first (quantiles,
a window of requests), so a chart of a 20,000-request replay stays small.
"""
from __future__ import annotations

import html
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

from sim.files import ExistsError, atomic_write_json, atomic_write_text, read_json_object
from sim.log import EventLog
from sim.metrics import decode_gaps

WIDTH, HEIGHT = 420, 260
PERCENTILES = {"inter-token gap": ["p50_itl_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms"],
               "decode-completion gap": ["decode_gap_p50_ms", "decode_gap_p95_ms", "decode_gap_max_ms"]}
CONFIRM_METRICS = ["decode_gap_p95_ms", "decode_gap_max_ms", "p95_itl_ms", "max_itl_ms", "p50_ttft_ms",
                   "p95_ttft_ms", "mean_tpot_ms", "output_tok_s", "makespan_s"]


class ReportError(ValueError):
    """An input the report cannot read; the message names the file and the problem."""


# --- inputs ------------------------------------------------------------------------------------

@dataclass
class LogSeries:
    """An event log to draw: where it came from and which setting produced it."""
    label: str
    policy: str
    source: str  # "simulated" or "measured"
    log: EventLog


@dataclass
class Sweep:
    df: pd.DataFrame
    doc: dict
    logs: list[LogSeries] = field(default_factory=list)


def _read_json(path: str | Path, what: str) -> dict:
    return read_json_object(path, what, ReportError)


def _log_of(d, where: str) -> EventLog:
    try:
        return EventLog.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{where}: not an event log ({type(e).__name__}: {e})") from None


def load_sweep(directory: str | Path) -> Sweep:
    """results.json of `pdsim sweep` (rows, inputs, picks) and any logs it saved."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ReportError(f"sweep {directory}: no such directory")
    doc = _read_json(directory / "results.json", "sweep results")
    if not isinstance(doc.get("rows"), list) or not doc["rows"]:
        raise ReportError(f"sweep results {directory / 'results.json'}: no rows")
    logs = []
    for entry in doc.get("logs", []):
        path = directory / entry["file"]
        if path.is_file():
            d = _read_json(path, "sweep log")
            logs.append(LogSeries(d["label"], d["setting"]["policy"], "simulated",
                                  _log_of(d["log"], str(path))))
    return Sweep(pd.DataFrame(doc["rows"]), doc, logs)


def load_confirm(path: str | Path) -> dict:
    """A `pdsim confirm` report: predicted vs measured per setting, and each run's log."""
    doc = _read_json(path, "confirm report")
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise ReportError(f"confirm report {path}: missing or empty 'results'")
    for i, r in enumerate(results):
        for key in ("label", "predicted", "measured"):
            if key not in r:
                raise ReportError(f"confirm report {path}: results[{i}] has no {key!r}")
    return doc


def load_simulate(path: str | Path) -> dict:
    """The JSON of `pdsim simulate --json-out`."""
    doc = _read_json(path, "simulate output")
    if "log" not in doc:
        raise ReportError(f"simulate output {path}: no 'log' (written by `pdsim simulate --json-out`?)")
    return doc


def confirm_logs(doc: dict) -> list[LogSeries]:
    """The first repeat of each confirmed setting: the measured run to draw."""
    seen, out = set(), []
    for i, run in enumerate(doc.get("runs", [])):
        if run.get("label") in seen or "log" not in run:
            continue
        seen.add(run["label"])
        policy = (run.get("setting") or {}).get("policy") or run["label"].split("/")[0]
        out.append(LogSeries(run["label"], policy, "measured", _log_of(run["log"], f"confirm runs[{i}]")))
    return out


# --- frames: what the charts draw --------------------------------------------------------------

def budget_label(b) -> str:
    return "whole prompt" if b is None or (isinstance(b, float) and math.isnan(b)) else str(int(b))


def _budget_order(labels) -> list[str]:
    return sorted(set(labels), key=lambda s: (s == "whole prompt", int(s) if s.isdigit() else 0))


def _group_name(row) -> str:
    parts = []
    if "trace" in row and row["trace"] is not None:
        parts.append(str(row["trace"]))
    if "rate_scale" in row and row["rate_scale"] is not None:
        parts.append(f"rate x{row['rate_scale']:g}")
    return ", ".join(parts) or "all"


def pick_marks(picks) -> tuple[set, set]:
    """(picked, front) as (group name, label) pairs, from `sim.pick.Pick`s or their JSON form."""
    picked, front = set(), set()
    for pk in picks:
        if isinstance(pk, dict):
            group, best, labels = pk.get("group", {}), pk.get("best"), pk.get("front", [])
        else:
            group, best, labels = pk.group, None if pk.best is None else pk.best["label"], list(pk.front["label"])
        g = _group_name(group)
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
        "group": [_group_name(r) for _, r in df.iterrows()],
        "label": df["label"], "policy": df["policy"],
        "budget": [budget_label(b) for b in df["budget"]],
        "latency": pd.to_numeric(df[latency], errors="coerce"),
        "throughput": pd.to_numeric(df[throughput], errors="coerce")})
    out["front"] = [(g, lab) in front for g, lab in zip(out["group"], out["label"])]
    out["picked"] = [(g, lab) in picked for g, lab in zip(out["group"], out["label"])]
    return out[np.isfinite(out["latency"]) & np.isfinite(out["throughput"])]


def gap_percentile_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Long form: per setting, each gap percentile the sweep recorded."""
    rows = []
    for _, r in df.iterrows():
        for family, cols in PERCENTILES.items():
            for col in cols:
                v = r.get(col)
                if v is None or not np.isfinite(v) or v <= 0:
                    continue
                stat = col.replace("_itl_ms", "").replace("decode_gap_", "").replace("_ms", "")
                rows.append({"group": _group_name(r), "policy": r["policy"], "budget": budget_label(r["budget"]),
                             "label": r["label"], "family": family, "statistic": stat, "ms": float(v)})
    return pd.DataFrame(rows)


def log_gaps(log: EventLog) -> dict[str, np.ndarray]:
    """Inter-token gaps pooled over requests, and decode-completion gaps, in milliseconds."""
    per = [np.diff(np.asarray(t, float)) for t in log.tokens.values() if len(t) > 1]
    itl = np.concatenate(per) * 1e3 if per else np.zeros(0)
    return {"inter-token gap": itl, "decode-completion gap": decode_gaps(log) * 1e3}


def ecdf_frame(series: list[LogSeries], points: int = 101) -> pd.DataFrame:
    """Each series' gap distribution as `points` quantiles, plus a finer tail (the stalls live in the
    last percent): a few hundred rows for any log size."""
    q = np.unique(np.concatenate([np.linspace(0, 1, points), 1 - np.logspace(-4, -2, 7)]))
    rows = []
    for s in series:
        for family, gaps in log_gaps(s.log).items():
            gaps = gaps[gaps > 0]
            if not len(gaps):
                continue
            for qi, v in zip(q, np.quantile(gaps, q)):
                rows.append({"series": f"{s.label} ({s.source})", "label": s.label, "policy": s.policy,
                             "source": s.source, "family": family, "ms": float(v), "fraction": float(qi),
                             "n": int(len(gaps))})
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
    """Predicted vs measured (median, min, max) and relative error, per setting and metric."""
    rows = []
    for r in doc["results"]:
        for m, pred in r["predicted"].items():
            meas = r["measured"].get(m)
            if not isinstance(meas, dict) or pred is None or meas.get("median") is None:
                continue
            rel = (r.get("rel_error") or {}).get(m)  # confirm's convention: (predicted - measured) / measured
            if rel is None and meas["median"]:
                rel = (pred - meas["median"]) / abs(meas["median"])
            rows.append({"label": r["label"], "metric": m, "predicted": float(pred), "measured": float(meas["median"]),
                         "min": float(meas.get("min", meas["median"])), "max": float(meas.get("max", meas["median"])),
                         "rel_error": None if rel is None else float(rel)})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    wanted = metrics or [m for m in CONFIRM_METRICS if m in set(df["metric"])] or sorted(set(df["metric"]))[:9]
    df = df[df["metric"].isin(wanted)]
    return df[np.isfinite(df["predicted"]) & np.isfinite(df["measured"])]


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


# --- charts ------------------------------------------------------------------------------------

def _log_if_wide(values, ratio: float = 20.0) -> alt.Scale:
    v = np.asarray([x for x in values if x and np.isfinite(x) and x > 0], float)
    wide = len(v) and v.max() / v.min() > ratio
    return alt.Scale(type="log") if wide else alt.Scale(zero=False)


def tradeoff_chart(frame: pd.DataFrame, latency: str, throughput: str) -> alt.FacetChart | alt.LayerChart:
    """Throughput against latency, one colour per budget and one shape per policy; the Pareto front
    as a line, the pick ringed."""
    order = _budget_order(frame["budget"])
    xs = _log_if_wide(frame["latency"])
    xs.padding = 16
    x = alt.X("latency:Q", title=latency, scale=xs, axis=alt.Axis(labelOverlap="greedy"))
    y = alt.Y("throughput:Q", title=throughput, scale=alt.Scale(zero=False, padding=22))
    tip = ["label:N", "policy:N", "budget:N", alt.Tooltip("latency:Q", title=latency, format=".4g"),
           alt.Tooltip("throughput:Q", title=throughput, format=".4g"), "front:N", "picked:N"]
    pts = alt.Chart().mark_point(filled=True, size=70, opacity=0.85).encode(
        x=x, y=y, color=alt.Color("budget:O", sort=order, scale=alt.Scale(scheme="viridis"), title="budget"),
        shape=alt.Shape("policy:N", title="policy"), tooltip=tip)
    line = alt.Chart().transform_filter("datum.front").mark_line(color="#d62728", strokeDash=[5, 3]).encode(
        x=x, y=y, order="latency:Q")
    ring = alt.Chart().transform_filter("datum.picked").mark_point(size=380, color="#d62728", strokeWidth=2).encode(
        x=x, y=y)
    text = alt.Chart().transform_filter("datum.picked").mark_text(dy=-16, color="#d62728", fontWeight="bold").encode(
        x=x, y=y, text="label:N")
    layer = alt.layer(pts, line, ring, text, data=frame).properties(width=WIDTH, height=HEIGHT)
    if frame["group"].nunique() > 1:
        return layer.facet(facet=alt.Facet("group:N", title=None), columns=2).properties(
            title=f"{throughput} vs {latency} (dashed: Pareto front, ringed: pick)")
    return layer.properties(title=f"{throughput} vs {latency} (dashed: Pareto front, ringed: pick)")


def gap_percentile_chart(frame: pd.DataFrame) -> alt.HConcatChart:
    """Gap percentiles against budget: a column per policy (as wide as its budgets), a row per gap kind."""
    frame = frame.assign(panel=frame["family"] if frame["group"].nunique() == 1 else
                         frame["group"] + ": " + frame["family"])  # one row per trace and rate
    columns = []
    for i, policy in enumerate(sorted(frame["policy"].unique())):
        sub = frame[frame["policy"] == policy]
        order = _budget_order(sub["budget"])
        chart = alt.Chart(sub).mark_line(point=True).encode(
            x=alt.X("budget:O", sort=order, title="chunk budget (tokens)", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("ms:Q", scale=_log_if_wide(frame["ms"], 10), title="gap (ms)" if i == 0 else None),
            color=alt.Color("statistic:N", sort=["p50", "p95", "p99", "max"], title="statistic"),
            tooltip=["label:N", "group:N", "family:N", "statistic:N", alt.Tooltip("ms:Q", format=".4g")],
        ).properties(width=max(90, 42 * len(order)), height=160)
        header = alt.Header(labels=i == 0, labelOrient="left")
        columns.append(chart.facet(row=alt.Row("panel:N", title=None, header=header)).properties(title=policy))
    return alt.hconcat(*columns).resolve_scale(y="shared").properties(
        title="gap percentiles per policy, by budget")


def ecdf_chart(frame: pd.DataFrame) -> alt.FacetChart:
    """Cumulative distribution of gaps per run; measured runs dashed."""
    base = alt.Chart(frame).mark_line(interpolate="step-after").encode(
        x=alt.X("ms:Q", scale=_log_if_wide(frame["ms"], 10), title="gap (ms)", axis=alt.Axis(labelOverlap="greedy")),
        y=alt.Y("fraction:Q", title="fraction of gaps <= x"),
        color=alt.Color("series:N", title="run"),
        strokeDash=alt.StrokeDash("source:N", title="source"),
        tooltip=["label:N", "policy:N", "source:N", alt.Tooltip("ms:Q", format=".4g"),
                 alt.Tooltip("fraction:Q", format=".2f"), "n:Q"],
    ).properties(width=WIDTH - 60, height=HEIGHT - 40)
    return base.facet(column=alt.Column("family:N", title=None)).properties(
        title="gap distributions per run").resolve_scale(x="independent")


def timeline_chart(frame: pd.DataFrame, title: str) -> alt.LayerChart:
    """Each request's prefill chunks and decode calls in time; ticks mark arrivals."""
    n = frame["order"].nunique()
    y = alt.Y("request:N", sort=alt.EncodingSortField("order", order="ascending"), title="request")
    bars = alt.Chart(frame).transform_filter("datum.kind != 'arrival'").mark_bar(height=max(4, min(14, 300 // n))).encode(
        x=alt.X("start:Q", title="time (s)"), x2="end:Q", y=y,
        color=alt.Color("kind:N", scale=alt.Scale(domain=["prefill", "decode"], range=["#ff7f0e", "#1f77b4"]),
                        title="call"),
        tooltip=["request:N", "kind:N", alt.Tooltip("start:Q", format=".4f"), alt.Tooltip("end:Q", format=".4f"),
                 "tokens:Q", "prefix:Q", "call:Q"])
    ticks = alt.Chart(frame).transform_filter("datum.kind == 'arrival'").mark_tick(
        color="black", thickness=2, size=max(6, min(18, 320 // n))).encode(
        x="start:Q", y=y, tooltip=["request:N", alt.Tooltip("start:Q", title="arrival", format=".4f"),
                                   alt.Tooltip("tokens:Q", title="prompt")])
    return alt.layer(bars, ticks).properties(width=WIDTH + 260, height=max(120, 22 * n), title=title)


def confirm_chart(frame: pd.DataFrame) -> alt.FacetChart:
    """Measured median (whiskers: min..max over repeats) against predicted, per metric; y = x dashed."""
    diag = frame.groupby("metric").agg(lo=("predicted", "min"), lo2=("min", "min"), hi=("predicted", "max"),
                                       hi2=("max", "max")).reset_index()
    diag = pd.concat([pd.DataFrame({"metric": diag["metric"], "v": diag[["lo", "lo2"]].min(axis=1)}),
                      pd.DataFrame({"metric": diag["metric"], "v": diag[["hi", "hi2"]].max(axis=1)})])
    data = pd.concat([frame.assign(kind="run"), diag.assign(kind="diag", predicted=diag["v"], measured=diag["v"])],
                     ignore_index=True)
    x = alt.X("predicted:Q", title="predicted", scale=alt.Scale(zero=False))
    y = alt.Y("measured:Q", title="measured (median)", scale=alt.Scale(zero=False))
    line = alt.Chart().transform_filter("datum.kind == 'diag'").mark_line(color="gray", strokeDash=[4, 4]).encode(x=x, y=y)
    whisk = alt.Chart().transform_filter("datum.kind == 'run'").mark_rule().encode(
        x=x, y=alt.Y("min:Q"), y2="max:Q", color=alt.Color("label:N", title="setting"))
    pts = alt.Chart().transform_filter("datum.kind == 'run'").mark_point(filled=True, size=60).encode(
        x=x, y=y, color=alt.Color("label:N", title="setting"),
        tooltip=["label:N", "metric:N", alt.Tooltip("predicted:Q", format=".4g"),
                 alt.Tooltip("measured:Q", format=".4g"), alt.Tooltip("min:Q", format=".4g"),
                 alt.Tooltip("max:Q", format=".4g"), alt.Tooltip("rel_error:Q", format="+.1%")])
    return alt.layer(line, whisk, pts, data=data).properties(width=190, height=160).facet(
        facet=alt.Facet("metric:N", title=None), columns=3).resolve_scale(x="independent", y="independent").properties(
        title="predicted vs measured (dashed: exact prediction)")


def confirm_error_chart(frame: pd.DataFrame) -> alt.Chart:
    f = frame.dropna(subset=["rel_error"])
    f = f[np.isfinite(f["rel_error"].astype(float))]
    return alt.Chart(f).mark_bar().encode(
        x=alt.X("rel_error:Q", axis=alt.Axis(format="+%"), title="relative error: (predicted - measured) / measured"),
        y=alt.Y("metric:N", title=None), yOffset="label:N", color=alt.Color("label:N", title="setting"),
        tooltip=["label:N", "metric:N", alt.Tooltip("rel_error:Q", format="+.1%")],
    ).properties(width=WIDTH, title="relative error per metric")


def calibration_chart(frame: pd.DataFrame) -> alt.HConcatChart:
    """Fitted against measured step times, and the relative error against the step's size."""
    lo, hi = float(frame[["measured", "fitted"]].min().min()), float(frame[["measured", "fitted"]].max().max())
    scale = alt.Scale(type="log", domain=[lo * 0.8, hi * 1.25])
    tip = ["step:N", "held_out:N", "size:Q", "prefix:Q", "batch:Q", "context_sum:Q",
           alt.Tooltip("measured:Q", format=".4g"), alt.Tooltip("fitted:Q", format=".4g"),
           alt.Tooltip("spread:Q", format=".3g"), alt.Tooltip("rel_error:Q", format="+.1%")]
    diag = alt.Chart(pd.DataFrame({"measured": [lo * 0.8, hi * 1.25], "fitted": [lo * 0.8, hi * 1.25]})).mark_line(
        color="gray", strokeDash=[4, 4]).encode(x=alt.X("measured:Q", scale=scale), y=alt.Y("fitted:Q", scale=scale))
    pts = alt.Chart(frame).mark_point(size=50, filled=True, opacity=0.8).encode(
        x=alt.X("measured:Q", scale=scale, title="measured step time (s, median)"),
        y=alt.Y("fitted:Q", scale=scale, title="fitted (s)"),
        color=alt.Color("step:N", title="step"), shape=alt.Shape("held_out:N", title="sample"), tooltip=tip)
    left = alt.layer(diag, pts).properties(width=300, height=300, title="fitted vs measured (dashed: exact)")
    right = alt.Chart(frame).mark_point(size=50, filled=True, opacity=0.8).encode(
        x=alt.X("size:Q", scale=alt.Scale(type="log", base=2), title="prefill: chunk tokens; decode: batch",
                axis=alt.Axis(values=[2 ** k for k in range(16)], labelOverlap="greedy")),
        y=alt.Y("rel_error:Q", axis=alt.Axis(format="+%"), title="fitted / measured - 1"),
        color=alt.Color("step:N"), shape=alt.Shape("held_out:N"), tooltip=tip,
    ).properties(width=230, height=130).facet(row=alt.Row("step:N", title=None)).properties(
        title="relative error by step size").resolve_scale(x="independent")
    return alt.hconcat(left, right)


# --- the page ----------------------------------------------------------------------------------

@dataclass
class Section:
    name: str  # file stem of the PNG, id of the div
    title: str
    about: str
    chart: alt.TopLevelMixin | None = None
    note: str = ""  # why the chart is missing
    table: str = ""  # an HTML table under the chart


def build_sections(sweep: Sweep | None = None, confirm: dict | None = None, profile: dict | None = None,
                   simulated: dict | None = None, latency: str | None = None) -> tuple[list[Section], dict]:
    """Every chart the inputs allow, in page order, and a JSON-able summary of what went in."""
    secs, summary = [], {}
    # trade-off and gap percentiles, from a sweep
    if sweep is not None:
        inp = sweep.doc.get("inputs", {})
        latency = latency or inp.get("latency") or "decode_gap_p95_ms"
        throughput = inp.get("throughput") or "output_tok_s"
        picked, front = pick_marks(sweep.doc.get("picks", []))
        rows = []
        for pk in sweep.doc.get("picks", []):
            g = _group_name(pk.get("group", {}))
            rows.append({"group": g, "pick": pk.get("best") or "(none qualifies)",
                         "qualifying": f"{pk.get('feasible')} of {pk.get('total')}",
                         "runners-up": ", ".join(pk.get("runners_up", []))})
        if latency != inp.get("latency"):
            from sim.pick import pareto_front
            front = set()
            for g, sub in sweep.df.assign(_g=[_group_name(r) for _, r in sweep.df.iterrows()]).groupby("_g"):
                front |= {(g, lab) for lab in pareto_front(sub, latency, throughput)["label"]}
        tf = tradeoff_frame(sweep.df, latency, throughput, picked, front)
        about = (f"Each point is one setting of the sweep ({len(sweep.df)} runs): {throughput} against {latency}. "
                 f"Colour: chunk budget; shape: policy. The dashed line joins the Pareto front (no other setting "
                 f"has both lower {latency} and higher {throughput}); the ring marks the pick"
                 + (f" ({inp.get('objective')}, subject to {', '.join(inp['slo']['constraints'])})"
                    if inp.get("slo", {}).get("constraints") else f" ({inp.get('objective', '')})") + ".")
        secs.append(Section("tradeoff", "Throughput / latency trade-off", about,
                            tradeoff_chart(tf, latency, throughput) if len(tf) else None,
                            "" if len(tf) else f"no run has finite {latency} and {throughput}",
                            _html_table(rows, ["group", "pick", "qualifying", "runners-up"])))
        gf = gap_percentile_frame(sweep.df)
        secs.append(Section("gaps", "Gap distributions per policy",
                            "Percentiles of the per-request inter-token gaps (meTile) and of the decode-completion "
                            "gaps (tiny-llm) each setting produced, by chunk budget.",
                            gap_percentile_chart(gf) if len(gf) else None,
                            "" if len(gf) else "the sweep recorded no gaps"))
        summary["sweep"] = {"rows": len(sweep.df), "latency": latency, "throughput": throughput,
                            "picks": sweep.doc.get("picks", [])}
    else:
        secs.append(Section("tradeoff", "Throughput / latency trade-off", "", note="skipped: no --sweep given"))
        secs.append(Section("gaps", "Gap distributions per policy", "", note="skipped: no --sweep given"))

    series: list[LogSeries] = []
    if simulated is not None:
        s = simulated.get("setting", {})
        from sim.commands.common import setting_label
        label = setting_label(s) if s else "simulate"
        series.append(LogSeries(label, s.get("policy", "?"), "simulated", _log_of(simulated["log"], "--simulate")))
    if sweep is not None:
        series += sweep.logs
    if confirm is not None:
        series += confirm_logs(confirm)
    if series:
        ef = ecdf_frame(series)
        secs.append(Section("gap_ecdf", "Gap distributions per run",
                            "Cumulative distribution of every gap in each run's event log: simulated runs solid, "
                            "runs measured on the real engine dashed.",
                            ecdf_chart(ef) if len(ef) else None, "" if len(ef) else "the logs hold no gaps"))
        first = series[0]
        tl = timeline_frame(first.log)
        n_req = tl["order"].nunique() if len(tl) else 0
        secs.append(Section("timeline", "Per-request timeline",
                            f"The first {n_req} of {len(first.log.requests)} requests of {first.label} "
                            f"({first.source}): prefill chunks, decode calls and arrivals.",
                            timeline_chart(tl, f"{first.label} ({first.source})") if len(tl) else None,
                            "" if len(tl) else "the log has no calls"))
    else:
        why = "skipped: no event log (give --simulate, --confirm, or a sweep run with --logs)"
        secs.append(Section("gap_ecdf", "Gap distributions per run", "", note=why))
        secs.append(Section("timeline", "Per-request timeline", "", note=why))

    if confirm is not None:
        cf = confirm_frame(confirm)
        about = ("Each setting the confirm report re-ran on the real engine: the simulator's prediction against the "
                 "median of the measured repeats (whiskers: min and max).")
        secs.append(Section("confirm", "Predicted vs measured", about, confirm_chart(cf) if len(cf) else None,
                            "" if len(cf) else "the confirm report has no metric both predicted and measured",
                            _html_table(cf.to_dict("records"), ["label", "metric", "predicted", "measured", "rel_error"])
                            if len(cf) else ""))
        if len(cf) and cf["rel_error"].notna().any():
            secs.append(Section("confirm_error", "Prediction error", "Relative error of each prediction.",
                                confirm_error_chart(cf)))
        summary["confirm"] = {"settings": sorted(set(cf["label"])) if len(cf) else [],
                              "median_abs_rel_error": float(cf["rel_error"].abs().median()) if len(cf) else None}
    else:
        secs.append(Section("confirm", "Predicted vs measured", "", note="skipped: no --confirm given"))

    if profile is not None:
        kf = calibration_frame(profile)
        if len(kf):
            stats = (kf.assign(abs_err=kf["rel_error"].abs()).groupby(["step", "held_out"])
                     .agg(samples=("abs_err", "size"), median_abs_error=("abs_err", "median"),
                          max_abs_error=("abs_err", "max")).reset_index())
            about = (f"Step times of {profile['model'].get('name')} on {profile['device'].get('name', '?')}: the "
                     "fitted cost model against the measured medians; held-out samples were not used by the fit.")
            secs.append(Section("calibration", "Calibration quality", about, calibration_chart(kf), "",
                                _html_table(stats.to_dict("records"), list(stats.columns))))
            summary["calibration"] = stats.to_dict("records")
        else:
            secs.append(Section("calibration", "Calibration quality", "",
                                note=f"skipped: profile {profile.get('_path', '')} has no measured samples "
                                     "(the built-in illustrative profile has none; use one from `pdsim calibrate`)"))
    else:
        secs.append(Section("calibration", "Calibration quality", "", note="skipped: no --profile given"))
    return secs, summary


def _html_table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return ""

    def cell(v):
        if isinstance(v, float):
            return "-" if not np.isfinite(v) else f"{v:.4g}"
        return html.escape(str(v))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """vega, vega-lite and vega-embed as one script, from vl-convert: no network at view time."""
    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert
    return vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())


def page(sections: list[Section], inputs: dict) -> str:
    """One self-contained HTML page: the JavaScript once, then each section's chart or note."""
    parts, embeds = [], []
    for s in sections:
        parts.append(f'<section id="{s.name}"><h2>{html.escape(s.title)}</h2>')
        if s.about:
            parts.append(f"<p>{html.escape(s.about)}</p>")
        if s.chart is not None:
            parts.append(f'<div class="chart" id="chart-{s.name}"></div>')
            embeds.append(f"vegaEmbed('#chart-{s.name}', {json.dumps(s.chart.to_dict())}, "
                          "{mode: 'vega-lite', actions: {export: true, source: false, compiled: false, "
                          "editor: false}}).catch(e => { document.getElementById('chart-" + s.name +
                          "').textContent = 'chart failed: ' + e; });")
        else:
            parts.append(f'<p class="note">{html.escape(s.note)}</p>')
        parts.append(s.table + "</section>")
    listed = "".join(f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in inputs.items() if v)
    # a script holding JSON must not contain "</": escape it so the page parses
    script = "\n".join(embeds).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>pdsim report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; color: #222; }}
section {{ margin-bottom: 2.5em; }} .note {{ color: #8a5a00; background: #fff6e0; padding: .5em; }}
table {{ border-collapse: collapse; font-size: 13px; margin-top: .5em; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; }}
</style>
<script>{vega_bundle()}</script>
</head><body>
<h1>pdsim report</h1>
<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S')}. Inputs:</p><ul>{listed}</ul>
{''.join(parts)}
<script>
{script}
</script>
</body></html>
"""


def png_bytes(chart, scale: float = 2.0) -> bytes:
    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert
    return vlc.vegalite_to_png(chart.to_dict(), vl_version=vl_version_for_vl_convert(), scale=scale)


def _write_bytes(path: Path, data: bytes, overwrite: bool) -> None:
    """Like sim.files.atomic_write_text, for a PNG."""
    if path.exists() and not overwrite:
        raise ExistsError(f"{path} exists; not overwriting it (pass --overwrite, or choose another path)")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_report(out_dir: str | Path, sections: list[Section], inputs: dict, summary: dict,
                 overwrite: bool = False, png: bool = True) -> dict:
    """report.html, one PNG per chart and report.json into `out_dir`; refuses to overwrite first."""
    out = Path(out_dir)
    names = ["report.html", "report.json"] + ([f"{s.name}.png" for s in sections if s.chart is not None] if png else [])
    if not overwrite:
        for n in names:
            if (out / n).exists():
                raise ExistsError(f"{out / n} exists; not overwriting it (pass --overwrite, or another -o)")
    out.mkdir(parents=True, exist_ok=True)
    charts = {}
    for s in sections:
        if s.chart is None:
            continue
        charts[s.name] = {"title": s.title}
        if png:
            _write_bytes(out / f"{s.name}.png", png_bytes(s.chart), overwrite)
            charts[s.name]["png"] = f"{s.name}.png"
    atomic_write_text(out / "report.html", page(sections, inputs), overwrite=overwrite)
    doc = {"pdsim_report": 1, "inputs": inputs, "charts": charts,
           "skipped": {s.name: s.note for s in sections if s.chart is None}, "summary": summary}
    atomic_write_json(out / "report.json", doc, overwrite=overwrite)
    return doc


def make_report(out_dir: str | Path, sweep_dir=None, confirm_path=None, profile_path=None, simulate_path=None,
                latency: str | None = None, overwrite: bool = False, png: bool = True) -> dict:
    """Read whichever inputs are given, build every chart they allow, write the report."""
    if not any((sweep_dir, confirm_path, profile_path, simulate_path)):
        raise ReportError("nothing to report: give --sweep DIR, --confirm FILE, --profile FILE or --simulate FILE")
    from sim.costmodel import load_profile
    sweep = load_sweep(sweep_dir) if sweep_dir else None
    confirm = load_confirm(confirm_path) if confirm_path else None
    profile = load_profile(profile_path) if profile_path else None
    simulated = load_simulate(simulate_path) if simulate_path else None
    sections, summary = build_sections(sweep, confirm, profile, simulated, latency)
    inputs = {"sweep": str(sweep_dir) if sweep_dir else None, "confirm": str(confirm_path) if confirm_path else None,
              "profile": str(profile_path) if profile_path else None,
              "simulate": str(simulate_path) if simulate_path else None}
    return write_report(out_dir, sections, inputs, summary, overwrite, png)

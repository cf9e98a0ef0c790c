"""The altair charts, one function per chart, each from its data frame."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from sim.report.frames import budget_order

WIDTH, HEIGHT = 420, 260


def _log_if_wide(values, ratio: float = 20.0) -> alt.Scale:
    v = np.asarray([x for x in values if x and np.isfinite(x) and x > 0], float)
    wide = len(v) and v.max() / v.min() > ratio
    return alt.Scale(type="log") if wide else alt.Scale(zero=False)


def tradeoff_chart(frame: pd.DataFrame, latency: str, throughput: str) -> alt.FacetChart | alt.LayerChart:
    """Throughput against latency, one colour per budget and one shape per policy; the Pareto front
    as a line, the pick ringed."""
    order = budget_order(frame["budget"])
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
    # e.g. two batch sizes: one line per statistic and variant, told apart by their dashes
    several = frame.groupby("policy")["variant"].nunique().max() > 1
    for i, policy in enumerate(sorted(frame["policy"].unique())):
        sub = frame[frame["policy"] == policy]
        order = budget_order(sub["budget"])
        lines = {"detail": "variant:N", "strokeDash": alt.StrokeDash("variant:N", title="setting")} if several else {}
        chart = alt.Chart(sub).mark_line(point=True).encode(
            x=alt.X("budget:O", sort=order, title="chunk budget (tokens)", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("ms:Q", scale=_log_if_wide(frame["ms"], 10), title="gap (ms)" if i == 0 else None),
            color=alt.Color("statistic:N", sort=["p50", "p95", "p99", "max"], title="statistic"),
            tooltip=["label:N", "group:N", "family:N", "statistic:N", alt.Tooltip("ms:Q", format=".4g")],
            **lines).properties(width=max(90, 42 * len(order)), height=160)
        header = alt.Header(labels=i == 0, labelOrient="left")
        columns.append(chart.facet(row=alt.Row("panel:N", title=None, header=header)).properties(title=policy))
    return alt.hconcat(*columns).resolve_scale(y="shared").properties(
        title="gap percentiles per policy, by budget")


def ecdf_chart(frame: pd.DataFrame) -> alt.FacetChart:
    """Cumulative distribution of gaps per run; measured runs dashed. Runs of different traces are
    never overlaid: each trace gets its own row, named."""
    base = alt.Chart(frame).mark_line(interpolate="step-after").encode(
        x=alt.X("ms:Q", scale=_log_if_wide(frame["ms"], 10), title="gap (ms)", axis=alt.Axis(labelOverlap="greedy")),
        y=alt.Y("fraction:Q", title="fraction of gaps <= x"),
        color=alt.Color("series:N", title="run"),
        strokeDash=alt.StrokeDash("source:N", title="source"),
        tooltip=["label:N", "policy:N", "source:N", "trace:N", alt.Tooltip("ms:Q", format=".4g"),
                 alt.Tooltip("fraction:Q", format=".2f"), "n:Q"],
    ).properties(width=WIDTH - 60, height=HEIGHT - 40)
    rows = {"row": alt.Row("trace:N", title="trace")} if frame["trace"].nunique() > 1 else {}
    return base.facet(column=alt.Column("family:N", title=None), **rows).properties(
        title="gap distributions per run" + ("" if rows else f" (trace {frame['trace'].iloc[0]})")
    ).resolve_scale(x="independent")


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


def capacity_chart(frame: pd.DataFrame) -> alt.FacetChart:
    """Each SLO metric against requests/s, one line per setting, the SLO's bound a dashed rule: a
    setting's capacity is where its line crosses the rule."""
    line = alt.Chart().mark_line(point=True, opacity=0.85).encode(
        x=alt.X("rate:Q", title="requests/s", scale=alt.Scale(type="log")),
        y=alt.Y("value:Q", title=None, scale=alt.Scale(type="log")),
        color=alt.Color("label:N", title="setting"),
        tooltip=["label:N", alt.Tooltip("rate:Q", format=".4g"), "metric:N", alt.Tooltip("value:Q", format=".4g")])
    rule = alt.Chart().mark_rule(color="#d62728", strokeDash=[5, 3]).encode(y="bound:Q")
    return alt.layer(line, rule, data=frame).properties(width=WIDTH, height=HEIGHT).facet(
        facet=alt.Facet("metric:N", title=None), columns=2).resolve_scale(y="independent").properties(
        title="SLO metrics against the arrival rate (dashed: the SLO)")


def offset_chart(frame: pd.DataFrame) -> alt.FacetChart:
    """A chunk's measured seconds (points) and fitted (line) against its offset, one panel per
    chunk size, one colour per model: how much the context before a chunk costs each model."""
    base = alt.Chart(frame).encode(
        x=alt.X("prefix:Q", title="offset (tokens cached before the chunk)"),
        color=alt.Color("model:N", title="model"))
    tip = ["model:N", "chunk:Q", "prefix:Q", alt.Tooltip("measured:Q", format=".4g"), alt.Tooltip("fitted:Q", format=".4g")]
    pts = base.mark_point(filled=True, size=50).encode(y=alt.Y("measured:Q", title="seconds"), tooltip=tip)
    fit = base.mark_line(strokeDash=[4, 3]).encode(y="fitted:Q")
    return alt.layer(pts, fit).properties(width=200, height=160).facet(
        facet=alt.Facet("chunk:O", title="chunk tokens"), columns=5).resolve_scale(y="independent")


"""The page: sections in order, one self-contained HTML file (Vega JavaScript inline, from
vl-convert), PNGs by the same renderer, and report.json."""
from __future__ import annotations

import html
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import altair as alt
import numpy as np

from policies.settings import setting_label
from sim.core.files import atomic_write_bytes, atomic_write_json, atomic_write_text, dumps
from sim.core.outdir import OutputFolder
from sim.metrics import registry
from sim.report.charts import (
    calibration_chart,
    capacity_chart,
    confirm_chart,
    confirm_error_chart,
    ecdf_chart,
    gap_percentile_chart,
    offset_chart,
    timeline_chart,
    tradeoff_chart,
)
from sim.report.frames import (
    calibration_frame,
    capacity_frame,
    call_frame,
    confirm_frame,
    ecdf_frame,
    gap_percentile_frame,
    group_name,
    offset_frame,
    offset_terms,
    path_frame,
    pick_marks,
    timeline_frame,
    tradeoff_frame,
)
from sim.report.sources import (
    LogSeries,
    ReportError,
    Sweep,
    confirm_logs,
    load_capacity,
    load_confirm,
    load_simulate,
    load_sweep,
    trace_name,
)


@dataclass
class Section:
    name: str  # file stem of the PNG, id of the div
    title: str
    about: str
    chart: alt.TopLevelMixin | None = None
    note: str = ""  # why the chart is missing
    table: str = ""  # an HTML table under the chart


def build_sections(sweep: Sweep | None = None, confirm: dict | None = None, profile: dict | None = None,
                   simulated: dict | None = None, latency: str | None = None,
                   capacity: tuple[dict, object] | None = None, others: list[dict] = ()) -> tuple[list[Section], dict]:
    """Every chart the inputs allow, in page order, and a JSON-able summary of what went in.
    `others`: more profiles, whose chunk costs against the offset are drawn beside `profile`'s."""
    secs, summary = [], {}
    if capacity is not None:  # `pdsim capacity`: each SLO metric against the rate, and the pick
        doc, curve = capacity
        cap = capacity_frame(curve, doc["slo"])
        rows = [{k: r.get(k) for k in ("label", "capacity_req_s", "breaks_at_req_s", "slo_margin")}
                for r in doc["settings"]]
        secs.append(Section("capacity", "Capacity: the most traffic each setting serves under the SLOs",
                            f"Every run of the search: {', '.join(doc['slo'])} against the arrival rate, one line "
                            f"per setting; a setting's capacity is the highest rate at which it met every SLO. "
                            f"{doc.get('why', '')}", capacity_chart(cap) if len(cap) else None,
                            "" if len(cap) else "the search recorded none of the SLO metrics",
                            _html_table(rows, ["label", "capacity_req_s", "breaks_at_req_s", "slo_margin"])))
        summary["capacity"] = {"pick": doc.get("pick"), "slo": doc["slo"]}
    # trade-off and gap percentiles, from a sweep
    if sweep is not None:
        inp = sweep.doc.get("inputs", {})
        latency = column(sweep.df, latency or inp.get("latency") or registry.DEFAULT_LATENCY)
        throughput = column(sweep.df, inp.get("throughput") or registry.DEFAULT_OBJECTIVE)
        picked, front = pick_marks(sweep.doc.get("picks", []))
        rows = []
        for pk in sweep.doc.get("picks", []):
            g = group_name(pk.get("group", {}))
            rows.append({"group": g, "pick": pk.get("best") or "(none qualifies)",
                         "qualifying": f"{pk.get('feasible')} of {pk.get('total')}",
                         "runners-up": ", ".join(pk.get("runners_up", []))})
        if latency != inp.get("latency"):
            from sim.sweep.pick import pareto_front
            front = set()
            for g, sub in sweep.df.assign(_g=[group_name(r) for _, r in sweep.df.iterrows()]).groupby("_g"):
                front |= {(g, lab) for lab in pareto_front(sub, latency, throughput)["label"]}
        tf = tradeoff_frame(sweep.df, latency, throughput, picked, front)
        about = (f"Each point is one setting of the sweep ({len(sweep.df)} runs): {throughput} against {latency}. "
                 f"Colour: chunk budget; shape: policy. The dashed line joins the Pareto front (no other setting "
                 f"has both lower {latency} and higher {throughput}); the ring marks the pick"
                 + (f" ({inp.get('objective')}, subject to {', '.join(inp['slo']['constraints'])})"
                    if inp.get("slo", {}).get("constraints") else f" ({inp.get('objective', '')})") + ". "
                 + " ".join(registry.describe(m) + "." for m in (latency, throughput)))
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
        label = setting_label(s) if s else "simulate"
        trace = simulated.get("trace") or {}
        series.append(LogSeries(label, s.get("policy", "?"), "simulated", simulated["log"],
                                trace_name(trace.get("meta") or {}), trace.get("sha256", "")))
    if sweep is not None:
        series += sweep.logs
    if confirm is not None:
        series += confirm_logs(confirm)
    if series:
        ef = ecdf_frame(series)
        traces = sorted(set(ef["trace"])) if len(ef) else []
        on = (f"All runs replay one trace, {traces[0]}." if len(traces) == 1 else
              f"The runs replay {len(traces)} different traces ({', '.join(traces)}): each trace has its own "
              "row, and only runs of the same trace are drawn together.")
        secs.append(Section("gap_ecdf", "Gap distributions per run",
                            "Cumulative distribution of every gap in each run's event log: simulated runs solid, "
                            "runs measured on the real engine dashed. " + on,
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
        probed = len(cf) and cf["prefill_speed"].notna().any()  # reports since speed probes
        about = ("Each setting the confirm report re-ran on the real engine: the simulator's prediction against the "
                 "median of the measured repeats (whiskers: min and max)."
                 + (" Predicted at the machine's speed the probes around each run measured (prefill_speed, "
                    "decode_speed: predicted/measured of their calls); the error at the calibration's speed "
                    "beside it." if probed else ""))
        secs.append(Section("confirm", "Predicted vs measured", about, confirm_chart(cf) if len(cf) else None,
                            "" if len(cf) else "the confirm report has no metric both predicted and measured",
                            _html_table(cf.to_dict("records"), ["label", "metric", "predicted", "measured", "rel_error"]
                                        + (["prefill_speed", "decode_speed", "rel_error_at_calibration_speed"]
                                           if probed else []))
                            if len(cf) else ""))
        if len(cf) and cf["rel_error"].notna().any():
            secs.append(Section("confirm_error", "Prediction error", "Relative error of each prediction.",
                                confirm_error_chart(cf)))
        secs += _table_section("confirm_calls", "Per-call predicted/measured", call_frame(confirm),
                               "Every call of the measured runs priced by the cost model from its logged "
                               "shape: predicted/measured by call kind and size bucket (median, p10 and p90 "
                               "over the calls of all the setting's repeats), so a miss in a run metric shows "
                               "the calls it comes from; where the runs counted page faults, how many calls "
                               "faulted over 1 MiB of fresh memory and their median.")
        secs += _table_section("confirm_paths", "Did the replays take the engine's path?", path_frame(confirm),
                               "Each measured run's scheduling decisions (every call's kind, requests and tokens, "
                               "in order) against the replays': how many replays made the same decisions, and "
                               "where the replay at typical call times parted from the run (the engine's time, "
                               "what each did, how far the replay's clock ran ahead (negative: behind), and the "
                               "earlier call whose time it missed by most). A tail that misses where the paths "
                               "part is a different run, not a mispriced call.")
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
    profiles = ([profile] if profile is not None else []) + list(others)
    of = offset_frame(profiles)
    if len(of):
        terms = offset_terms(profiles)
        about = ("A prefill chunk's measured time (points) and the fitted cost model's (dashed) against the "
                 "tokens already in the cache, from each profile's calibration samples. A hybrid model "
                 "attends to that context in its attention layers only (Qwen3.5: one layer in four); its "
                 "linear-attention layers carry a fixed-size state, whatever the offset. The table: the "
                 "fitted growth per 1,000 tokens of offset.")
        secs.append(Section("offset", "A chunk's cost against its offset", about, offset_chart(of), "",
                            _html_table(terms, list(terms[0]))))
        summary["offset"] = terms
    elif profiles:
        secs.append(Section("offset", "A chunk's cost against its offset", "",
                            note="skipped: no profile has a chunk size timed at two offsets"))
    return secs, summary


def _table_section(name: str, title: str, frame, about: str) -> list[Section]:
    """A section that is only a table of `frame`'s rows; none for an empty frame (a report from
    before the table existed)."""
    return [Section(name, title, about, table=_html_table(frame.to_dict("records"), list(frame.columns)))] \
        if len(frame) else []


def column(df, name: str) -> str:
    """The column of `df` that holds metric `name`: itself, or under its registry name or an alias
    (results written before a metric was renamed)."""
    m = registry.get(name)
    for candidate in [name] + ([m.name, *m.aliases] if m else []):
        if candidate in df.columns:
            return candidate
    return name


def _html_table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return ""

    def cell(v):
        if v is None:
            return "-"
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
            embeds.append(f"vegaEmbed('#chart-{s.name}', {dumps(s.chart.to_dict())}, "
                          "{mode: 'vega-lite', actions: {export: true, source: false, compiled: false, "
                          "editor: false}}).catch(e => { document.getElementById('chart-" + s.name +
                          "').textContent = 'chart failed: ' + e; });")
        elif s.note:
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


SECTIONS = ("capacity", "tradeoff", "gaps", "gap_ecdf", "timeline", "confirm", "confirm_error", "confirm_calls", "calibration",
            "offset")
REPORT_NAMES = ("report.html", "report.json") + tuple(f"{n}.png" for n in SECTIONS)  # what a report owns in its folder


def write_report(out_dir: str | Path | OutputFolder, sections: list[Section], inputs: dict, summary: dict,
                 overwrite: bool = False, png: bool = True) -> dict:
    """report.html, one PNG per chart and report.json into `out_dir`, as one set (`sim.core.outdir`:
    locked, staged, moved in with report.json last; an older report's files moved out)."""
    if not isinstance(out_dir, OutputFolder):
        with OutputFolder(out_dir, REPORT_NAMES, overwrite, "report folder") as folder:
            return write_report(folder, sections, inputs, summary, overwrite, png)
    stage = out_dir.staging
    charts = {}
    for s in sections:
        if s.chart is None:
            continue
        charts[s.name] = {"title": s.title}
        if png:
            atomic_write_bytes(stage / f"{s.name}.png", png_bytes(s.chart))
            charts[s.name]["png"] = f"{s.name}.png"
    atomic_write_text(stage / "report.html", page(sections, inputs))
    doc = {"pdsim_report": 1, "inputs": inputs, "charts": charts,
           "skipped": {s.name: s.note for s in sections if s.chart is None and s.note}, "summary": summary}
    atomic_write_json(stage / "report.json", doc)
    out_dir.commit(last="report.json")
    return doc


def make_report(out_dir: str | Path, sweep_dir=None, confirm_path=None, profile_path=None, simulate_path=None,
                latency: str | None = None, overwrite: bool = False, png: bool = True, capacity_dir=None) -> dict:
    """Read whichever inputs are given, build every chart they allow, write the report."""
    if not any((sweep_dir, confirm_path, profile_path, simulate_path, capacity_dir)):
        raise ReportError("nothing to report: give --sweep DIR, --capacity DIR, --confirm FILE, --profile FILE or "
                          "--simulate FILE")
    with OutputFolder(out_dir, REPORT_NAMES, overwrite, "report folder") as folder:  # before reading anything
        return _make_report(folder, sweep_dir, confirm_path, profile_path, simulate_path, latency, overwrite, png,
                            capacity_dir)


def _make_report(folder: OutputFolder, sweep_dir, confirm_path, profile_path, simulate_path, latency, overwrite,
                 png, capacity_dir=None) -> dict:
    from sim.cost.profile import load_profile
    sweep = load_sweep(sweep_dir) if sweep_dir else None
    confirm = load_confirm(confirm_path) if confirm_path else None
    paths = [profile_path] if isinstance(profile_path, (str, Path)) else list(profile_path or [])
    profile, *others = [load_profile(p) for p in paths] or [None]
    simulated = load_simulate(simulate_path) if simulate_path else None
    capacity = load_capacity(capacity_dir) if capacity_dir else None
    sections, summary = build_sections(sweep, confirm, profile, simulated, latency, capacity, others)
    inputs = {"sweep": str(sweep_dir) if sweep_dir else None, "confirm": str(confirm_path) if confirm_path else None,
              "profile": (str(paths[0]) if len(paths) == 1 else [str(p) for p in paths]) if paths else None,
              "simulate": str(simulate_path) if simulate_path else None,
              **({"capacity": str(capacity_dir)} if capacity_dir else {})}
    return write_report(folder, sections, inputs, summary, overwrite, png)

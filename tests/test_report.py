"""Reports: every chart from every input, skipped charts explained, an offline page, no overwrites."""
import html
import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest

import policies
from sim.cli import main
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.engine.log import EventLog
from sim.metrics.scoring import score
from sim.replay import simulate
from sim.report import (LogSeries, calibration_frame, call_frame, confirm_frame, path_frame, ecdf_chart, ecdf_frame,
                        gap_percentile_chart, gap_percentile_frame, load_sweep, timeline_frame)
from sim.report.sources import confirm_logs
from sim.metrics.residuals import residual_table
from policies.settings import setting_label
from sim.sweep.run import grid, run_sweep
from traces.generators import poisson, tinyllm

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_CHARTS = {"tradeoff", "gaps", "gap_ecdf", "timeline", "confirm", "confirm_error", "calibration", "offset"}


def _stretch(log_dict: dict, f: float) -> dict:
    """The same run, every time `f` times later: a stand-in for a measured run."""
    d = json.loads(json.dumps(log_dict))
    for c in d["calls"]:
        c[1] *= f
        c[2] *= f
    d["tokens"] = {k: [t * f for t in v] for k, v in d["tokens"].items()}
    for r in d["requests"]:
        r["arrival"] *= f
    return d


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A sweep directory with logs, a simulate JSON, a confirm report and a profile with samples."""
    tmp = tmp_path_factory.mktemp("inputs")
    assert main(["sweep", "--trace", "tinyllm", "poisson", "--num-requests", "40", "--rate", "2",
                 "--policy", "fifo", "eager", "chunked", "--budget", "32", "128", "512", "--no-progress",
                 "--slo", "decode_gap_p95_ms<=60", "-o", str(tmp / "sweep"), "--logs", "2"]) == 0
    assert main(["simulate", "--trace", "metile", "--prompt-len", "256", "--output-len", "16", "--policy",
                 "chunked", "--budget", "64", "--json-out", str(tmp / "sim.json"), "--log-out", str(tmp / "sim.npz")]) == 0

    prof = load_profile(BUILTIN)
    cost = cost_model(prof)
    trace = tinyllm(num_seqs=4)
    settings = [{"policy": "chunked", "budget": b, "batch_size": 4, "decode": "batched", "order": "chunk-first"}
                for b in (32, 128)]
    results, runs = [], []
    for s in settings:
        log = simulate(trace, policies.make(**s), cost)
        m = {k: v for k, v in score(log).items() if isinstance(v, float) and math.isfinite(v)}
        label = setting_label(s)
        measured_log = _stretch(log.to_dict(), 1.1)
        results.append({"label": label, "setting": s, "predicted": m,
                        "measured": {k: {"median": v * 1.1, "min": v * 1.05, "max": v * 1.2} for k, v in m.items()},
                        "rel_error": {k: -0.1 / 1.1 for k in m},
                        "calls": residual_table([EventLog.from_dict(measured_log)] * 2, cost)})
        for rep in range(2):
            runs.append({"label": label, "repeat": rep, "setting": s, "metrics": m, "log": measured_log})
    confirm = {"trace": {"meta": trace.meta, "sha256": trace.sha256(), "requests": len(trace)},
               "settings": settings, "results": results, "runs": runs}
    (tmp / "confirm.json").write_text(json.dumps(confirm))

    rng = np.random.default_rng(0)
    samples = []
    for chunk in (16, 64, 256):
        for prefix in (0, 256):
            fit = cost.prefill(chunk, prefix)
            samples.append({"step": "prefill", "chunk": chunk, "prefix": prefix, "batch": 1, "context_sum": 0,
                            "seconds": fit * rng.uniform(0.9, 1.1), "spread": fit * 0.05, "fitted": fit,
                            "held_out": prefix == 256 and chunk == 64})
    for batch in (1, 2, 4):
        fit = cost.decode([300] * batch)
        samples.append({"step": "decode", "chunk": 1, "prefix": 300, "batch": batch, "context_sum": 300 * batch,
                        "seconds": fit * rng.uniform(0.9, 1.1), "spread": fit * 0.05, "fitted": fit,
                        "held_out": batch == 2})
    prof = {k: v for k, v in prof.items() if not k.startswith("_")}
    prof.update(illustrative=False, samples=samples)
    (tmp / "profile.json").write_text(json.dumps(prof))
    return tmp


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


def _loaded_urls(page: str) -> list[str]:
    """src/href of the page's elements (script bodies are text to the parser, so the bundle's own
    strings do not count)."""
    p = _Links()
    p.feed(page)
    return p.urls


def _report(inputs, out, *extra):
    return main(["report", "--sweep", str(inputs / "sweep"), "--simulate", str(inputs / "sim.json"),
                 "--confirm", str(inputs / "confirm.json"), "--profile", str(inputs / "profile.json"),
                 "-o", str(out), *extra])


def test_full_report_has_every_chart_offline(inputs, tmp_path, capsys):
    out = tmp_path / "rep"
    assert _report(inputs, out) == 0
    doc = json.loads((out / "report.json").read_text())
    assert set(doc["charts"]) == ALL_CHARTS and doc["skipped"] == {}
    for name in ALL_CHARTS:
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
    page = (out / "report.html").read_text()
    # offline: no element of the page loads anything (scripts, styles, images); the renderer is inline
    assert _loaded_urls(page) == []
    assert "vegaEmbed" in page and len(page) > 500_000
    for name in ALL_CHARTS:
        assert f"vegaEmbed('#chart-{name}'" in page and f'id="chart-{name}"' in page
    assert doc["summary"]["confirm"]["median_abs_rel_error"] == pytest.approx(0.1 / 1.1)
    assert "wrote" in capsys.readouterr().out


def test_missing_inputs_are_skipped_with_a_note(inputs, tmp_path):
    out = tmp_path / "rep"
    assert main(["report", "--profile", str(BUILTIN), "-o", str(out), "--no-png"]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["charts"] == {}
    assert set(doc["skipped"]) == ALL_CHARTS - {"confirm_error"}
    assert "no measured samples" in doc["skipped"]["calibration"]
    assert "two offsets" in doc["skipped"]["offset"]
    page = (out / "report.html").read_text()
    assert "skipped: no --sweep given" in page and "skipped: no --confirm given" in page
    assert not list(out.glob("*.png"))

    out2 = tmp_path / "rep2"
    assert main(["report", "--sweep", str(inputs / "sweep"), "-o", str(out2), "--no-png"]) == 0
    doc = json.loads((out2 / "report.json").read_text())
    # the sweep saved logs, so the timeline and distributions come from them
    assert set(doc["charts"]) == {"tradeoff", "gaps", "gap_ecdf", "timeline"}


def test_a_hybrid_profile_beside_a_dense_one_shows_what_the_offset_costs_each(inputs, tmp_path):
    """Two profiles: their chunk costs against the offset in one chart, and the fitted growth per
    1,000 offset tokens of each; a hybrid's model shapes say how many of its layers attend."""
    dense = json.loads((inputs / "profile.json").read_text())
    hybrid = json.loads(json.dumps(dense))
    hybrid["model"] = dict(hybrid["model"], name="qwen3.5-0.8b", shapes={
        "model_type": "qwen3_5_text", "num_hidden_layers": 24, "full_attention_interval": 4})
    hybrid["cost"]["prefill"]["coef"] = [c / 4 for c in hybrid["cost"]["prefill"]["coef"]]
    for s in hybrid["samples"]:
        s["seconds"] *= 0.9
    (tmp_path / "hybrid.json").write_text(json.dumps(hybrid))
    out = tmp_path / "rep"
    assert main(["report", "--profile", str(inputs / "profile.json"), str(tmp_path / "hybrid.json"),
                 "-o", str(out), "--no-png"]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert {"calibration", "offset"} <= set(doc["charts"])
    terms = {t["model"]: t for t in doc["summary"]["offset"]}
    assert terms["qwen3.5-0.8b"]["attention layers"] == 6 and terms["qwen3.5-0.8b"]["layers"] == 24
    d, h = terms[dense["model"]["name"]], terms["qwen3.5-0.8b"]
    assert h["ms per 1k offset tokens"] == pytest.approx(d["ms per 1k offset tokens"] / 4, rel=1e-3)
    assert doc["inputs"]["profile"] == [str(inputs / "profile.json"), str(tmp_path / "hybrid.json")]
    assert "qwen3.5-0.8b" in (out / "report.html").read_text()


def test_report_never_overwrites_and_errors_are_one_line(inputs, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", "--simulate", str(inputs / "sim.json"), "-o", str(out), "--no-png"]) == 0
    before = (out / "report.html").read_text()
    capsys.readouterr()
    assert main(["report", "--simulate", str(inputs / "sim.json"), "-o", str(out), "--no-png"]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and err.count("\n") == 1
    assert (out / "report.html").read_text() == before
    assert main(["report", "--simulate", str(inputs / "sim.json"), "-o", str(out), "--no-png", "--overwrite"]) == 0

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args, message in [([], "nothing to report"), (["--confirm", str(bad)], "not JSON"),
                          (["--sweep", str(tmp_path / "nope")], "no such directory"),
                          (["--simulate", str(inputs / "confirm.json")], "no 'log'")]:
        capsys.readouterr()
        assert main(["report", *args, "-o", str(tmp_path / "r2")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_frames_stay_small_for_long_runs():
    """A 2,000-request replay is drawn from a few hundred rows, not one per call."""
    prof = load_profile(BUILTIN)
    log = simulate(poisson(num_requests=2000, rate=1.0, seed=0), policies.make("chunked", budget=64), cost_model(prof))
    tl = timeline_frame(log, max_requests=16, max_marks=4000)
    assert 0 < len(tl) <= 4000 + 16 and tl["order"].nunique() <= 16
    ef = ecdf_frame([LogSeries("x", "chunked", "simulated", log)])
    assert 2 * 101 <= len(ef) <= 2 * 110 and set(ef["family"]) == {"inter-token gap", "decode-completion gap"}


def test_frames_read_the_documented_formats(inputs):
    confirm = json.loads((inputs / "confirm.json").read_text())
    cf = confirm_frame(confirm)
    assert set(cf["label"]) == {"chunked/b32/bs4", "chunked/b128/bs4"}
    assert np.allclose(cf["measured"], cf["predicted"] * 1.1)
    kf = calibration_frame(json.loads((inputs / "profile.json").read_text()))
    assert len(kf) == 9 and set(kf["held_out"]) == {"fit", "held out"}
    assert (kf["rel_error"].abs() < 0.12).all()


def test_per_call_table_shows_faulted_calls_where_the_runs_counted_them(inputs):
    """Runs that counted page faults (stop 34) add two columns: how many calls faulted over 1 MiB
    and their median predicted/measured; reports before them keep the old columns."""
    confirm = json.loads((inputs / "confirm.json").read_text())
    assert "faulted" not in call_frame(confirm).columns
    for r in confirm["results"]:
        for i, c in enumerate(r["calls"]):
            c.update(faulted=i % 2, faulted_ratio_median=0.25 if i % 2 else None)
    calls = call_frame(confirm)
    assert list(calls.columns)[-2:] == ["faulted", "faulted_median"]
    assert list(calls["faulted"]) == [i % 2 for r in confirm["results"] for i, _ in enumerate(r["calls"])]
    assert set(calls.loc[calls["faulted"] == 1, "faulted_median"]) == {0.25}


def test_per_call_table_only_for_reports_that_have_it(inputs, tmp_path):
    """Every call of the stand-in runs takes 1.1x its price, so each row says 1/1.1; a report
    written before confirm kept per-call rows still renders, without the section."""
    confirm = json.loads((inputs / "confirm.json").read_text())
    calls = call_frame(confirm)
    assert set(calls["setting"]) == {"chunked/b32/bs4", "chunked/b128/bs4"}
    assert {"prefill", "decode"} <= set(calls["kind"])
    for col in ("median", "p10", "p90"):
        assert np.allclose(calls[col], 1 / 1.1)
    out = tmp_path / "with"
    assert main(["report", "--confirm", str(inputs / "confirm.json"), "-o", str(out), "--no-png"]) == 0
    page = (out / "report.html").read_text()
    assert '<section id="confirm_calls"><h2>Per-call predicted/measured</h2>' in page
    section = page[page.index('<section id="confirm_calls">'):]
    section = section[:section.index("</section>")]
    assert section.count("<tr>") == len(calls) + 1  # a header, then one row per (setting, kind, size)
    assert "confirm_calls" not in json.loads((out / "report.json").read_text())["skipped"]

    for r in confirm["results"]:
        del r["calls"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(confirm))
    out = tmp_path / "without"
    assert main(["report", "--confirm", str(old), "-o", str(out), "--no-png"]) == 0
    page = (out / "report.html").read_text()
    assert "Per-call predicted/measured" not in page and 'id="chart-confirm"' in page


# Runs the page's own scripts in Node: vega-embed from the inline bundle builds each chart into a
# stand-in element (no DOM, no network: fetch throws), and the resulting view renders to SVG.
RENDER_PAGE_JS = r"""
// Render every chart of a pdsim report page with the page's own inline JavaScript and no network:
// vega-embed (from the page) builds each view into a stand-in element; the view then renders to SVG.
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const scripts = [...page.matchAll(/<script>([\s\S]*?)<\/script>/g)].map(m => m[1]);
const any = () => new Proxy(function () {}, {
  get: (t, k) => (k === Symbol.toPrimitive ? () => "" : k === "then" ? undefined : any()),
  apply: () => any(), construct: () => any(), set: () => true,
});
globalThis.window = globalThis;
globalThis.document = any();
globalThis.navigator = { userAgent: "node" };
globalThis.ShadowRoot = class {};
globalThis.fetch = () => { throw new Error("the page tried to use the network"); };
globalThis.HTMLElement = class {};
globalThis.Element = class {};
(0, eval)(scripts[0]);
const realEmbed = globalThis.vegaEmbed;
const views = [];
globalThis.vegaEmbed = (id, spec, opt) => {
  const p = realEmbed(any(), spec, { ...opt, actions: false, renderer: "none" }).then(r => views.push([id, r.view]));
  views.push(p);
  return p;
};
(0, eval)(scripts[1]);
(async () => {
  await Promise.all(views.filter(v => v instanceof Promise));
  const out = {};
  for (const entry of views) {
    if (entry instanceof Promise) continue;
    const [id, view] = entry;
    const svg = await view.toSVG();
    out[id] = { svg_chars: svg.length, marks: (svg.match(/<(path|rect|line|text)/g) || []).length };
  }
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e && e.stack || e)); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's JavaScript")
def test_page_scripts_render_every_chart_without_network(inputs, tmp_path):
    out = tmp_path / "rep"
    assert _report(inputs, out, "--no-png") == 0
    script = tmp_path / "render.js"
    script.write_text(RENDER_PAGE_JS)
    p = subprocess.run(["node", str(script), str(out / "report.html")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    drawn = json.loads(p.stdout)
    assert set(drawn) == {f"#chart-{name}" for name in ALL_CHARTS}
    assert all(v["marks"] > 20 for v in drawn.values()), drawn


def test_gap_chart_draws_one_line_per_setting_at_each_budget():
    """With two batch sizes the chart drew one line through both settings at every budget (a
    zig-zag); each line now holds one setting, so it has one point per budget."""
    settings = [{"policy": p, "budget": b, "batch_size": bs} for p in ("chunked", "eager") for b in (32, 128)
                for bs in (2, 4)]
    frame = gap_percentile_frame(run_sweep(grid(settings), workers=1, progress=False))
    assert set(frame["variant"]) == {"bs2", "bs4"}
    chart = gap_percentile_chart(frame)
    for column in chart.hconcat:
        enc = column.spec.to_dict()["encoding"]
        x = enc["x"]["field"]
        lines = [enc[k]["field"] for k in ("color", "detail", "strokeDash") if k in enc] + ["panel"]
        assert "variant" in lines
        data = column.data
        assert not data.duplicated(lines + [x]).any(), "a line with two points at one budget"


def test_runs_of_different_traces_are_never_overlaid(inputs, tmp_path):
    """The distribution chart drew runs of two traces in one panel, with the same name; each trace
    now has its own row, named, and the page says so."""
    sweep = load_sweep(inputs / "sweep")
    confirm = json.loads((inputs / "confirm.json").read_text())
    series = sweep.logs + confirm_logs(confirm)
    frame = ecdf_frame(series)
    # the confirm runs replay tinyllm(num_seqs=4), another trace than the sweep's tinyllm: both named apart
    tiny = tinyllm(num_seqs=4).sha256()[:8]
    assert set(frame["trace"]) == {"poisson", f"tinyllm ({tinyllm().sha256()[:8]})", f"tinyllm ({tiny})"}
    assert frame.groupby(["trace", "family", "series"])["fraction"].apply(lambda f: f.is_monotonic_increasing).all()
    spec = ecdf_chart(frame).to_dict()
    assert spec["facet"]["row"]["field"] == "trace"
    one = ecdf_chart(frame[frame["trace"] == "poisson"]).to_dict()
    assert "row" not in one["facet"] and "(trace poisson)" in json.dumps(one["title"])
    out = tmp_path / "rep"
    assert main(["report", "--sweep", str(inputs / "sweep"), "-o", str(out), "--no-png"]) == 0
    assert "The runs replay 2 different traces (poisson, tinyllm)" in (out / "report.html").read_text()


# Injected into a copy of report.html: records every page error, rejected promise and console
# error or warning, then waits until each chart's canvas (vega-embed's default renderer) holds
# drawn pixels, and writes what it found into the page, which Chromium's --dump-dom prints.
PROBE_HEAD = r"""<script>
window.__probe = {errors: []};
addEventListener("error", e => __probe.errors.push("error: " + e.message));
addEventListener("unhandledrejection", e => __probe.errors.push("unhandled rejection: " + e.reason));
for (const level of ["error", "warn"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => { __probe.errors.push("console." + level + ": " + args.join(" ")); original(...args); };
}
</script>"""
PROBE_TAIL = r"""<script>
function drawn(div) {
  const canvas = div.querySelector("canvas"), svg = div.querySelector("svg");
  if (svg) return svg.querySelectorAll("path, rect, line, text").length > 20;
  if (!canvas || !canvas.width || !canvas.height) return false;
  const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let ink = 0;  // pixels that are neither transparent nor white
  for (let i = 0; i < px.length; i += 4 * 13) if (px[i + 3] > 0 && (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250)) ink++;
  return ink > 50;
}
let tries = 0;
function check() {
  const charts = [...document.querySelectorAll("div.chart")].map(d => ({id: d.id, drawn: drawn(d),
                                                                   text: d.textContent.slice(0, 200)}));
  if (charts.every(c => c.drawn) || ++tries > 200) {
    const out = document.createElement("pre");
    out.id = "probe";
    out.textContent = JSON.stringify({charts, errors: __probe.errors});
    document.body.appendChild(out);
  } else setTimeout(check, 50);
}
addEventListener("load", () => setTimeout(check, 50));
</script>"""


MAC_BROWSERS = ("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
                "/Applications/Chromium.app/Contents/MacOS/Chromium")  # a Mac keeps them out of the PATH


def _chromium() -> str | None:
    on_path = (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))
    return next((b for b in (*on_path, *MAC_BROWSERS) if b and os.path.exists(b)), None)


def _headless(browser: str, profile_dir, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--hide-scrollbars", f"--user-data-dir={profile_dir}", "--host-resolver-rules=MAP * ~NOTFOUND",
             "--virtual-time-budget=30000"]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(_chromium() is None and not os.environ.get("PDSIM_REQUIRE_BROWSER"),
                    reason="needs Chromium or Chrome (Debian's chromium: `bash .ci/install test` installs it on Linux; "
                           "on a Mac, Google Chrome in /Applications)")
def test_report_page_renders_every_chart_in_chromium(inputs, tmp_path):
    """The page as a user opens it: headless Chromium loads report.html offline, every chart draws,
    and nothing is logged to the console. The screenshot is kept for a person to look at
    (PDSIM_SCREENSHOT=PATH copies it there)."""
    browser = _chromium()
    assert browser, "Chromium is required here (PDSIM_REQUIRE_BROWSER is set) but not installed"
    out = tmp_path / "rep"
    assert _report(inputs, out, "--no-png") == 0
    page = (out / "report.html").read_text()
    probe = tmp_path / "probe.html"
    head, tail = page.rsplit("</body>", 1)  # the last one: the inline bundle holds the string too
    probe.write_text(head.replace("<head>", "<head>" + PROBE_HEAD, 1) + PROBE_TAIL + "</body>" + tail)
    p = _headless(browser, tmp_path / "chrome", "--dump-dom", probe.as_uri())
    assert p.returncode == 0, p.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', p.stdout, re.S)
    assert found, f"the page never finished drawing: {p.stdout[-500:]} {p.stderr[-1000:]}"
    result = json.loads(html.unescape(found.group(1)))
    assert result["errors"] == []
    assert {c["id"] for c in result["charts"]} == {f"chart-{name}" for name in ALL_CHARTS}
    assert [c for c in result["charts"] if not c["drawn"]] == []
    shot = tmp_path / "report.png"
    p = _headless(browser, tmp_path / "chrome", f"--screenshot={shot}", "--window-size=1280,6000", probe.as_uri())
    assert p.returncode == 0 and shot.read_bytes().startswith(PNG_MAGIC) and shot.stat().st_size > 100_000
    if os.environ.get("PDSIM_SCREENSHOT"):
        shutil.copy(shot, os.environ["PDSIM_SCREENSHOT"])


def test_the_paths_table_says_which_runs_the_replays_left(inputs, tmp_path):
    """Each measured run's row: the replays on its path and, where the typical replay parted from
    it, where and why; a report from before confirm compared paths renders without the section."""
    confirm = json.loads((inputs / "confirm.json").read_text())
    assert len(path_frame(confirm)) == 0
    parted = {"call": 8, "at_s": 3.17, "engine": "prefill 2 (34 tokens)", "replay": "decode 0,1",
              "replay_ahead_s": 0.26, "missed": "sync 0,1", "missed_at_s": 1.1, "missed_measured_s": 0.5,
              "missed_replayed_s": 0.1}
    for r in confirm["results"]:
        r["paths"] = {"replays": 15, "runs": [{"repeat": 0, "same": 15, "parted": None},
                                              {"repeat": 1, "same": 0, "parted": parted}]}
    frame = path_frame(confirm)
    assert len(frame) == 2 * len(confirm["results"])
    assert list(frame["same_path"])[:2] == ["15 of 15", "0 of 15"]
    assert frame["parted_at_s"].isna().tolist()[:2] == [True, False]
    assert frame["engine"].iloc[1] == "prefill 2 (34 tokens)"
    report = tmp_path / "paths.json"
    report.write_text(json.dumps(confirm))
    out = tmp_path / "out"
    assert main(["report", "--confirm", str(report), "-o", str(out), "--no-png"]) == 0
    page = (out / "report.html").read_text()
    section = page[page.index('<section id="confirm_paths">'):]
    section = section[:section.index("</section>")]
    assert section.count("<tr>") == len(frame) + 1 and "prefill 2 (34 tokens)" in section
    out = tmp_path / "old"
    assert main(["report", "--confirm", str(inputs / "confirm.json"), "-o", str(out), "--no-png"]) == 0
    assert 'id="confirm_paths"' not in (out / "report.html").read_text()

"""Reports: every chart from every input, skipped charts explained, an offline page, no overwrites."""
import json
import math
from html.parser import HTMLParser

import shutil
import subprocess

import numpy as np
import pytest

import policies
from sim.cli import main
from sim.commands.common import setting_label
from sim.costmodel import BUILTIN, cost_model, load_profile
from sim.log import EventLog
from sim.metrics import score
from sim.replay import simulate
from sim.report import (calibration_frame, call_frame, confirm_frame, ecdf_frame, LogSeries, timeline_frame)
from sim.residuals import residual_table
from traces.generators import poisson, tinyllm

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_CHARTS = {"tradeoff", "gaps", "gap_ecdf", "timeline", "confirm", "confirm_error", "calibration"}


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
                 "chunked", "--budget", "64", "--json-out", str(tmp / "sim.json")]) == 0

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
    page = (out / "report.html").read_text()
    assert "skipped: no --sweep given" in page and "skipped: no --confirm given" in page
    assert not list(out.glob("*.png"))

    out2 = tmp_path / "rep2"
    assert main(["report", "--sweep", str(inputs / "sweep"), "-o", str(out2), "--no-png"]) == 0
    doc = json.loads((out2 / "report.json").read_text())
    # the sweep saved logs, so the timeline and distributions come from them
    assert set(doc["charts"]) == {"tradeoff", "gaps", "gap_ecdf", "timeline"}


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
    for args, message in [([], "nothing to report"), (["--confirm", str(bad)], "not valid JSON"),
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

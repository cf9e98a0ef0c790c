"""`pdsim report`: an offline HTML page, PNGs and JSON from a sweep, a confirm report, a profile, a run."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report", help="HTML page (altair, opens offline), PNGs and JSON from sweep/confirm/profile/simulate output",
        description="Draw whichever inputs are given: the throughput/latency trade-off and gap percentiles of a "
                    "sweep, gap distributions and a per-request timeline from event logs, predicted vs measured "
                    "from a confirm report, and calibration quality from a profile. Charts without their input "
                    "are skipped with a note.")
    p.add_argument("--sweep", metavar="DIR", help="a `pdsim sweep -o` directory (results.json, logs/)")
    p.add_argument("--capacity", metavar="DIR", help="a `pdsim capacity -o` directory (capacity.json, curve.csv)")
    p.add_argument("--confirm", metavar="FILE", help="a `pdsim confirm` report (JSON)")
    p.add_argument("--profile", metavar="FILE", nargs="+",
                   help="a `pdsim calibrate` profile with its samples (JSON); more than one: their chunk costs "
                        "against the offset side by side (a dense and a hybrid model)")
    p.add_argument("--simulate", metavar="FILE", help="the JSON of `pdsim simulate --json-out`")
    p.add_argument("--latency", metavar="METRIC", help="latency axis of the trade-off (default: the sweep's)")
    p.add_argument("--no-png", action="store_true", help="only the HTML page and report.json")
    p.add_argument("-o", "--out", required=True, metavar="OUTDIR", help="write report.html, *.png, report.json here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report in OUTDIR")


def run(args: argparse.Namespace) -> int:
    from sim.report import make_report  # altair: imported by the one command that draws
    doc = make_report(args.out, args.sweep, args.confirm, args.profile, args.simulate, args.latency,
                      args.overwrite, not args.no_png, args.capacity)
    print_written(doc, Path(args.out))
    return 0


def print_written(doc: dict, out: Path) -> None:
    """Each chart written (or why it was skipped), then the page."""
    for name, chart in doc["charts"].items():
        print(f"chart {name}: {chart['title']}" + (f" -> {out / chart['png']}" if "png" in chart else ""))
    for name, why in doc["skipped"].items():
        print(f"chart {name}: {why}")
    print(f"wrote {out / 'report.html'} (opens offline) and {out / 'report.json'}")

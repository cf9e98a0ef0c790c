"""The summary table of `benchmarks/fidelity_round.sh`'s reports: per setting, the probed machine
speed, the median |relative error| of the six aggregates at the probed speed and at the
calibration's, the tails, and how many replays took each run's path (`sim.metrics.decisions`; "-" for reports
from before confirm compared paths). `python3 benchmarks/fidelity_table.py OUT [FIRST SECOND]`: FIRST and
SECOND name the two clones under OUT (default A B); the seed and gamma runs are the second's.
`python3 benchmarks/fidelity_table.py REPORT.json...`: the same table for the reports named, then
each setting's median predicted/measured per call kind."""
import json
import signal
import statistics
import sys
from pathlib import Path

SIX = ["decode_gap_p50_ms", "decode_gap_p95_ms", "p50_ttft_ms", "p95_ttft_ms", "output_throughput", "makespan_s"]
TAILS = ["decode_gap_max_ms", "max_itl_ms", "p99_itl_ms"]
SIX_TARGET, TAIL_TARGET = 0.05, 0.10  # the six's median |error|; max gap and max ITL each


def holds(err: dict) -> bool:
    """The three targets at once: the six within 5% (median |error|), max gap and max ITL within 10%."""
    return (statistics.median(abs(err[k]) for k in SIX) <= SIX_TARGET
            and max(abs(err["decode_gap_max_ms"]), abs(err["max_itl_ms"])) <= TAIL_TARGET)


def reports(first: str, second: str) -> dict[str, str]:
    return {"tune 1": f"{first}/runs/tune-qwen3-0.6b-cpu/confirm.json",
            "tune 2": f"{second}/runs/tune-qwen3-0.6b-cpu/confirm.json",
            "tiny-llm seed": f"{second}/runs/confirm-tinyllm.json", "meTile seed": f"{second}/runs/confirm-metile.json",
            "gamma": f"{second}/runs/confirm-gamma.json"}


def main(out: Path, first: str = "A", second: str = "B") -> None:
    table({name: out / rel for name, rel in reports(first, second).items()})


def table(paths: dict[str, Path], by_kind: bool = False) -> None:
    print("| runs | setting | probes' speed, prefill / decode (predicted at) | six aggregates: probed / calibration's | "
          + " | ".join(TAILS) + " | replays on each run's path | holds |")
    print("|---|---|---|---:|" + "---:|" * len(TAILS) + "---|---|")
    held = []
    for name, path in paths.items():
        if not path.exists():
            continue
        for r in json.loads(path.read_text())["results"]:
            calib = r["at_calibration_speed"]["rel_error"]
            med = lambda e: statistics.median(abs(e[k]) for k in SIX)
            sp = r["machine_speed"]["median"] or 1.0
            sp = sp if isinstance(sp, dict) else {"prefill": sp, "decode": sp}  # reports of one speed for all calls
            tails = " | ".join(f"{r['rel_error'][k]:+.0%} ({calib[k]:+.0%})" for k in TAILS)
            at = r["machine_speed"].get("predicted_at")  # partway to the probes' speed
            at = f" ({at['prefill']:.2f} / {at['decode']:.2f})" if at else ""
            took = r.get("paths")
            same = "/".join(str(run["same"]) for run in took["runs"]) + f" of {took['replays']}" if took else "-"
            held.append(holds(r["rel_error"]))
            print(f"| {name} | {r['label']} | {sp['prefill']:.2f} / {sp['decode']:.2f}{at} | "
                  f"{med(r['rel_error']):.1%} / {med(calib):.1%} | {tails} | {same} | {'yes' if held[-1] else 'no'} |")
    print(f"\nall three targets held: {sum(held)} of {len(held)} settings")

    if by_kind:
        print("\n| runs | setting | call kind: calls, median predicted/measured |\n|---|---|---|")
        for name, path in paths.items():
            for r in json.loads(path.read_text())["results"] if path.exists() else []:
                kinds = ", ".join(f"{k['kind']} {k['calls']} @ {k['ratio_median']:.2f}" for k in r["calls_by_kind"])
                print(f"| {name} | {r['label']} | {kinds} |")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into `head`: stop quietly
    args = sys.argv[1:]
    if args and args[0].endswith(".json"):
        stems = [Path(a).stem for a in args]  # two tunes' reports are both "confirm": named by their path then
        table({(a if stems.count(Path(a).stem) > 1 else Path(a).stem): Path(a) for a in args}, by_kind=True)
    else:
        main(Path(args[0] if args else "/tmp/pdsim-round"), *args[1:3])

"""`pdsim tune`: the whole loop on built-in defaults — calibrate, sweep, pick, confirm, report.

Each step is the pdsim command of the same name, so what tune does a user can redo by hand, and
each step's files land in one output folder.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

NEEDS_MLX = True

# Defaults per device kind: the tiny-llm seed's trace, scaled down on a CPU so a tune fits in
# minutes (prompt lengths, outputs and budgets / 4, the same 8 requests at t=0 and batch size 4).
PRESETS = {
    "cpu": {"trace": ["--num-seqs", "8", "--min-in", "16", "--max-in", "128", "--min-out", "8", "--max-out", "8"],
            "budgets": ["8", "16", "32", "64", "128"], "scale": "tiny-llm's trace with prompts, outputs "
            "and budgets scaled by 1/4 (prompts 16..128, 8 outputs)"},
    "gpu": {"trace": ["--num-seqs", "8", "--min-in", "64", "--max-in", "512", "--min-out", "32", "--max-out", "32"],
            "budgets": ["16", "32", "64", "128", "256", "512"], "scale": "tiny-llm's trace as in the seed"},
}
# --engine mlx-lm: a server's traffic (Poisson arrivals, prompts longer than the smaller steps) and
# mlx_lm.server's three flags as the grid; the confirm baseline is the server's defaults.
MLX_LM_PRESETS = {
    "cpu": {"trace": ["poisson", "--num-requests", "10", "--rate", "0.4", "--min-in", "32", "--max-in", "256",
                      "--min-out", "8", "--max-out", "16"],
            "grid": ["--prefill-step", "32", "64", "128", "512", "2048", "--prompt-concurrency", "1", "2", "4", "8",
                     "--decode-concurrency", "4", "8", "32"],
            "scale": "10 Poisson arrivals at 0.4/s, prompts 32..256, 8..16 outputs"},
    "gpu": {"trace": ["poisson", "--num-requests", "32", "--rate", "2", "--min-in", "64", "--max-in", "2048",
                      "--min-out", "32", "--max-out", "256"],
            "grid": ["--prefill-step", "128", "256", "512", "1024", "2048", "--prompt-concurrency", "1", "2", "4", "8",
                     "--decode-concurrency", "8", "16", "32"],
            "scale": "32 Poisson arrivals at 2/s, prompts 64..2048, 32..256 outputs"},
}
SERVER_DEFAULTS = "mlx-lm:prefill_step=2048,prompt_concurrency=8,decode_concurrency=32"


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="calibrate (or reuse the cached profile), sweep, pick, confirm, report",
                       description="The main job on built-in defaults: a quick calibration of the model on this "
                                   "device (cached in profiles/), a sweep of fifo/eager/chunked over budgets on "
                                   "the tiny-llm trace, the pick under a latency target, a confirm of the pick "
                                   "against the eager baseline on the real engine, and an HTML report.")
    p.add_argument("--model", default="qwen3-0.6b", help="Qwen3 model (default qwen3-0.6b: the smallest official "
                                                         "size, so a tune takes minutes even on a laptop CPU)")
    p.add_argument("--profile", help="use this profile instead of the cached or a new calibration")
    p.add_argument("--recalibrate", action="store_true", help="calibrate again even if a cached profile exists")
    p.add_argument("--slo", nargs="+", metavar="CONSTRAINT",
                   help="pick constraints (default: decode_gap_p95_ms <= 2x a full-batch decode step)")
    p.add_argument("--repeats", type=int, default=3, help="confirm runs per setting (default 3: a median that one noisy run cannot move)")
    p.add_argument("--engine", choices=["pdsim", "mlx-lm"], default="pdsim",
                   help="pdsim: tune pdsim's policies on its engine (default); mlx-lm: tune mlx_lm.server's flags "
                        "(--prefill-step-size, --prompt-concurrency, --decode-concurrency) on BatchGenerator itself")
    p.add_argument("--any-mlx-lm", action="store_true", help="with --engine mlx-lm: an mlx-lm version the mlx-lm "
                                                              "policy was not checked against")
    p.add_argument("-o", "--out", help="output folder (default runs/tune-MODEL-DEVICE)")
    p.add_argument("--overwrite", action="store_true", help="reuse an existing output folder's name")


def run(args: argparse.Namespace) -> int:
    import shutil

    from calibrate.cmd_calibrate import default_profile_path
    from calibrate.host import host_info
    from sim.cli import main
    from sim.costmodel import ProfileError, check_profile_matches, cost_model, load_profile
    from sim.errors import UserError

    from calibrate.model import QWEN3_CONFIGS
    if args.model not in QWEN3_CONFIGS:
        raise UserError(f"unknown model {args.model!r}; known: {', '.join(QWEN3_CONFIGS)}")
    host = host_info()
    preset = PRESETS[host["kind"]]
    if args.engine == "mlx-lm":
        from calibrate.mlxlm_batches import installed_version
        from policies.mlxlm import check_version
        for w in check_version(installed_version(), args.any_mlx_lm):
            print(f"warning: {w}")
    out = Path(args.out or f"runs/tune-{args.model}-{host['kind']}" + ("-mlx-lm" if args.engine == "mlx-lm" else ""))
    if out.exists():
        if not args.overwrite:
            raise UserError(f"{out} exists; not overwriting it (pass --overwrite, or -o another folder)")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    print(f"pdsim tune: {args.model} on {host['name']} (BLAS: {host['blas']}); output in {out}/")
    print(f"model: {args.model}" + (" — the smallest official Qwen3, so the whole loop fits in minutes on "
                                    "this device" if args.model == "qwen3-0.6b" else ""))

    profile = Path(args.profile) if args.profile else default_profile_path(args.model, host["kind"], args.engine)
    reuse = profile.exists() and not args.recalibrate
    if reuse:
        try:
            check_profile_matches(load_profile(profile), args.model, host["id"])
        except ProfileError as e:
            if args.profile:
                raise
            print(f"cached profile not usable ({e}); calibrating again")
            reuse = False
    print("\n[1/4] calibrate: " + (f"reusing {profile}" if reuse else f"quick calibration -> {profile}"))
    if not reuse and (code := main(["calibrate", "--model", args.model, "--quick", "-o", str(profile),
                                    "--overwrite", "--engine", args.engine] + (["--any-mlx-lm"] * args.any_mlx_lm))):
        return code
    prof = load_profile(profile)
    if args.engine == "mlx-lm":
        return tune_mlx_lm(args, prof, profile, out, host)

    trace = out / "trace.jsonl"
    if code := main(["traces", "gen", "tinyllm", *preset["trace"], "-o", str(trace)]):
        return code
    slo = args.slo or [default_slo(cost_model(prof))]
    print(f"\n[2/4] sweep on {preset['scale']}; target {' '.join(slo)}, maximizing output tokens/s")
    if code := main(["sweep", "--trace", str(trace), "--policy", "fifo", "eager", "chunked", "--budget",
                     *preset["budgets"], "--batch-size", "4", "--profile", str(profile), "--model", args.model,
                     "--slo", *slo, "-o", str(out / "sweep"), "--logs", "2", "--no-progress"]):
        return code
    sweep = json.loads((out / "sweep" / "results.json").read_text())
    best = sweep["picks"][0]["best"]
    if best is None:
        print("no setting meets the target; see the sweep's Pareto front, or pass a looser --slo")
        return 1
    rows = {r["label"]: r for r in sweep["rows"]}
    settings = [spec(rows[best])] + ([spec(rows["eager/bs4"])] if best != "eager/bs4" else [])
    print(f"\n[3/4] confirm the pick {best} against the eager baseline on the real engine")
    if code := main(["confirm", "--profile", str(profile), "--trace", str(trace), "--setting", *settings,
                     "--repeats", str(args.repeats), "-o", str(out / "confirm.json")]):
        return code
    print("\n[4/4] report")
    return main(["report", "--sweep", str(out / "sweep"), "--confirm", str(out / "confirm.json"),
                 "--profile", str(profile), "-o", str(out / "report")])


def tune_mlx_lm(args, prof: dict, profile: Path, out: Path, host: dict) -> int:
    """Steps 2-4 for mlx_lm.server: sweep its three flags, confirm the pick against the server's
    defaults on BatchGenerator itself, report, and print the server's command line."""
    from policies.mlxlm import server_command
    from sim.cli import main
    from sim.costmodel import cost_model
    preset = MLX_LM_PRESETS[host["kind"]]
    trace = out / "trace.jsonl"
    if code := main(["traces", "gen", *preset["trace"], "-o", str(trace)]):
        return code
    step = cost_model(prof).mlx_lm_call("generate", 4, 0, [128] * 4, 0, 0)
    slo = args.slo or [f"decode_gap_p95_ms<={2 * step * 1e3:.0f}"]
    print(f"\n[2/4] sweep of mlx_lm.server's flags on {preset['scale']}; target {' '.join(slo)}, "
          "maximizing output tokens/s")
    if code := main(["sweep", "--trace", str(trace), "--policy", "mlx-lm", *preset["grid"], "--profile", str(profile),
                     "--model", args.model, "--slo", *slo, "-o", str(out / "sweep"), "--logs", "2", "--no-progress"]):
        return code
    sweep = json.loads((out / "sweep" / "results.json").read_text())
    best = sweep["picks"][0]["best"]
    if best is None:
        print("no setting meets the target; see the sweep's Pareto front, or pass a looser --slo")
        return 1
    row = {r["label"]: r for r in sweep["rows"]}[best]
    pick = {k: int(row[k]) for k in ("prefill_step", "prompt_concurrency", "decode_concurrency")}
    settings = [spec_mlx_lm(pick)] + ([SERVER_DEFAULTS] if spec_mlx_lm(pick) != SERVER_DEFAULTS else [])
    print(f"\n[3/4] confirm the pick {best} against mlx_lm.server's defaults on mlx-lm's BatchGenerator")
    if code := main(["confirm", "--engine", "mlx-lm", "--profile", str(profile), "--trace", str(trace), "--setting",
                     *settings, "--repeats", str(args.repeats), "-o", str(out / "confirm.json")]
                    + (["--any-mlx-lm"] * args.any_mlx_lm)):
        return code
    print("\n[4/4] report")
    if code := main(["report", "--sweep", str(out / "sweep"), "--confirm", str(out / "confirm.json"),
                     "--profile", str(profile), "-o", str(out / "report")]):
        return code
    from calibrate.model import HF_REPOS
    weights = prof["model"].get("weights")
    model = weights if weights not in (None, "random") else HF_REPOS.get(args.model, args.model)
    print(f"\nserve it with the picked flags:\n  {server_command(pick, model)}")
    return 0


def spec_mlx_lm(pick: dict) -> str:
    return "mlx-lm:" + ",".join(f"{k}={v}" for k, v in pick.items())


def default_slo(cost) -> str:
    """Tokens may wait at most twice a plain decode step of a full batch (4 requests, 128 context)."""
    step_ms = cost.decode([128] * 4) * 1e3
    return f"decode_gap_p95_ms<={2 * step_ms:.0f}"


def spec(row: dict) -> str:
    """A sweep row as a `--setting` string."""
    keys = {"budget": row.get("budget"), "batch_size": row.get("batch_size"), "decode": row.get("decode"),
            "order": row.get("order")}
    parts = [f"{k}={int(v) if k in ('budget', 'batch_size') else v}" for k, v in keys.items()
             if v is not None and v == v]
    return row["policy"] + (":" + ",".join(parts) if parts else "")

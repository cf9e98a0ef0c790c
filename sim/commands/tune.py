"""`pdsim tune`: the whole loop on built-in defaults — calibrate, sweep, pick, confirm, report.

Each step calls the library functions the pdsim command of the same name calls, and prints what
that command prints, so what tune does a user can redo by hand; each step's files land in one
output folder.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from sim.commands.common import whole
from sim.core.outdir import OutputFolder

NEEDS_MLX = True
TUNE_NAMES = ("trace.jsonl", "sweep", "capacity", "confirm.json", "confirm.json.runs", "report")  # what a tune owns

# --engine mlx-lm: a server's traffic (Poisson arrivals, prompts longer than the smaller steps) and
# mlx_lm.server's three flags as the grid, inside the device kind's quick grid
# (`calibrate.measure.grid.MLX_QUICK_FOR`: on a CPU prompt calls to 642 row-tokens and generation
# batches to 8, so at most 2 prompts and 6 generations at a time; tests/test_presets_in_grid.py).
# The confirm baseline is the server's defaults, which reach beyond a CPU's grid: measured, not picked.
MLX_LM_PRESETS = {
    "cpu": {"trace": {"num_requests": 10, "rate": 0.4, "min_in": 32, "max_in": 256, "min_out": 8, "max_out": 16},
            "grid": {"prefill_step": [32, 64, 128, 512, 2048], "prompt_concurrency": [1, 2],
                     "decode_concurrency": [2, 4, 6]},
            "scale": "10 Poisson arrivals at 0.4/s, prompts 32..256, 8..16 outputs"},
    "gpu": {"trace": {"num_requests": 32, "rate": 2, "min_in": 64, "max_in": 2048, "min_out": 32, "max_out": 256},
            "grid": {"prefill_step": [128, 256, 512, 1024, 2048], "prompt_concurrency": [1, 2, 4, 8],
                     "decode_concurrency": [8, 16, 32]},
            "scale": "32 Poisson arrivals at 2/s, prompts 64..2048, 32..256 outputs"},
}
MLX_LM_KEYS = ("prefill_step", "prompt_concurrency", "decode_concurrency")


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="calibrate (or reuse the cached profile), find the setting that serves the most "
                                    "traffic under SLOs, confirm it, report",
                       description="The main job on built-in defaults: a quick calibration of the model on this "
                                   "device (cached in profiles/); for each setting of fifo/eager/chunked over budgets "
                                   "(--engine vllm: vLLM's token budgets and sequence limits), the most traffic it "
                                   "serves while a decode-gap and a TTFT SLO derived from the calibration hold "
                                   "(`pdsim capacity`); a confirm of the pick, against the eager baseline, on the "
                                   "real engine at that rate; and an HTML report. --engine mlx-lm tunes "
                                   "mlx_lm.server's flags for throughput under a gap target instead.")
    p.add_argument("--model", default="qwen3-0.6b", help="Qwen3 model (default qwen3-0.6b: the smallest official "
                                                         "size, so a tune takes minutes even on a laptop CPU)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="the model's dtype (default: bfloat16 on a GPU, float32 on a CPU, as each runs fastest)")
    p.add_argument("--quant-bits", type=int, choices=[4, 8], help="quantize the weights (mlx.nn.quantize), as "
                                                                 "mlx-community's 4- and 8-bit models are")
    p.add_argument("--profile", help="use this profile instead of the cached or a new calibration")
    p.add_argument("--recalibrate", action="store_true", help="calibrate again even if a cached profile exists")
    p.add_argument("--slo", nargs="+", metavar="CONSTRAINT",
                   help="the SLOs every setting must hold (default: decode_gap_p95_ms <= a decode step and a chunk "
                        "between the middle budget and the next, p99_ttft_ms <= 10x the longest prompt's prefill; "
                        "mlx-lm: a gap target)")
    p.add_argument("--repeats", type=whole(1, 1000), default=3, help="confirm runs per setting (default 3: a median that one noisy run cannot move)")
    p.add_argument("--engine", choices=["pdsim", "mlx-lm", "vllm"], default="pdsim",
                   help="pdsim: tune pdsim's policies on its engine (default); mlx-lm: tune mlx_lm.server's flags "
                        "(--prefill-step-size, --prompt-concurrency, --decode-concurrency) on BatchGenerator itself; "
                        "vllm: vLLM's scheduler (--max-num-batched-tokens, --max-num-seqs), one forward per iteration")
    p.add_argument("--any-mlx-lm", action="store_true", help="with --engine mlx-lm: an mlx-lm version the mlx-lm "
                                                              "policy was not checked against")
    p.add_argument("-o", "--out", help="output folder (default runs/tune-MODEL-DEVICE)")
    p.add_argument("--overwrite", action="store_true", help="reuse an existing output folder's name")


DEFAULT_DTYPE = {"cpu": "float32", "gpu": "bfloat16"}  # what each device kind runs fastest (a CPU has no fast half)


def run(args: argparse.Namespace) -> int:
    import shutil

    from calibrate.engine.model import MODELS
    from calibrate.host.machine import host_info
    from sim.core.errors import UserError
    from sim.sweep.results import SweepPlan

    if args.model not in MODELS:
        raise UserError(f"unknown model {args.model!r}; known: {', '.join(MODELS)}")
    if args.slo:  # read as the sweep will read it, before a calibration of minutes
        _ = SweepPlan({}, [], {}, slo=args.slo).targets  # its goodput targets parsed too
    host = host_info()
    if args.engine == "mlx-lm":
        from calibrate.engine.mlxlm_batches import installed_version
        from policies.mlxlm import check_version
        for w in check_version(installed_version(), args.any_mlx_lm):
            print(f"warning: {w}")
    out = Path(args.out or f"runs/tune-{args.model}-{host['kind']}" + ("" if args.engine == "pdsim" else f"-{args.engine}"))
    if out.exists() and not args.overwrite:
        raise UserError(f"{out} exists; not overwriting it (pass --overwrite, or -o another folder)")
    with OutputFolder(out, TUNE_NAMES, args.overwrite, "tune output folder"):  # locked; checked before any work
        for name in TUNE_NAMES:  # --overwrite removes what an earlier tune wrote, and nothing else
            old = out / name
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            elif old.exists() or old.is_symlink():
                old.unlink()
        return _run(args, out, host)


def _run(args: argparse.Namespace, out: Path, host: dict) -> int:
    import time

    from calibrate.calibration import calibrate
    from calibrate.measure.grid import QUICK_FOR
    from calibrate.profiles import default_profile_path
    from sim.commands import calibrate_cmd
    from sim.cost.fields import ProfileError
    from sim.cost.profile import check_profile_matches, load_profile

    print(f"pdsim tune: {args.model} on {host['name']} (BLAS: {host['blas']}); output in {out}/")
    print(f"model: {args.model}" + (" — the smallest official Qwen3, so the whole loop fits in minutes on "
                                    "this device" if args.model == "qwen3-0.6b" else ""))

    profile_engine = "mlx-lm" if args.engine == "mlx-lm" else "pdsim"  # vLLM's forwards: pdsim's profile prices them
    dtype = args.dtype or DEFAULT_DTYPE[host["kind"]]
    precision = "" if dtype == DEFAULT_DTYPE[host["kind"]] and not args.quant_bits else \
        dtype + (f"-q{args.quant_bits}" if args.quant_bits else "")
    asked = not args.profile or args.dtype is not None or args.quant_bits is not None  # (else: the profile's)
    if asked:
        print(f"precision: {dtype}" + (f", weights quantized to {args.quant_bits} bits" if args.quant_bits else ""))
    profile = Path(args.profile) if args.profile else \
        default_profile_path(args.model, host["kind"], profile_engine, precision)
    reuse = profile.exists() and not args.recalibrate
    if reuse:
        try:
            made = load_profile(profile)
            check_profile_matches(made, args.model, host["id"])
            if asked and (made["model"].get("dtype"), made["model"].get("quant_bits")) != (dtype, args.quant_bits):
                raise ProfileError(f"profile {profile} is of {made['model'].get('dtype')} weights"
                                   + (f" quantized to {made['model']['quant_bits']} bits" if made["model"].get("quant_bits")
                                      else "") + f"; this tune asks for {dtype}"
                                   + (f" quantized to {args.quant_bits} bits" if args.quant_bits else ""))
        except ProfileError as e:
            if args.profile:
                raise
            print(f"cached profile not usable ({e}); calibrating again")
            reuse = False
    print("\n[1/4] calibrate: " + (f"reusing {profile}" if reuse else f"quick calibration -> {profile}"))
    if not reuse:
        t0 = time.perf_counter()
        if args.engine == "mlx-lm":
            from calibrate.measure.grid import MLX_QUICK_FOR
            from calibrate.mlxlm_calibration import calibrate_mlx_lm
            made = calibrate_mlx_lm(args.model, MLX_QUICK_FOR[host["kind"]], profile, overwrite=True, any_mlx_lm=args.any_mlx_lm,
                                    dtype=dtype, quant_bits=args.quant_bits)
        else:
            made = calibrate(args.model, QUICK_FOR[host["kind"]], profile, overwrite=True, dtype=dtype,
                             quant_bits=args.quant_bits)
        calibrate_cmd.report(made, "quick", time.perf_counter() - t0)
    prof = load_profile(profile)
    for w in check_profile_matches(prof, args.model):
        print(f"warning: {w}")
    if args.engine == "mlx-lm":
        return tune_mlx_lm(args, prof, profile, out, host)

    from sim.commands.tune_capacity import tune_capacity
    return tune_capacity(args, prof, profile, out, host)


def tune_mlx_lm(args, prof: dict, profile: Path, out: Path, host: dict) -> int:
    """Steps 2-4 for mlx_lm.server: sweep its three flags, confirm the pick against the server's
    defaults on BatchGenerator itself, report, and print the server's command line."""
    from calibrate.confirm.protocol import confirm
    from calibrate.engine.model import HF_REPOS
    from policies.mlxlm import server_command
    from policies.settings import grid_settings, setting
    from sim.commands import confirm as confirm_cmd
    from sim.commands import report as report_cmd
    from sim.commands import sweep as sweep_cmd
    from sim.commands.tune_capacity import constraints_of
    from sim.cost.profile import cost_model
    from sim.report import make_report
    from sim.sweep.pick import Objective
    from sim.sweep.results import SweepPlan
    from traces.generators import poisson

    preset = MLX_LM_PRESETS[host["kind"]]
    trace_path = out / "trace.jsonl"
    trace = poisson(**preset["trace"])
    trace.save_jsonl(trace_path)
    print(f"wrote {trace_path}: {len(trace)} requests, sha256 {trace.sha256()}")
    grid = preset["grid"]
    slo = args.slo or [mlx_lm_default_slo(cost_model(prof), min(grid["prefill_step"]))]
    print(f"\n[2/4] sweep of mlx_lm.server's flags on {preset['scale']}; target {' '.join(slo)}, "
          "maximizing output tokens/s")
    settings = grid_settings(["mlx-lm"], prefill_steps=grid["prefill_step"],
                             prompt_concurrencies=grid["prompt_concurrency"],
                             decode_concurrencies=grid["decode_concurrency"])
    plan = SweepPlan({trace_path.stem: trace}, settings, prof, slo=slo, objective=Objective())
    result = sweep_cmd.execute(plan, out / "sweep", {"policy": ["mlx-lm"], **grid}, logs=2, progress=False)
    best = result.picks[0].best
    if best is None:
        print("no setting meets the target; see the sweep's Pareto front, or pass a looser --slo")
        return 1
    pick = setting({"policy": "mlx-lm", **{k: int(best[k]) for k in MLX_LM_KEYS}})
    server = setting({"policy": "mlx-lm"})  # mlx_lm.server's defaults
    chosen = [pick] + ([server] if pick != server else [])
    print(f"\n[3/4] confirm the pick {best['label']} against mlx_lm.server's defaults on mlx-lm's BatchGenerator")
    report_path = out / "confirm.json"
    report = confirm(prof, trace, chosen, report_path, args.repeats, engine="mlx-lm", any_mlx_lm=args.any_mlx_lm,
                     slo=constraints_of(slo))
    if code := confirm_cmd.print_report(report, str(report_path), None):
        return code
    print("\n[4/4] report")
    doc = make_report(out / "report", out / "sweep", report_path, profile)
    report_cmd.print_written(doc, out / "report")
    weights = prof["model"].get("weights")
    model = weights if weights not in (None, "random") else HF_REPOS.get(args.model, args.model)
    print(f"\nserve it with the picked flags:\n  {server_command(pick, model)}")
    return 0


def mlx_lm_default_slo(cost, smallest_step: int) -> str:
    """Tokens may wait at most two generation steps of a full batch (4 requests, 128 context) and
    one prompt call of the grid's smallest prefill step. While a prompt waits, every `next()` of
    BatchGenerator runs a step and a prompt call, so a target of two steps alone rules out every
    setting for qwen3-0.6b on a 2-core CPU: the smallest step's p95 gap is 640 ms, two steps 580."""
    from sim.metrics.registry import DEFAULT_LATENCY
    step = cost.mlx_lm_call("generate", 1, 0, [128] * 4, 0, 0)
    prompt = cost.mlx_lm_call("prompt", smallest_step, 0, [0], 0, 0)
    return f"{DEFAULT_LATENCY}<={(2 * step + prompt) * 1e3:.0f}"

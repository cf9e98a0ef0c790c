"""`pdsim calibrate`: time the real engine's steps on this device and write a cost profile."""
from __future__ import annotations

import argparse
import mmap
import statistics
import time
from pathlib import Path

from sim.commands.common import seed_int, whole
from sim.core.errors import InputError
from sim.core.files import check_output
from sim.cost.noise import DISTURBED, NOISY, CallNoise
from sim.predict import REPLICAS
from traces.schema import MAX_TOKENS

NEEDS_MLX = True
MAX_BATCH = 1024  # decode batch sizes a grid may time


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="time the real engine's steps (MLX) and fit a cost profile",
                       description="Time prefill chunks and decode steps of a Qwen3 model on this device "
                                   "over a grid, fit the cost model, and write a profile JSON.")
    add_model_args(p)
    p.add_argument("-o", "--out", help="profile to write (default profiles/MODEL-DEVICE.json; "
                                        "--engine mlx-lm: profiles/MODEL-DEVICE-mlx-lm.json)")
    p.add_argument("--engine", choices=["pdsim", "mlx-lm"], default="pdsim",
                   help="whose calls to time: pdsim's engine (default), or mlx-lm's BatchGenerator (mlx_lm.server: "
                        "batched prompt calls, generation steps, first forwards, merges; its own grid and engine runs)")
    p.add_argument("--any-mlx-lm", action="store_true",
                   help="with --engine mlx-lm: time an mlx-lm version the mlx-lm policy was not checked against")
    p.add_argument("--quick", action="store_true", help="the quick grid (minutes on a laptop CPU)")
    p.add_argument("--grid", choices=["quick", "quick-gpu", "full", "tiny"],
                   help="grid to time (default full; --quick = quick: on a GPU, quick-gpu, which covers what "
                        "`pdsim tune` sweeps there)")
    tokens = whole(1, MAX_TOKENS)
    p.add_argument("--chunks", type=tokens, nargs="+", help="override the grid's prefill chunk sizes")
    p.add_argument("--offsets", type=whole(0, MAX_TOKENS), nargs="+", help="override the grid's prefill cache offsets")
    p.add_argument("--batches", type=whole(1, MAX_BATCH, " requests in one decode"), nargs="+",
                   help="override the grid's decode batch sizes")
    p.add_argument("--contexts", type=tokens, nargs="+", help="override the grid's decode context lengths")
    p.add_argument("--repeats", type=whole(1, 1000), help="override the rounds: how often each point is timed, each "
                                                          "round visiting every point once in a fresh shuffled order")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the point order and the held-out split")
    p.add_argument("--overwrite", action="store_true", help="replace an existing profile")
    p.add_argument("--add-rounds", metavar="PROFILE",
                   help="time more rounds (--repeats of them, default the grid's) of an existing calibration's "
                        "points on this device, fit all rounds together, and write the result to -o")
    p.add_argument("--steps", nargs="+", choices=["prefill", "decode", "overhead"],
                   help="with --add-rounds: time only these steps' points (default all)")
    p.add_argument("--refit", metavar="PROFILE",
                   help="no measuring: fit again the samples of an existing profile (e.g. after the cost "
                        "model's forms changed) and write the result to -o")
    p.add_argument("--from-runs", nargs="+", metavar="REPORT",
                   help="no measuring: refit the profile these confirm reports were predicted with (or --refit's) "
                        "with every call of their runs added to its samples; print how the errors changed")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="qwen3-0.6b",
                   help="qwen3-0.6b | qwen3-1.7b | qwen3-4b | qwen3-8b | qwen3-tiny (dense); qwen3.5-0.8b | "
                        "qwen3.5-tiny (hybrid: linear-attention layers) (default qwen3-0.6b)")
    p.add_argument("--weights", help="real weights: a local Hugging Face snapshot directory, or 'hf-cache' "
                                     "(offline lookup); default: random weights in the official shapes")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="weights and activations (default float32: bf16 is slow on CPUs)")
    p.add_argument("--quant-bits", type=int, choices=[4, 8], help="quantize weights (mlx.nn.quantize)")


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from calibrate.calibration import add_rounds, calibrate, from_runs, refit
    from calibrate.measure.grid import GRIDS, QUICK_NAME
    sources = [args.refit, args.add_rounds, *(args.from_runs or [])]
    if args.out:  # before any work: an existing profile, an input, a folder that cannot be written
        check_output(args.out, args.overwrite, sources, what="profile")
    if args.from_runs:
        if not args.out:
            raise InputError("--from-runs needs -o for the refitted profile")
        prof, before = from_runs([Path(r) for r in args.from_runs], Path(args.out),
                                 Path(args.refit) if args.refit else None, args.seed, args.overwrite)
        report(prof, "with confirm runs", 0.0)
        report_change(before, prof["fit"])
        return 0
    if args.refit:
        if not args.out:
            raise InputError("--refit needs -o for the refitted profile")
        report(refit(Path(args.refit), Path(args.out), args.seed, args.overwrite), "refit", 0.0)
        return 0
    if args.steps and not args.add_rounds:
        raise InputError("--steps goes with --add-rounds")
    overrides = {k: getattr(args, k) for k in ("chunks", "offsets", "batches", "contexts", "repeats")
                 if getattr(args, k) is not None}
    if args.add_rounds:
        if not args.out:
            raise InputError("--add-rounds needs -o for the profile with the added rounds")
        t0 = time.perf_counter()
        prof = add_rounds(Path(args.add_rounds), Path(args.out), args.repeats, args.steps, args.seed, args.overwrite)
        report(prof, "with added rounds", time.perf_counter() - t0)
        return 0
    grid_name = args.grid or ("quick" if args.quick else "full")
    if grid_name == "quick":  # the device kind's own (a GPU's covers what tune sweeps there)
        from calibrate.host.machine import host_info
        grid_name = QUICK_NAME[host_info()["kind"]]
    if args.engine == "mlx-lm":
        return run_mlx_lm(args, grid_name, overrides)
    grid = replace(GRIDS[grid_name], **overrides)
    out = Path(args.out) if args.out else None
    t0 = time.perf_counter()
    prof = calibrate(args.model, grid, out, dtype=args.dtype, quant_bits=args.quant_bits,
                     weights=args.weights, seed=args.seed, overwrite=args.overwrite)
    report(prof, grid_name, time.perf_counter() - t0)
    return 0


def run_mlx_lm(args: argparse.Namespace, grid_name: str, overrides: dict) -> int:
    """`--engine mlx-lm`: mlx-lm BatchGenerator's calls (`calibrate.mlxlm_calibration`)."""
    from dataclasses import replace

    from calibrate.host.machine import host_info
    from calibrate.measure.grid import MLX_GRIDS
    from calibrate.mlxlm_calibration import calibrate_mlx_lm
    from calibrate.profiles import default_profile_path
    unused = [k for k in overrides if k != "repeats"]
    if unused or args.add_rounds or args.from_runs:
        bad = f"--{unused[0]}" if unused else "--add-rounds" if args.add_rounds else "--from-runs"
        raise InputError(f"{bad} applies to pdsim's engine, not to --engine mlx-lm")
    grid = replace(MLX_GRIDS[grid_name], **overrides)
    out = Path(args.out) if args.out else default_profile_path(args.model, host_info()["kind"], "mlx-lm")
    t0 = time.perf_counter()
    prof = calibrate_mlx_lm(args.model, grid, out, dtype=args.dtype, quant_bits=args.quant_bits, weights=args.weights,
                            seed=args.seed, overwrite=args.overwrite, any_mlx_lm=args.any_mlx_lm)
    report(prof, grid_name, time.perf_counter() - t0)
    return 0


def report(prof: dict, grid_name: str, wall: float) -> None:
    print(f"calibrated {prof['model']['name']} ({prof['model']['dtype']}) on {prof['device']['name']}, "
          f"BLAS: {prof['device']['blas']}" + (f"; mlx-lm {prof['device'].get('mlx_lm')} BatchGenerator's calls"
                                                if prof.get("engine") == "mlx-lm" else ""))
    print(f"grid {grid_name}: {len(prof['samples'])} points in {wall:.0f} s")
    for step, e in prof["fit"]["errors"].items():
        grid = lambda k: f"; grid interpolation mean {e[k + '_mean']:.1%} max {e[k + '_max']:.1%}" if k + "_mean" in e else ""
        print(f"  {step:8s} held-out relative error ({e['held_out']} points): form mean {e['form_mean']:.1%} "
              f"max {e['form_max']:.1%}{grid('grid')}")
        if "cv_form_mean" in e:
            print(f"  {'':8s} cross-validated ({e['held_out'] + e['train']} points, {e['cv_folds']} folds): "
                  f"form mean {e['cv_form_mean']:.1%} max {e['cv_form_max']:.1%}{grid('cv_grid')}; "
                  f"repeat noise {e['repeat_noise']:.1%}" + (f"; uses the {e['use']}" if "use" in e else ""))
    speed = prof["fit"].get("speed_by_round") or []
    if len(speed) > 1:
        drift = max(speed) / min(speed) - 1
        print(f"  machine speed by round (timing / median): {' '.join(f'{x:.2f}' for x in speed)}; drift {drift:.0%}"
              + (f"; above {DISTURBED - 1:.0%}: something else ran, or the machine is shared; calibrate again on a "
                 "quiet machine" if drift > DISTURBED - 1 else ""))
    noise = CallNoise.from_json(prof["fit"].get("noise"))
    if noise is not None:
        print(f"  call noise (a timing over its point's median; confirm replays {REPLICAS} times with it): "
              f"p5 {noise.at(0.05):.2f}, p50 {noise.at(0.5):.2f}, p95 {noise.at(0.95):.2f}, max {noise.at(1):.2f} "
              f"over {noise.calls} timings" + ("; a p95 above 1.3: something else ran in most rounds, and tails will "
                                               "be predicted high; calibrate again on a quiet machine"
                                               if noise.at(0.95) > NOISY else ""))
    c = prof["cost"]
    if "mlx_lm" in c:
        report_mlx_lm(c["mlx_lm"])
    if "decode" not in c:
        if "replay" in prof["fit"]:
            report_replay(prof["fit"]["replay"])
        if "pipelined_replay" in prof["fit"]:
            report_pipelined(prof["fit"]["pipelined_replay"])
        print(f"wrote {prof['_path']}")
        return
    d, pf = c["decode"], c["prefill"]
    slopes = f"{d['coef'][2] * 1e6:.2f} us per row-token"
    if "knot" in d:
        slopes += f" up to {d['knot']:.0f} tokens, {d['coef'][3] * 1e6:.2f} us beyond"
    if "lone" in d:
        slopes += f"; a single decode {d['lone'] * 1e6:.2f} us per token"
    print(f"  decode attention: {slopes}")
    if pf.get("tile"):
        print(f"  prefill: rows beyond a multiple of {pf['tile']} cost {remainder_text(pf['remainder'])}")
    per = lambda abc: f"{abc[0] * 1e3:.1f} ms" + (f" + {abc[1] * 1e3:.1f} ms/row + {abc[2] * 1e6:.1f} us/row-token"
                                                  if abc[1] or abc[2] else "")
    print(f"  iteration overhead {c['iteration'] * 1e3:.2f} ms; KV buffer written {c.get('copy', 0) * 1e6:.1f} us "
          f"per token-row (fresh: {c.get('fresh', 0) * 1e6:.1f} us more"
          + (f", {c['fresh_step'] * 1e6:.1f} us in a step's own growth" if c.get("fresh_step") is not None else "")
          + (f"; a decode's own growth {c['grow'] * 1e6:.1f} us a row" if c.get("grow") is not None else "")
          + (f", a single decode's {c['grow_single'] * 1e6:.1f}" if c.get("grow_single") is not None else "")
          + (f"; a leave's gather {c['gather'] * 1e6:.1f} us" if c.get("gather") is not None else "")
          + f"); batch join {per(c['join'])}; leave {per(c['leave'])}")
    probes = [r["probe"] for r in prof.get("engine_runs") or ()
              if (r.get("probe") or {}).get("alloc_s") and r["probe"].get("alloc_method")]
    if probes:  # probes that timed fresh memory (`calibrate.measure.speed_probe.allocation_seconds`)
        ms, size = statistics.median(t for p in probes for t in p["alloc_s"]) * 1e3, probes[0]["alloc_bytes"]
        page = mmap.PAGESIZE  # printed where it was calibrated: this host's page (16 KiB on macOS)
        print(f"  fresh memory: {size >> 20} MiB mapped and touched in {ms:.0f} ms ({ms * 1e3 * page / size:.1f} us "
              f"a {page >> 10} KiB page; median of {sum(len(p['alloc_s']) for p in probes)} probes; confirm reports its speed "
              "against this)"
              + (f"; a fault the host backs: {prof['fit']['page_fault_s'] * 1e6:.1f} us a page (the dearest probes), "
                 "the price of a single decode's growth" if prof["fit"].get("page_fault_s") is not None else ""))
    if "replay" in prof["fit"]:
        report_replay(prof["fit"]["replay"])
    report_memory(prof.get("memory"))
    print(f"wrote {prof['_path']}")


def remainder_text(rem: list[float]) -> str:
    """A tile's remainder prices, as `report` prints them (older profiles have two)."""
    text = f"{rem[0] * 1e3:.1f} ms + {rem[1] * 1e3:.2f} ms per row"
    return text + (f" + {rem[2] * 1e6:.1f} us per row of the call" if len(rem) > 2 else "")


def report_memory(m: dict | None) -> None:
    """The peak-memory model (`sim.engine.memory`): its sizes, and its errors on points and runs it has not seen."""
    if not m:
        return
    if m.get("prefill") is None:
        print(f"  peak memory: {m.get('note', 'not measured')}")
        return
    print(f"  peak memory: weights {m['weights_bytes'] / 1e9:.3f} GB, KV {m['kv_bytes_per_token'] / 1e3:.1f} KB "
          "per token-row; a call's rise above what it holds (its KV copies and activations):")
    for step in ("prefill", "decode"):
        e = m.get("errors", {}).get(step)
        if e:
            print(f"    {step:8s} held-out relative error ({e['held_out']} points) mean {e['form_mean']:.1%} max "
                  f"{e['form_max']:.1%}; cross-validated mean {e['cv_form_mean']:.1%} max {e['cv_form_max']:.1%}")
    for r in m.get("errors", {}).get("runs", []):
        print(f"    engine run {r['name']} ({r['part']}): whole peak predicted {r['predicted_bytes'] / 1e9:.4f} GB, "
              f"measured {r['measured_bytes'] / 1e9:.4f} GB ({r['rel_error']:+.1%})")


def report_mlx_lm(m: dict) -> None:
    """The fitted mlx-lm forms in a few numbers."""
    g, pr = m["generate"], m["prompt"]
    knot = f" up to {g['knot']:.0f} tokens, {g['coef'][3] * 1e6:.2f} us beyond" if "knot" in g else ""
    print(f"  mlx-lm generation step: {g['coef'][2] * 1e6:.2f} us per row-token{knot}; a first forward "
          f"{g['first'] * 1e3:.1f} ms more; prompt call attention {pr['coef'][2] * 1e9:.2f} ns per row-token x "
          f"(position + chunk)")
    if pr.get("tile"):
        print(f"  mlx-lm prompt call: rows x chunk beyond a multiple of {pr['tile']} cost "
              f"{remainder_text(pr['remainder'])}")
    print(f"  mlx-lm KV buffer written {m['copy'] * 1e6:.1f} us per token-row (fresh: {m['fresh'] * 1e6:.1f} us "
          f"more); host work between next() calls {m['iteration'] * 1e3:.2f} ms")
    if m.get("host"):
        parts = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(m["host"].items()))
        tails = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted((m.get("tail") or {}).items()))
        print(f"  mlx-lm host part of each call (next() builds it while the device runs the one before): {parts}"
              + (f"; device time left of it when queued: {tails}" if tails else ""))


def report_change(before: dict, after: dict) -> None:
    """Held-out errors before and after a refit, side by side."""
    print("  held-out error, before -> after:")
    for step, e in after["errors"].items():
        b = before.get("errors", {}).get(step, {})
        print(f"    {step:8s} cross-validated mean {b.get('cv_form_mean', float('nan')):.1%} -> {e['cv_form_mean']:.1%}")
    old = {r["kind"]: r for r in before.get("replay", {}).get("by_kind", [])}
    for r in after.get("replay", {}).get("by_kind", []):
        if r["kind"] in old:
            print(f"    engine replay {r['kind']:8s} median |error| {old[r['kind']]['abs_error_median']:.1%} -> "
                  f"{r['abs_error_median']:.1%}")


def report_pipelined(r: dict) -> None:
    """The held-out run served as mlx_lm.server serves (pipelined), each call's span as the simulator times it."""
    print(f"  engine replay, held out, pipelined as the server runs ({r['calls']} calls; a call's span, "
          "host time): predicted/measured by call kind")
    for row in r["by_kind"]:
        print(f"    {row['kind']:8s} {row['calls']:4d} calls  median {row['ratio_median']:.3f}  "
              f"p10..p90 {row['ratio_p10']:.3f}..{row['ratio_p90']:.3f}  median |error| {row['abs_error_median']:.1%}")


def report_replay(r: dict) -> None:
    """The held-out engine runs' calls, priced by the fitted model: predicted/measured by kind."""
    between = f"between calls {r['between_calls_share']:.2%} of the time, " if "between_calls_share" in r else ""
    print(f"  engine replay, held out ({r['calls']} calls; {between}KV copies {r['copy_share']:.1%}): "
          "predicted/measured by call kind")
    for run, v in (r.get("speeds") or {}).items():
        print(f"    (run {run} timed at {v.get('prefill', 1.0):.2f}x the calibration's prefill speed, "
              f"{v.get('decode', 1.0):.2f}x its decode speed, by its probe; its times are brought back)")
    for row in r.get("by_kind", []) + ((r.get("mixed") or {}).get("by_kind") or []):  # vLLM's forwards: their own fit
        print(f"    {row['kind']:8s} {row['calls']:4d} calls  median {row['ratio_median']:.3f}  "
              f"p10..p90 {row['ratio_p10']:.3f}..{row['ratio_p90']:.3f}  median |error| {row['abs_error_median']:.1%}")

"""Arguments several commands share: the trace, the policy grid, the profile, the SLO."""
from __future__ import annotations

import argparse
import itertools

import policies
from sim.costmodel import BUILTIN, check_profile_matches, cost_model, load_profile
from sim.metrics import Slo, parse_slo
from traces.load import resolve
from traces.trace import Trace


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def add_trace_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trace")
    g.add_argument("--trace", default="tinyllm",
                   help="a generator (tinyllm, poisson, gamma, metile) or a trace file (default: tinyllm)")
    g.add_argument("--num-seqs", type=positive_int, help="tinyllm: number of requests (default 8)")
    g.add_argument("--num-requests", type=positive_int, help="poisson/gamma: number of requests")
    g.add_argument("--rate", type=positive_float, help="poisson/gamma: requests per second")
    g.add_argument("--burstiness", type=positive_float, help="gamma: 1 = Poisson, >1 burstier")
    g.add_argument("--min-in", type=positive_int)
    g.add_argument("--max-in", type=positive_int)
    g.add_argument("--min-out", type=positive_int)
    g.add_argument("--max-out", type=positive_int)
    g.add_argument("--prompt-len", type=positive_int, help="metile: prompt tokens of A and B")
    g.add_argument("--output-len", type=positive_int, help="metile: outputs of A and B")
    g.add_argument("--seed", type=int, help="generator seed (default 0)")
    f = p.add_argument_group("trace file (any supported format; see `pdsim traces info --help`)")
    f.add_argument("--format", metavar="NAME", help="the file's format, if not detected from its header")
    f.add_argument("--arrivals", choices=["poisson", "gamma"], help="length-only CSVs: arrival process")
    add_shaping_args(p)


def add_shaping_args(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("shaping (applied in this order)")
    s.add_argument("--window", metavar="START:END", type=_window,
                   help="keep arrivals in [START, END) seconds, shifted to start at 0 (either side may be empty)")
    s.add_argument("--first", type=positive_int, metavar="N", help="keep the first N requests")
    s.add_argument("--sample", type=positive_int, metavar="N", help="keep N requests drawn at random (--seed)")
    s.add_argument("--speed", type=positive_float, metavar="K", help="replay K times as fast (arrivals / K)")
    s.add_argument("--max-prompt", type=positive_int, metavar="N", help="cut prompts to at most N tokens")
    s.add_argument("--max-output", type=positive_int, metavar="N", help="cut output budgets to at most N tokens")


def _window(text: str):
    from traces.shape import parse_window
    from traces.trace import TraceError
    try:
        return parse_window(text)
    except TraceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def shaping_from_args(args: argparse.Namespace):
    from traces.shape import Shaping
    return Shaping(window=args.window, first=args.first, sample=args.sample,
                   seed=args.seed if args.seed is not None else 0, speed=args.speed,
                   max_prompt=args.max_prompt, max_output=args.max_output)


GEN_OPTIONS = {
    "tinyllm": ("num_seqs", "min_in", "max_in", "min_out", "max_out", "seed"),
    "poisson": ("num_requests", "rate", "min_in", "max_in", "min_out", "max_out", "seed"),
    "gamma": ("num_requests", "rate", "burstiness", "min_in", "max_in", "min_out", "max_out", "seed"),
    "metile": ("prompt_len", "output_len", "seed"),
}


def trace_from_args(args: argparse.Namespace) -> Trace:
    """A generated trace (with the generator options) or a file (with its format), then shaped."""
    shaping = shaping_from_args(args)
    if args.trace in GEN_OPTIONS:
        names = GEN_OPTIONS[args.trace]
        return resolve(args.trace, shaping=shaping, **{k: getattr(args, k) for k in names})
    return resolve(args.trace, fmt=args.format, shaping=shaping, arrivals=args.arrivals, rate=args.rate,
                   burstiness=args.burstiness, seed=args.seed)


def add_policy_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    n = "+" if many else None
    g = p.add_argument_group("policy" + (" grid (several values make several settings)" if many else ""))
    g.add_argument("--policy", nargs=n, default=["chunked"] if many else "chunked",
                   help=f"one of: {', '.join(policies.POLICIES)} (default chunked)")
    g.add_argument("--budget", nargs=n, type=positive_int, default=[128] if many else 128,
                   help="prompt tokens per iteration, the chunk budget (default 128)")
    g.add_argument("--batch-size", nargs=n, type=positive_int, default=[4] if many else 4,
                   help="maximum requests decoding at once (default 4)")
    g.add_argument("--decode", nargs=n, choices=["batched", "single"], default=["batched"] if many else "batched",
                   help="batched: one call for all; single: one call per request")
    g.add_argument("--order", nargs=n, choices=["chunk-first", "decode-first"],
                   default=["chunk-first"] if many else "chunk-first")
    for key, default in MLX_LM_DEFAULTS.items():  # mlx_lm.server's flags, for the mlx-lm policy
        g.add_argument("--" + key.replace("_", "-"), nargs=n, type=positive_int, default=[default] if many else default,
                       help=policies.OPTION_HELP[key])
    if many:
        g.add_argument("--setting", nargs="+", metavar="POLICY[:KEY=VALUE,...]",
                       help="explicit settings instead of a grid, e.g. eager "
                            "chunked:budget=128,order=decode-first mlx-lm:prefill_step=512 (keys: budget, batch_size, "
                            "decode, order; mlx-lm: prefill_step, prompt_concurrency, decode_concurrency; "
                            "unset keys take the first value of the grid options)")


MLX_LM_DEFAULTS = {"prefill_step": 2048, "prompt_concurrency": 8, "decode_concurrency": 32}  # mlx_lm.server's
PDSIM_KEYS = ("budget", "batch_size", "decode", "order")


def settings_from_args(args: argparse.Namespace) -> list[dict]:
    """The settings the arguments name: explicit `--setting`s, or the grid of the policy options.

    eager and fifo prefill whole prompts, so budgets do not multiply them; mlx-lm takes its own
    three options (mlx_lm.server's flags) and the others take none of them.
    """
    as_list = lambda v: v if isinstance(v, list) else [v]
    keys = PDSIM_KEYS + tuple(MLX_LM_DEFAULTS)
    if getattr(args, "setting", None):
        first = {k: as_list(getattr(args, k, MLX_LM_DEFAULTS.get(k)))[0] for k in keys}
        combos = [parse_setting(text, first) for text in args.setting]
    else:
        combos = []
        for pol in as_list(args.policy):
            grid = MLX_LM_DEFAULTS if pol == "mlx-lm" else PDSIM_KEYS
            values = [as_list(getattr(args, k, MLX_LM_DEFAULTS.get(k))) for k in grid]
            combos += [{"policy": pol, **dict(zip(grid, v))} for v in itertools.product(*values)]
    out, seen = [], set()
    for s in combos:
        for k in (PDSIM_KEYS if s["policy"] == "mlx-lm" else MLX_LM_DEFAULTS):
            s.pop(k, None)
        if s["policy"] in ("eager", "fifo"):
            s["budget"] = None
        policies.make(**s)  # fail early on a bad setting
        key = tuple(s.values())
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def parse_setting(text: str, defaults: dict) -> dict:
    """`chunked:budget=128,order=decode-first` -> a setting dict; ValueError naming the bad part."""
    name, _, rest = text.partition(":")
    s = {"policy": name, **defaults}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in defaults:
            raise ValueError(f"--setting {text!r}: expected KEY=VALUE with KEY one of {', '.join(defaults)}")
        if key in ("budget", "batch_size") or key in MLX_LM_DEFAULTS:
            try:
                s[key] = int(val)
            except ValueError:
                raise ValueError(f"--setting {text!r}: {key} must be a whole number, got {val!r}") from None
        else:
            s[key] = val
    return s


def setting_label(s: dict) -> str:
    if s["policy"] == "mlx-lm":  # step, prompt and decode concurrency: mlx_lm.server's three flags
        return f"mlx-lm/s{s.get('prefill_step', 2048)}/p{s.get('prompt_concurrency', 8)}/d{s.get('decode_concurrency', 32)}"
    parts = [s["policy"]] + ([f"b{s['budget']}"] if s.get("budget") else []) + [f"bs{s['batch_size']}"]
    if s.get("decode", "batched") != "batched":
        parts.append(s["decode"])
    if s.get("order", "chunk-first") != "chunk-first":
        parts.append(s["order"])
    return "/".join(parts)


def add_profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="cost profile JSON from `pdsim calibrate` (default: the built-in "
                                     "illustrative profile, shaped like Qwen3-0.6B on an Apple M4 Pro)")
    p.add_argument("--model", help="refuse a profile made for another model")
    p.add_argument("--force", action="store_true", help="use a profile for another model or device anyway")


def profile_from_args(args: argparse.Namespace) -> dict:
    prof = load_profile(args.profile or BUILTIN)
    for w in check_profile_matches(prof, getattr(args, "model", None), force=getattr(args, "force", False)):
        print(f"warning: {w}")
    return prof


def cost_from_args(args: argparse.Namespace):
    prof = profile_from_args(args)
    if prof.get("illustrative"):
        print("note: using the built-in ILLUSTRATIVE profile (not measured on this machine); "
              "run `pdsim calibrate` for real figures")
    return prof, cost_model(prof)


def add_slo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo", nargs="+", default=[], metavar="KEY:MS",
                   help="per-request goodput targets, e.g. ttft:2000 tpot:100 e2el:10000")
    p.add_argument("--stall-ms", type=positive_float, default=100.0,
                   help="a gap above this counts as a stall (default 100 ms)")


def slo_from_args(args: argparse.Namespace) -> Slo | None:
    return parse_slo(args.slo) if args.slo else None

"""Arguments several commands share: the trace, the policy grid, the profile, the SLO."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import policies
from policies.budget import IDLE_BUDGETS, is_adaptive
from policies.options import DEFAULTS
from policies.settings import MLX_LM_DEFAULTS, grid_settings, unique
from policies.vllm import DEFAULTS as VLLM_DEFAULTS
from sim.core.errors import InputError
from sim.cost.profile import BUILTIN, check_profile_matches, cost_model, load_profile
from sim.engine.kvlimit import check_kv_limits  # noqa: F401 (the commands' check, with the others here)
from sim.engine.memory import NO_MEMORY_NOTE, parse_kv_limit
from sim.metrics.scoring import Slo, parse_slo
from traces.classes import parse_class_slo, with_class_targets
from traces.generators import BURSTINESS_HELP, GENERATORS, MAX_REQUESTS, MAX_WITH_IDS
from traces.load import accepted_options, resolve
from traces.schema import MAX_TOKENS
from traces.trace import Trace

# Every argument is checked by its type when argparse reads it, before the first second of work:
# a number is finite, and a count has an upper bound past which it can only be a typo (a run of
# 10^20 warm-ups, or 10^20 requests, would run on with no output).
MAX_COUNT = 1 << 53  # the largest whole number a float (and JSON) holds exactly
CLI_BUDGET = 128  # the chunk budget a command runs chunked at when none is given (the seeds' middle one)


def whole(lo: int = 1, hi: int = MAX_COUNT, why: str = ""):
    """An argparse type: a whole number in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:,}{why}, got {text}")
        return v
    parse.__name__ = "whole number"
    return parse


positive_int = whole(1)
seed_int = whole(0, (1 << 63) - 1)  # numpy's generators take seeds >= 0


def finite_float(lo: float = 0.0, strict: bool = True):
    """An argparse type: a finite number > lo (or >= lo with strict=False)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if v < lo or (strict and v == lo):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {lo:g}, got {text}")
        return v
    parse.__name__ = "number"
    return parse


positive_float = finite_float(0.0)
nonnegative_float = finite_float(0.0, strict=False)


def positive_fraction(text: str) -> float:
    """A finite number > 0, also written as a fraction (`1/3`)."""
    num, slash, den = text.partition("/")
    try:
        v = float(num) / float(den) if slash else float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or a fraction such as 1/3)") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def budget_arg(text: str) -> int | str:
    """An argparse type: a chunk budget, a whole number of tokens >= 1 or auto:TARGET_MS."""
    from policies import PolicyError
    from policies.budget import parse_budget
    if not text.strip().lower().startswith("auto"):
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError:
            if text.strip().lstrip("+-").isdigit():
                raise
            raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number of tokens nor auto:TARGET_MS "
                                             "(e.g. auto:40)") from None
    try:
        return parse_budget(text)
    except PolicyError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


budget_arg.__name__ = "budget"


def add_trace_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trace")
    g.add_argument("--trace", default="tinyllm",
                   help="a generator (tinyllm, poisson, gamma, metile) or a trace file (default: tinyllm)")
    g.add_argument("--num-seqs", type=whole(1, MAX_WITH_IDS, " (tinyllm draws every prompt token)"),
                   help="tinyllm: number of requests (default 8)")
    g.add_argument("--num-requests", type=whole(1, MAX_REQUESTS), help="poisson/gamma: number of requests")
    g.add_argument("--rate", type=positive_float, help="poisson/gamma: requests per second")
    g.add_argument("--burstiness", type=positive_fraction, help="gamma: " + BURSTINESS_HELP)
    tokens = whole(1, MAX_TOKENS, " tokens (beyond any model's context)")
    g.add_argument("--min-in", type=tokens)
    g.add_argument("--max-in", type=tokens)
    g.add_argument("--min-out", type=tokens)
    g.add_argument("--max-out", type=tokens)
    g.add_argument("--prompt-len", type=tokens, help="metile: prompt tokens of A and B")
    g.add_argument("--output-len", type=tokens, help="metile: outputs of A and B")
    g.add_argument("--tight-share", type=_share, metavar="F",
                   help="bursty-classes: the share of requests in class tight (default 0.5)")
    g.add_argument("--tight-max-in", type=tokens, metavar="N",
                   help="bursty-classes: tight prompts' longest length (bulk prompts are longer)")
    g.add_argument("--seed", type=seed_int, help="generator seed (default 0)")
    g.add_argument("--class-slo", nargs="+", default=[], metavar="CLASS:ttft=MS",
                   help="a TTFT target for every request of a class (the trace's `class` column), e.g. "
                        "tight:ttft=500; `--queue priority` serves the earliest deadline (arrival + target) first")
    f = p.add_argument_group("trace file (any supported format; see `pdsim traces info --help`)")
    f.add_argument("--format", metavar="NAME", help="the file's format, if not detected from its header")
    f.add_argument("--arrivals", choices=["poisson", "gamma"], help="length-only CSVs: arrival process")
    add_shaping_args(p)


def _share(text: str) -> float:
    v = positive_float(text)
    if not v < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction below 1, got {text}")
    return v


def add_shaping_args(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("shaping (applied in this order)")
    s.add_argument("--window", metavar="START:END", type=_window,
                   help="keep arrivals in [START, END) seconds, shifted to start at 0 (either side may be empty)")
    s.add_argument("--first", type=positive_int, metavar="N", help="keep the first N requests")
    s.add_argument("--sample", type=positive_int, metavar="N", help="keep N requests drawn at random (--seed)")
    s.add_argument("--speed", type=positive_float, metavar="K", help="replay K times as fast (arrivals / K)")
    s.add_argument("--max-prompt", type=whole(1, MAX_TOKENS), metavar="N", help="cut prompts to at most N tokens")
    s.add_argument("--max-output", type=whole(1, MAX_TOKENS), metavar="N", help="cut output budgets to at most N tokens")


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


# the trace options of `add_trace_args` (and `traces info`'s reading options), by the name the
# trace loaders give them (`traces.load.accepted_options`)
TRACE_OPTIONS = ("num_seqs", "num_requests", "rate", "burstiness", "min_in", "max_in", "min_out", "max_out",
                 "prompt_len", "output_len", "tight_share", "tight_max_in", "seed", "arrivals")
READING_OPTIONS = {"burstgpt_model": "model", "burstgpt_log": "log_type"}
FLAGS = {"model": "--burstgpt-model", "log_type": "--burstgpt-log"}


def _flag(option: str) -> str:
    return FLAGS.get(option, "--" + option.replace("_", "-"))


def trace_options(args: argparse.Namespace) -> dict:
    """The trace options the user gave (not None), by the loaders' names."""
    given = {name: getattr(args, name, None) for name in TRACE_OPTIONS}
    given |= {name: getattr(args, dest, None) for dest, name in READING_OPTIONS.items()}
    return {k: v for k, v in given.items() if v is not None}


def traces_from_args(args: argparse.Namespace, specs: list[str] | None = None) -> dict[str, Trace]:
    """Each trace (`--trace` values, or `specs`), generated or read, then shaped, by a short unique
    name. A trace option that no trace takes is refused, never silently ignored (`--rate` on the
    tinyllm trace, `--burstiness` on Poisson arrivals); with several traces each gets the options it
    takes."""
    specs = specs or (args.trace if isinstance(args.trace, list) else [args.trace])
    fmt = getattr(args, "format", None)
    given = trace_options(args)
    takes = {spec: accepted_options(spec, fmt) for spec in specs}
    unused = [o for o in given if not any(o in t for t in takes.values()) and not (o == "seed" and getattr(args, "sample", None))]
    if unused:
        what = "; ".join(f"{spec} takes " + (", ".join(map(_flag, takes[spec])) or "none of them") for spec in specs)
        raise InputError(f"{', '.join(map(_flag, unused))}: {'does' if len(unused) == 1 else 'do'} not apply to "
                         f"trace {', '.join(specs)} ({what})")
    shaping = shaping_from_args(args)
    out = {}
    for spec in specs:
        name = spec if spec in GENERATORS else Path(spec).stem
        if name in out:
            name = f"{name}-{len(out)}"
        out[name] = resolve(spec, fmt=fmt, shaping=shaping, **{k: v for k, v in given.items() if k in takes[spec]})
    return with_class_targets(out, parse_class_slo(getattr(args, "class_slo", None) or []))


def trace_from_args(args: argparse.Namespace) -> Trace:
    """The one trace of `--trace` (a generator with its options, or a file), shaped."""
    (trace,) = traces_from_args(args).values()
    return trace


def add_policy_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    n = "+" if many else None

    def default(value):
        return [value] if many else value
    g = p.add_argument_group("policy" + (" grid (several values make several settings)" if many else ""))
    g.add_argument("--policy", nargs=n, default=default("chunked"),
                   help=f"one of: {', '.join(policies.POLICIES)} (default chunked)")
    g.add_argument("--budget", nargs=n, type=budget_arg, default=default(CLI_BUDGET), metavar="N|auto:MS",
                   help=f"prompt tokens per iteration, the chunk budget (default {CLI_BUDGET}); auto:MS: each iteration the "
                        "longest chunk whose predicted iteration time is <= MS ms (from the profile's cost model)")
    g.add_argument("--idle-budget", nargs=n, choices=list(IDLE_BUDGETS), default=default(DEFAULTS["idle_budget"]),
                   help="whole: prefill the whole prompt in one call when no request is decoding (default budget: "
                        "the budget applies always)")
    g.add_argument("--batch-size", nargs=n, type=positive_int, default=default(DEFAULTS["batch_size"]),
                   help=f"maximum requests decoding at once (default {DEFAULTS['batch_size']})")
    g.add_argument("--decode", nargs=n, choices=["batched", "single"], default=default(DEFAULTS["decode"]),
                   help="batched: one call for all; single: one call per request")
    g.add_argument("--order", nargs=n, choices=["chunk-first", "decode-first"],
                   default=default(DEFAULTS["order"]))
    g.add_argument("--kv-limit", nargs=n, type=kv_limit_arg, default=default(DEFAULTS["kv_limit"]),
                   metavar="TOKENS|GB", help=policies.OPTION_HELP["kv_limit"])
    g.add_argument("--queue", nargs=n, choices=list(policies.QUEUES), default=default(DEFAULTS["queue"]),
                   help=policies.OPTION_HELP["queue"] + f" (default {DEFAULTS['queue']})")
    g.add_argument("--aging-s", nargs=n, type=positive_float, metavar="S", default=default(DEFAULTS["aging_s"]),
                   help=policies.OPTION_HELP["aging_s"])
    for key, value in MLX_LM_DEFAULTS.items():  # mlx_lm.server's flags, for the mlx-lm policy
        g.add_argument("--" + key.replace("_", "-"), nargs=n, type=positive_int, default=default(value),
                       help=policies.OPTION_HELP[key])
    for key, value in VLLM_DEFAULTS.items():  # vLLM's flags, for the vllm policy
        g.add_argument("--" + key.replace("_", "-"), nargs=n, default=default(value), help=policies.OPTION_HELP[key],
                       type=whole(0 if key == "long_prefill_token_threshold" else 1))
    if many:
        g.add_argument("--setting", nargs="+", metavar="POLICY[:KEY=VALUE,...]",
                       help="explicit settings instead of a grid, e.g. eager "
                            "chunked:budget=128,order=decode-first,queue=priority chunked:budget=auto:40,idle_budget=whole "
                            "chunked:budget=64,kv_limit=2GB mlx-lm:prefill_step=512 (keys: budget, batch_size, decode, "
                            "order, queue, aging_s, idle_budget, kv_limit; mlx-lm: prefill_step, prompt_concurrency, "
                            "decode_concurrency; "
                            "unset keys take the first value of the grid options)")


def kv_limit_arg(text: str) -> int | str | None:
    """An argparse type: a KV limit (`sim.engine.memory.parse_kv_limit`), as a setting holds it."""
    try:
        limit = parse_kv_limit(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"kv limit {text!r}: ")) from None
    return None if limit is None else limit.tokens or str(limit)


# the grid's options, in `policies.settings.grid_settings`' order
GRID_KEYS = ("budget", "batch_size", "decode", "order", "queue", "aging_s", *MLX_LM_DEFAULTS, "idle_budget",
             "kv_limit", *VLLM_DEFAULTS)  # in `policies.settings.grid_settings`'s order


def settings_from_args(args: argparse.Namespace) -> list[dict]:
    """The settings the arguments name: explicit `--setting`s, or the grid of the policy options;
    complete, and each once (`policies.settings.unique`: eager and fifo prefill whole prompts, so budgets
    do not multiply them, fifo decodes one request at a time, so batch sizes do not either, and
    mlx-lm reads only its own three options, mlx_lm.server's flags, which no other policy reads)."""
    as_list = lambda v: v if isinstance(v, list) else [v]
    if getattr(args, "setting", None):
        first = {k: as_list(getattr(args, k))[0] for k in GRID_KEYS}
        return unique(parse_setting(text, first) for text in args.setting)
    queues = [q for q in as_list(getattr(args, "queue", "fcfs")) if q != "fcfs"]
    if queues and set(as_list(args.policy)) == {"mlx-lm"}:  # nothing else in the grid would read it
        policies.make("mlx-lm", queue=queues[0])  # refused: BatchGenerator is FIFO
    return grid_settings(*(as_list(getattr(args, k)) for k in ("policy", *GRID_KEYS)))


def parse_setting(text: str, defaults: dict) -> dict:
    """`chunked:budget=128,order=decode-first` -> a setting dict; InputError naming the bad part."""
    name, _, rest = text.partition(":")
    s = {"policy": name, **defaults}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in defaults:
            raise InputError(f"--setting {text!r}: expected KEY=VALUE with KEY one of {', '.join(defaults)}")
        if name == "vllm" and key not in policies.POLICIES["vllm"].uses:
            raise InputError(f"--setting {text!r}: policy vllm does not read {key} (it reads "
                             f"{', '.join(policies.POLICIES['vllm'].uses)})")
        if key == "budget":
            try:
                s[key] = budget_arg(val)
            except argparse.ArgumentTypeError as e:
                raise InputError(f"--setting {text!r}: {e}") from None
            if name == "mlx-lm" and is_adaptive(s[key], None):
                raise InputError(f"--setting {text!r}: mlx-lm takes no budget auto:MS (its prefill step is fixed by "
                                 "prefill_step, mlx_lm.server's --prefill-step-size)")
        elif key == "idle_budget" and name == "mlx-lm":
            raise InputError(f"--setting {text!r}: mlx-lm takes no idle_budget (its prefill step is fixed by "
                             "prefill_step, mlx_lm.server's --prefill-step-size)")
        elif key in ("batch_size",) or key in MLX_LM_DEFAULTS or key in VLLM_DEFAULTS:
            try:
                s[key] = int(val)
            except ValueError:
                raise InputError(f"--setting {text!r}: {key} must be a whole number, got {val!r}") from None
        elif key == "kv_limit":
            try:
                s[key] = kv_limit_arg(val)
            except argparse.ArgumentTypeError as e:
                raise InputError(f"--setting {text!r}: kv_limit {val!r}: {e}") from None
        elif key == "aging_s":
            try:
                s[key] = positive_float(val)
            except argparse.ArgumentTypeError as e:
                raise InputError(f"--setting {text!r}: aging_s {e}") from None
        else:
            s[key] = val
        if key == "queue" and name == "mlx-lm" and val != "fcfs":
            policies.make("mlx-lm", queue=val)  # refused, in one line: BatchGenerator is FIFO
    return s


def add_profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="cost profile JSON from `pdsim calibrate` (default: the built-in "
                                     "illustrative profile, shaped like Qwen3-0.6B on an Apple M4 Pro)")
    p.add_argument("--model", help="refuse a profile made for another model")
    p.add_argument("--device", metavar="ID", help="refuse a profile measured on another device (its device id, "
                                                  "as `pdsim calibrate` writes it, e.g. cpu:Intel Xeon:2:SKYLAKEX)")
    p.add_argument("--force", action="store_true", help="use a profile for another model or device anyway")


def profile_from_args(args: argparse.Namespace) -> dict:
    prof = load_profile(args.profile or BUILTIN)
    device = getattr(args, "device", None)
    for w in check_profile_matches(prof, getattr(args, "model", None), device, force=getattr(args, "force", False)):
        print(f"warning: {w}")
    if device and not prof["device"].get("id"):
        raise InputError(f"--device {device}: profile {prof['_path']} names no device id to check it against")
    return prof


def check_traces_fit(prof: dict, traces: dict[str, Trace]) -> None:
    """Refuse a trace whose requests need more context than the profile's model holds: the cost
    model would price attention over positions the model does not have, without a word."""
    limit = prof["model"].get("max_context")
    if not limit:
        return
    for name, trace in traces.items():
        need = [r.prompt_len + r.output_len for r in trace.requests]
        longest = max(need)
        if longest > limit:
            r = trace.requests[need.index(longest)]
            raise InputError(f"trace {trace.meta.get('source', name)}: request {r.id} needs {longest:,} tokens of "
                             f"context ({r.prompt_len:,} prompt + {r.output_len:,} output); profile "
                             f"{prof['_path']} is for {prof['model']['name']}, which holds {limit:,} "
                             f"(cut the trace with --max-prompt / --max-output)")


def cost_from_args(args: argparse.Namespace):
    prof = profile_from_args(args)
    if prof.get("illustrative"):
        print("note: using the built-in ILLUSTRATIVE profile (not measured on this machine); "
              "run `pdsim calibrate` for real figures")
    cost = cost_model(prof)
    if cost.memory is None:
        print(f"note: {NO_MEMORY_NOTE}")
    asked = getattr(args, "policy", None)
    hybrid = "full_attention_interval" in (prof["model"].get("shapes") or {})
    if hybrid and "vllm" in ([asked] if isinstance(asked, str) else list(asked or [])) and "mixed" not in prof["cost"]:
        print(f"note: {prof['model']['name']} is a hybrid model, whose fused forwards the executor does not run: vllm's "
              "forwards are priced from its prefill and decode forms, which no confirm has checked")
    return prof, cost


def add_slo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo", nargs="+", default=[], metavar="KEY:MS",
                   help="per-request goodput targets, e.g. ttft:2000 tpot:100 e2el:10000")
    p.add_argument("--stall-ms", type=positive_float, default=100.0,
                   help="a gap above this counts as a stall (default 100 ms)")


def slo_from_args(args: argparse.Namespace) -> Slo | None:
    return parse_slo(args.slo) if args.slo else None

"""One schema for cost profiles, checked where a profile is read (`sim.cost.profile.load_profile`).

Why here and once: every command that takes a profile (simulate, sweep, confirm, report,
calibrate --refit/--add-rounds/--from-runs) reads it through `load_profile`, so a broken profile
is refused in one line naming the file and the field, before any work, and no command finds out
later with a KeyError, a TypeError or a negative call duration ("time went backwards"). What is
checked is what pdsim reads:

- `model`: an object with a `name`; `max_context` (tokens), if given, a whole number >= 1;
- `device`: an object (its `id`, `name` and `kind` strings where given);
- `cost`: every coefficient a finite number >= 0 (a cost model with a negative or NaN term
  prices calls below zero or makes every metric undefined); curves of [size, seconds] pairs with
  sizes increasing; 4 decode coefficients with their knot; `use` "fit" or "grid", and a grid of
  [size, context, seconds] points for every step that uses it;
- `samples` (what --refit and --add-rounds fit), `grid` (what --add-rounds times again) and
  `engine_runs`, where present, with the fields and types the fit reads;
- `memory` (`sim.engine.memory`), optional (profiles before it have none, and predict no peak memory):
  the weights' and a KV token-row's bytes, 4 prefill and 3 decode activation coefficients, each a
  finite number >= 0 (null coefficients: measured nothing, no model).
"""
from __future__ import annotations

from pathlib import Path

from sim.core.inputs import read_json_object
from sim.cost.fields import (
    ProfileError,
    Where,
    cost_value,
    curve,
    is_number,
    kind,
    numbers,
    obj,
    points,
    text,
    tile,
    whole,
)

STEPS = ("prefill", "decode")
SAMPLE_STEPS = ("prefill", "decode", "sync", "overhead", "join", "leave", "prompt", "generate",  # mlx-lm's last two
                "mixed")  # vLLM's forwards
GRID_LISTS = ("chunks", "offsets", "batches", "contexts", "odd_chunks", "odd_prompts")


def read_profile(path: str | Path) -> dict:
    """The profile at `path`, checked (`check_profile`), with `_path` set to where it was read."""
    prof = read_json_object(path, "profile", ProfileError)
    check_profile(prof, path)
    prof["_path"] = str(path)
    return prof


def check_profile(prof: dict, path) -> None:
    """Raise ProfileError naming the file and the field for anything pdsim would misread."""
    w = Where(path)
    for key in ("model", "device", "cost"):
        if key not in prof:
            raise ProfileError(f"profile {path}: missing required field {key!r}")
    model = obj(w, prof["model"], "model")
    text(w, model, "name", "model.name", required=True)
    for key in ("dtype", "weights"):
        if model.get(key) is not None:
            text(w, model, key, f"model.{key}")
    if model.get("quant_bits") is not None:
        whole(w, model["quant_bits"], "model.quant_bits", 1, 64)
    if model.get("max_context") is not None:
        whole(w, model["max_context"], "model.max_context", 1)
    if "shapes" in model:
        obj(w, model["shapes"], "model.shapes")
    device = obj(w, prof["device"], "device")
    for key in ("id", "name", "kind"):
        text(w, device, key, f"device.{key}")
    if device.get("memory_limit_bytes") is not None:  # the engine's memory there (`sim.engine.memory.device_kv_tokens`)
        whole(w, device["memory_limit_bytes"], "device.memory_limit_bytes", 1)
    if "illustrative" in prof and not isinstance(prof["illustrative"], bool):
        raise w.fail("illustrative", "must be true or false")
    check_cost(w, obj(w, prof["cost"], "cost"))
    if "speed_rules" in prof:  # `sim.cost.speed.SpeedRules`
        rules = obj(w, prof["speed_rules"], "speed_rules")
        for key in ("probe_weight", "run_decode"):
            if key not in rules:
                raise w.fail(f"speed_rules.{key}", "is missing")
            if cost_value(w, rules[key], f"speed_rules.{key}") <= 0:
                raise w.fail(f"speed_rules.{key}", "must be > 0")
    if "samples" in prof:
        check_samples(w, prof["samples"])
    if "grid" in prof:
        check_grid(w, prof["grid"])
    if "engine_runs" in prof:
        check_engine_runs(w, prof["engine_runs"])
    if "fit" in prof:
        fit = obj(w, prof["fit"], "fit")
        if "noise" in fit:
            check_noise(w, obj(w, fit["noise"], "fit.noise"))
    if prof.get("memory") is not None:
        check_memory(w, obj(w, prof["memory"], "memory"))


def check_noise(w: Where, noise: dict) -> None:
    """Quantiles of a call's time factor (`sim.cost.noise`): at least two, finite, > 0, not decreasing."""
    q = numbers(w, noise.get("quantiles"), "fit.noise.quantiles", lo=1e-6)
    if len(q) < 2 or any(b < a for a, b in zip(q, q[1:])):
        raise w.fail("fit.noise.quantiles", "must hold at least two numbers, not decreasing (they are quantiles)")
    whole(w, noise.get("calls"), "fit.noise.calls", lo=1)


def check_memory(w: Where, m: dict) -> None:
    """The `memory` section (`sim.engine.memory.MemoryModel`): sizes in bytes and activation coefficients."""
    if m.get("prefill") is None and m.get("decode") is None:
        return  # measured nothing (an MLX without peak-memory counters): no model, a null metric
    for key in ("weights_bytes", "kv_bytes_per_token"):
        if key not in m:
            raise w.fail(f"memory.{key}", "is missing")
        cost_value(w, m[key], f"memory.{key}")
    if "state_bytes_per_request" in m:  # a hybrid model's
        cost_value(w, m["state_bytes_per_request"], "memory.state_bytes_per_request")
    for key, n in (("prefill", 4), ("decode", 3)):
        if key not in m:
            raise w.fail(f"memory.{key}", f"is missing ({n} numbers)")
        numbers(w, m[key], f"memory.{key}", (n,))


def check_cost(w: Where, cost: dict) -> None:
    if "heap_groups" in cost:
        whole(w, cost["heap_groups"], "cost.heap_groups", lo=1, hi=10_000)
    if "mixed" in cost:  # vLLM's forwards (`sim.cost.model.MIXED_FORM`)
        mixed = obj(w, cost["mixed"], "cost.mixed")
        numbers(w, mixed.get("coef"), "cost.mixed.coef", (5,))
        if "dense" in mixed:
            curve(w, mixed["dense"], "cost.mixed.dense")
        if "tiled" in mixed and not isinstance(mixed["tiled"], bool):
            raise w.fail("cost.mixed.tiled", "must be true or false")
    if "mlx_lm" in cost:
        check_mlx_lm(w, obj(w, cost["mlx_lm"], "cost.mlx_lm"))
        if "prefill" not in cost and "decode" not in cost:  # a profile of mlx-lm's BatchGenerator only
            return
    uses_grid = False
    for step in STEPS:
        if step not in cost:
            raise w.fail(f"cost.{step}", "is missing")
        sec = obj(w, cost[step], f"cost.{step}")
        if "coef" not in sec:
            raise w.fail(f"cost.{step}.coef", "is missing (3 or 4 numbers)")
        numbers(w, sec["coef"], f"cost.{step}.coef", (3, 4))
        if sec.get("dense") is not None:
            curve(w, sec["dense"], f"cost.{step}.dense")
        use = sec.get("use", cost.get("use", "fit"))
        if use not in ("fit", "grid"):
            raise w.fail(f"cost.{step}.use" if "use" in sec else "cost.use", f"must be \"fit\" or \"grid\", got {use!r}")
        uses_grid |= use == "grid"
        if "form" in sec and not isinstance(sec["form"], str):
            raise w.fail(f"cost.{step}.form", "must be a string")
    if "use" in cost and cost["use"] not in ("fit", "grid"):
        raise w.fail("cost.use", f"must be \"fit\" or \"grid\", got {cost['use']!r}")
    if uses_grid:  # the grid model interpolates both steps' points (and falls back to the form per step)
        for step in STEPS:
            if "grid" not in cost[step]:
                raise w.fail(f"cost.{step}.grid", "is missing: a profile that uses the grid needs its points")
            points(w, cost[step]["grid"], f"cost.{step}.grid")
    dec, pre = cost["decode"], cost["prefill"]
    knot = dec.get("knot")
    if len(dec["coef"]) == 4 and knot is None:
        raise w.fail("cost.decode.knot", "is missing: 4 decode coefficients need the context where the slope changes")
    if knot is not None:
        cost_value(w, knot, "cost.decode.knot")
        if knot <= 0:
            raise w.fail("cost.decode.knot", "must be a context > 0")
    if dec.get("lone") is not None:
        cost_value(w, dec["lone"], "cost.decode.lone")
    for key in ("iteration", "copy", "fresh", "gather", "fresh_step", "fresh_step_faults", "grow", "grow_single",
                "grow_single_faults"):
        if key in cost:
            cost_value(w, cost[key], f"cost.{key}")
    for key in ("join", "leave"):
        v = cost.get(key)
        if v is None:
            continue
        if is_number(v):
            cost_value(w, v, f"cost.{key}")
        else:
            numbers(w, v, f"cost.{key}", (1, 2, 3))
    tile(w, pre, "cost.prefill")


def check_mlx_lm(w: Where, m: dict) -> None:
    """The `cost.mlx_lm` section (`sim.cost.mlxlm.MlxLmCosts`): BatchGenerator's prompt calls and
    generation steps, each 4 coefficients and an optional dense curve, and its copy prices."""
    for key in ("prompt", "generate"):
        if key not in m:
            raise w.fail(f"cost.mlx_lm.{key}", "is missing")
        sec = obj(w, m[key], f"cost.mlx_lm.{key}")
        if "coef" not in sec:
            raise w.fail(f"cost.mlx_lm.{key}.coef", "is missing (4 numbers)")
        numbers(w, sec["coef"], f"cost.mlx_lm.{key}.coef", (4,))
        if sec.get("dense") is not None:
            curve(w, sec["dense"], f"cost.mlx_lm.{key}.dense")
    tile(w, m["prompt"], "cost.mlx_lm.prompt")
    gen = m["generate"]
    if gen.get("knot") is not None:
        cost_value(w, gen["knot"], "cost.mlx_lm.generate.knot")
        if gen["knot"] <= 0:
            raise w.fail("cost.mlx_lm.generate.knot", "must be a context > 0")
    if "first" in gen:
        cost_value(w, gen["first"], "cost.mlx_lm.generate.first")
    for key in ("copy", "fresh", "iteration", "first_copy"):
        if m.get(key) is not None:
            cost_value(w, m[key], f"cost.mlx_lm.{key}")
    for part in ("host", "tail"):
        for k, v in obj(w, m.get(part) or {}, f"cost.mlx_lm.{part}").items():
            if k not in ("generate", "first", "prompt"):
                raise w.fail(f"cost.mlx_lm.{part}.{k}", "is not one of mlx-lm's calls (generate, first, prompt)")
            cost_value(w, v, f"cost.mlx_lm.{part}.{k}")


def check_samples(w: Where, samples) -> None:
    """The samples a refit fits: each an object with its step, seconds > 0 and the shape fields
    its step's fit reads, each of the right type."""
    if not isinstance(samples, list):
        raise w.fail("samples", f"must be a list of measured samples, got {kind(samples)}")
    for i, s in enumerate(samples):
        f = f"samples[{i}]"
        if not isinstance(s, dict):
            raise w.fail(f, f"must be an object, got {kind(s)}")
        step = s.get("step")
        if step not in SAMPLE_STEPS:
            raise w.fail(f"{f}.step", f"must be one of {', '.join(SAMPLE_STEPS)}, got {step!r}")
        if "seconds" not in s:
            raise w.fail(f"{f}.seconds", "is missing")
        cost_value(w, s["seconds"], f"{f}.seconds")
        if s["seconds"] <= 0:
            raise w.fail(f"{f}.seconds", "must be > 0 (the fit weighs errors relative to it)")
        need = {"prefill": ("chunk", "prefix"), "decode": ("batch",), "sync": ("batch",),
                "mixed": ("chunks", "prefixes")}.get(step, ())
        for key in need:
            if key not in s:
                raise w.fail(f"{f}.{key}", f"is missing (a {step} sample's shape)")
        for key in ("chunk", "batch"):
            if key in s:
                whole(w, s[key], f"{f}.{key}", 1)
        for key in ("prefix", "written", "fresh", "joined", "left", "round", "peak_extra", "faults"):
            if key in s:
                whole(w, s[key], f"{f}.{key}", 0)
        if step in ("decode", "sync") and "context_max" not in s and "context_sum" not in s:
            raise w.fail(f"{f}.context_max", f"is missing (a {step} sample's longest context)")
        for key in ("context_max", "context_sum", "spread", "fitted"):
            if key in s and s[key] is not None:
                cost_value(w, s[key], f"{f}.{key}")
        for key in ("contexts", "times", "chunks", "prefixes"):
            if key in s:
                numbers(w, s[key], f"{f}.{key}")
        if step == "mixed" and (not s["chunks"] or len(s["chunks"]) != len(s["prefixes"])):
            raise w.fail(f"{f}.chunks", "must hold one number per row, as many as prefixes")
        if "times" in s and not s["times"]:
            raise w.fail(f"{f}.times", "must hold at least one timing")
        for key in ("key", "source", "call", "bucket"):
            if key in s and not isinstance(s[key], str):
                raise w.fail(f"{f}.{key}", f"must be a string, got {kind(s[key])}")
        for key in ("batched", "single", "held_out", "fastest"):
            if key in s and not isinstance(s[key], bool):
                raise w.fail(f"{f}.{key}", "must be true or false")


def check_grid(w: Where, grid) -> None:
    """The calibration grid (`calibrate.measure.grid.Grid`, or mlx-lm's `MlxLmGrid`) that --add-rounds times again."""
    grid = obj(w, grid, "grid")
    if "prompts" in grid:  # MlxLmGrid: prompt rows, first forwards and merges are lists of lists
        flat, optional = ("offsets", "batches", "contexts"), ()
        nested = {key: (0, "whole numbers") for key in ("prompts", "firsts", "merges")}
    else:
        flat, optional = GRID_LISTS + ("singles",), ("odd_chunks", "odd_prompts", "singles")
        nested = {"mixed": (1, "contexts"), "fused": (0, "whole numbers")}
    extra = sorted(set(grid) - set(flat) - set(nested) - {"repeats", "warmup", "offset_chunk_max", "prompt_max"})
    if extra:
        raise w.fail("grid", f"has unknown field(s) {', '.join(extra)}")
    for key in flat:
        v = grid.get(key)
        if v is None and key in optional:
            continue
        if not isinstance(v, list):
            raise w.fail(f"grid.{key}", f"must be a list of whole numbers, got {kind(v)}")
        for i, x in enumerate(v):
            whole(w, x, f"grid.{key}[{i}]", 0 if key == "offsets" else 1)
    for key, (lo, what) in nested.items():
        v = grid.get(key, [])
        if not isinstance(v, list) or not all(isinstance(m, list) and m for m in v):
            raise w.fail(f"grid.{key}", f"must be a list of lists of {what}")
        for i, m in enumerate(v):
            for j, x in enumerate(m):
                whole(w, x, f"grid.{key}[{i}][{j}]", lo)
    for key in ("offset_chunk_max", "prompt_max"):
        if grid.get(key) is not None:
            whole(w, grid[key], f"grid.{key}", 1)
    for key in ("repeats", "warmup"):
        if key in grid:
            whole(w, grid[key], f"grid.{key}", 1 if key == "repeats" else 0, 1000)


def check_engine_runs(w: Where, runs) -> None:
    """The calibration's engine runs, as a refit derives their samples again."""
    if not isinstance(runs, list):
        raise w.fail("engine_runs", f"must be a list, got {kind(runs)}")
    for i, r in enumerate(runs):
        f = f"engine_runs[{i}]"
        r = obj(w, r, f)
        for key in ("name", "part"):
            text(w, r, key, f"{f}.{key}", required=True)
        obj(w, r.get("setting"), f"{f}.setting")
        trace = obj(w, r.get("trace"), f"{f}.trace")
        if not isinstance(trace.get("requests"), list):
            raise w.fail(f"{f}.trace.requests", "must be a list of requests")
        obj(w, _log(w, r.get("log"), f"{f}.log").get("tokens"), f"{f}.log.tokens")
        if r.get("probe") is not None:  # the speed probes around the run (`calibrate.measure.speed_probe`)
            probe = obj(w, r["probe"], f"{f}.probe")
            obj(w, probe.get("setting"), f"{f}.probe.setting")
            if not isinstance(obj(w, probe.get("trace"), f"{f}.probe.trace").get("requests"), list):
                raise w.fail(f"{f}.probe.trace.requests", "must be a list of requests")
            if not isinstance(probe.get("logs"), list):
                raise w.fail(f"{f}.probe.logs", "must be a list")
            for j, plog in enumerate(probe["logs"]):
                _log(w, plog, f"{f}.probe.logs[{j}]")
            if probe.get("alloc_s") is not None:  # fresh memory timed (`speed_probe.allocation_seconds`)
                numbers(w, probe["alloc_s"], f"{f}.probe.alloc_s")
                whole(w, probe.get("alloc_bytes"), f"{f}.probe.alloc_bytes", lo=1)
                if not isinstance(probe.get("alloc_method", ""), str):  # absent from older probes
                    raise w.fail(f"{f}.probe.alloc_method", "must be a string")


def _log(w: Where, log, f: str) -> dict:
    """An event log as a worker writes it: an object with lists of requests and calls."""
    log = obj(w, log, f)
    for key in ("requests", "calls"):
        if not isinstance(log.get(key), list):
            raise w.fail(f"{f}.{key}", "must be a list")
    faults = log.get("faults")  # each call's page faults, counted by the real engine (absent from older logs)
    if faults is not None:
        if not isinstance(faults, list) or len(faults) != len(log["calls"]):
            raise w.fail(f"{f}.faults", f"must be a list with one count per call ({len(log['calls'])})")
        for i, n in enumerate(faults):
            whole(w, n, f"{f}.faults[{i}]")
    return log

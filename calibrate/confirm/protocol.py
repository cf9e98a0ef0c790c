"""Spot checks: run settings on the real engine by the seeds' protocol, and score the prediction.

Protocol: a correctness gate first; each (setting, repeat) in a fresh process; forward order on
even repeats and reverse on odd ones; optional cooldown; medians across processes. Finished runs
are kept in `<report>.runs/`, so an interrupted confirm resumes where it stopped.

`engine` "mlx-lm" runs the installed mlx-lm's BatchGenerator itself (`calibrate.engine.batchgen`) for
mlx-lm policy settings; every run checks, call by call, that it made the policy's decisions.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm import tqdm

import policies
from calibrate.confirm.runs import RunsFolder, finished_run, model_spec, runs_manifest
from calibrate.confirm.score import compare, slo_constraints
from calibrate.engine.executor import prompt_tokens
from calibrate.engine.gate import chunked_logits_match, mixed_logits_match, tolerance
from calibrate.engine.model import build_as_profiled
from calibrate.host.machine import host_info
from calibrate.measure.speed_probe import probe_engine
from calibrate.measure.worker import RunFailed, run_fresh, warmed_with, warmup_trace
from policies.settings import setting, setting_label
from sim.core.errors import UserError
from sim.core.files import atomic_write_json, check_output
from sim.cost.noise import CallNoise
from sim.cost.profile import check_profile_matches, cost_model
from sim.engine.kvlimit import check_kv_limits
from sim.engine.memory import device_kv_tokens
from sim.engine.work import EngineError
from sim.predict import REPLICAS
from traces.trace import Trace, load_jsonl

ENGINES = ("pdsim", "mlx-lm")


def check_inputs(prof: dict, trace: Trace, out: Path, host: dict, force: bool, settings: list[dict] = (),
                 engine: str = "pdsim", any_mlx_lm: bool = False) -> list[str]:
    """Refuse what cannot run or be predicted, before any run; the warnings to print."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists; not overwriting it (choose another report path)")
    check_output(out, overwrite=True, what="report")  # a folder, a place under a file, a read-only folder
    warnings = []
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    mlx = [s for s in settings if s["policy"] == "mlx-lm"]
    if engine == "mlx-lm" and len(mlx) < len(settings):
        other = next(s for s in settings if s["policy"] != "mlx-lm")
        raise UserError(f"--engine mlx-lm runs BatchGenerator, whose decisions are the mlx-lm policy's; "
                        f"setting {setting_label(other)} is another policy")
    if mlx:
        from calibrate.engine.mlxlm_batches import installed_version
        from policies.mlxlm import check_version
        warnings += check_version(installed_version(), any_mlx_lm)
        if any(r.prefilled for r in trace.requests):
            raise UserError("the mlx-lm policy cannot serve requests prefilled before the clock (the trace has some)")
    if len(mlx) < len(settings) and not cost_model(prof).pdsim_forms:
        raise UserError(f"profile {prof.get('_path')} prices mlx-lm's BatchGenerator only; settings of pdsim's "
                        "policies need a calibration of pdsim's engine (pdsim calibrate without --engine)")
    if mlx and prof.get("engine", "pdsim") != "mlx-lm":
        warnings.append(f"profile {prof.get('_path')} was not calibrated on mlx-lm's calls (pdsim calibrate "
                        "--engine mlx-lm): they are priced by pdsim's forms")
    for w in check_profile_matches(prof, device=host["id"], force=force):
        print(f"warning: {w}")
    limit = prof["model"].get("max_context")
    longest = max(r.prompt_len + r.output_len for r in trace.requests)
    if limit and longest > limit:
        raise UserError(f"trace needs {longest} tokens of context; {prof['model']['name']} allows {limit}")
    check_kv_limits(prof, {"trace": trace}, settings)
    return warnings


def gate(prof: dict, trace: Trace, settings: list[dict], engine: str = "pdsim") -> dict:
    """Chunked vs one-shot logits for every budget (mlx-lm: every prefill step); identical greedy
    tokens across settings (mlx-lm: BatchGenerator's under every setting, and pdsim's eager engine's)."""
    spec = model_spec(prof)
    lm = build_as_profiled(spec)  # the kernels that are timed: the profile's dtype and quantization
    req = max(trace.requests[:4], key=lambda r: r.prompt_len)
    prompt = prompt_tokens(req, lm.vocab_size)
    steps = {s.get("budget") or s.get("prefill_step") for s in settings} - {None}
    steps = {b for b in steps if isinstance(b, int)}  # an auto:MS budget's chunks vary: the default length below
    budgets = sorted({b for b in steps if b < len(prompt)} or {max(1, len(prompt) // 3)})
    tol = tolerance(lm.dtype)
    precision = {"dtype": lm.dtype, "quant_bits": lm.quant_bits}  # what the gate checked: the timed kernels
    logits = [chunked_logits_match(lm, prompt[:min(len(prompt), 2 * b + 1)], b, tol) for b in budgets]
    from calibrate.engine.executor import RealEngine
    real, short = RealEngine(lm), warmup_trace(trace, n=3, outputs=6)
    if engine == "mlx-lm":
        from calibrate.engine.batchgen import run_batch_generator
        runs = [run_batch_generator(lm, short, s) for s in settings]
        outs = [run.outputs for run, _, _ in runs] + [real.run(short, policies.make("eager", batch_size=3)).outputs]
        same = all(o == outs[0] for o in outs)
        calls = all(check.ok for _, check, _ in runs)
        return {"logits": logits, "greedy_tokens_identical": same, "policy_calls_identical": calls, **precision,
                "ok": same and calls and all(g["ok"] for g in logits)}
    cost = cost_model(prof)
    outs = [real.run(short, policies.make(**s, cost=cost)).outputs for s in settings]
    same = all(o == outs[0] for o in outs)
    mixed = [mixed_logits_match(lm, tol)] if any(s["policy"] == "vllm" for s in settings) else []
    return {"logits": logits, "greedy_tokens_identical": same, **({"mixed": mixed[0]} if mixed else {}), **precision,
            "ok": same and all(g["ok"] for g in logits + mixed)}


def run_all(prof: dict, trace: Trace, settings: list[dict], repeats: int, warmup: int, cooldown: float,
             runs_dir: Path, engine: str = "pdsim", warmup_with: str = "short") -> list[dict]:
    """Every (setting, repeat) in its own process, alternating order; returns the runs in run order.
    A run finished before an interrupt is reused: its file says it measured this trace and setting
    (`RunsFolder` has already proven the folder holds runs of this work)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    trace_path = runs_dir / "trace.jsonl"
    sha = trace.sha256()
    if not trace_path.exists() or load_jsonl(trace_path).sha256() != sha:
        trace.save_jsonl(trace_path, overwrite=True)
    order = []
    for r in range(repeats):
        seq = settings if r % 2 == 0 else list(reversed(settings))
        order += [(r, s) for s in seq]
    runs = []
    # BatchGenerator as the server runs it, where the profile prices that (`sim.engine.pipeline`)
    pipelined = engine == "mlx-lm" and bool(prof["cost"].get("mlx_lm", {}).get("host"))
    for r, s in tqdm(order, desc="confirming", unit="run"):
        label = setting_label(s)
        out = runs_dir / f"r{r}-{label.replace('/', '_')}.json"
        data = finished_run(out, s, sha, pipelined)
        if data is None:
            spec = {"model": model_spec(prof), "trace_path": str(trace_path), "setting": s, "warmup": warmup,
                    "warmup_with": warmup_with, "engine": engine, "cost": prof["cost"],  # the prices an auto:MS budget decides by
                    "probe": probe_engine(prof, engine),  # the machine's speed, where the profile prices it
                    "kv_capacity": device_kv_tokens(prof),  # the device's KV limit, the simulator's
                    "pipelined": pipelined}
            try:
                run_fresh(spec, out)
            except RunFailed as e:
                raise UserError(f"run {label} repeat {r} failed: {e}") from None
            if cooldown:
                time.sleep(cooldown)
            data = finished_run(out, s, sha, pipelined)
            if data is None:
                raise UserError(f"run {label} repeat {r}: its worker wrote no readable result to {out}")
        check = data.get("check", {})
        if check.get("policy_mismatches") or check.get("shape_mismatches"):
            first = (check["policy_mismatches"] + check["shape_mismatches"])[0]
            raise UserError(f"run {label} repeat {r}: BatchGenerator did not do what pdsim models "
                            f"(mlx-lm {data.get('engine', {}).get('version')}): {first[:300]}")
        runs.append({"label": label, "setting": s, "repeat": r, **data})
    return runs


def confirm(prof: dict, trace: Trace, settings: list[dict], out: Path, repeats: int = 4, warmup: int = 1,
            cooldown: float = 0.0, force: bool = False, stall_ms: float = 100.0, engine: str = "pdsim",
            any_mlx_lm: bool = False, replicas: int = REPLICAS, warmup_with: str = "trace",
            slo: tuple[str, ...] = ()) -> dict:
    """Run `settings` on the real engine (`repeats` fresh processes each) and score them against the
    prediction (`calibrate.confirm.score.compare`; `slo`: constraints checked in both); the report."""
    slo = tuple(str(c) for c in slo_constraints(slo))  # before any work, as the verdicts name them
    host = host_info()
    for w in check_inputs(prof, trace, out, host, force, settings, engine, any_mlx_lm):
        print(f"warning: {w}")
    runs_dir = out.with_name(out.name + ".runs")
    manifest = runs_manifest(prof, trace, settings, repeats, warmup, cooldown, warmup_with) | {"engine": engine}
    with RunsFolder(runs_dir, manifest):  # before any work
        return _confirm(prof, trace, settings, out, repeats, warmup, cooldown, stall_ms, host, runs_dir, engine,
                        replicas, warmup_with, slo)


def _confirm(prof: dict, trace: Trace, settings: list[dict], out: Path, repeats: int, warmup: int, cooldown: float,
             stall_ms: float, host: dict, runs_dir: Path, engine: str, replicas: int, warmup_with: str,
             slo: tuple[str, ...]) -> dict:
    t0 = time.perf_counter()
    g = gate(prof, trace, settings, engine)
    if not g["ok"]:
        raise UserError(f"correctness gate failed: {json.dumps(g)}")
    runs = run_all(prof, trace, settings, repeats, warmup, cooldown, runs_dir, engine, warmup_with)
    results = compare(prof, trace, settings, runs, stall_ms, replicas, warmup, warmup_with, slo)
    first = {}
    for r in runs:  # every run of every setting must produce the same greedy tokens
        first.setdefault("outputs", r["outputs"])
    g["timed_runs_identical_tokens"] = all(r["outputs"] == first["outputs"] for r in runs)
    report = {
        "pdsim_confirm": 1,
        "engine": {"name": engine, "mlx_lm": host.get("mlx_lm"),
                   **({"timing": "pipelined as mlx_lm.server runs it: nothing synchronized, each call's span "
                                 "host time from its start to the next one's"
                       if runs and runs[0]["log"].get("pipelined") else
                       "stream synchronized at the end of every next() and before each model call"}
                      if engine == "mlx-lm" else {})},
        "profile": profile_summary(prof),
        "prediction": prediction_summary(prof, replicas),
        "trace": trace.to_dict(),
        "host": host,
        "settings": settings,
        "protocol": {"repeats": repeats, "warmup": warmup, "warmup_with": warmup_with, "cooldown_s": cooldown,
                     "fresh_process": True,
                     "order": [[r["repeat"], r["label"]] for r in runs]},
        "gate": g,
        **({"slo": list(slo)} if slo else {}),
        "results": results,
        "runs": [{k: r[k] for k in ("label", "repeat", "setting", "metrics", "log", "outputs", "wall_s", "idle_s",
                                    "engine", "check", "probe") if k in r} for r in runs],
        "wall_s": time.perf_counter() - t0,
    }
    atomic_write_json(out, report)
    return report


def check_report(doc: dict, where: str) -> None:
    """A confirm report as `rescore` reads it (a profile or a sweep given instead is named as such)."""
    if "pdsim_confirm" not in doc:
        kind = ("a profile" if "cost" in doc and "model" in doc else "a sweep's results" if "pdsim_sweep" in doc
                else "not a confirm report")
        raise UserError(f"{where}: {kind}, not a confirm report (no 'pdsim_confirm'); --rescore takes the report "
                        "`pdsim confirm -o` wrote")
    trace = doc.get("trace")
    if not (isinstance(trace, dict) and isinstance(trace.get("requests"), list) and isinstance(trace.get("meta"), dict)
            and isinstance(trace.get("sha256"), str)):
        raise UserError(f"{where}: its 'trace' must hold 'requests', 'meta' and 'sha256'")
    if not isinstance(doc.get("settings"), list) or not all(isinstance(x, dict) for x in doc["settings"]):
        raise UserError(f"{where}: its 'settings' must be a list of settings")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise UserError(f"{where}: no 'runs' to rescore")
    for i, r in enumerate(runs):
        if not isinstance(r, dict) or not all(k in r for k in ("setting", "log", "repeat")) \
                or not isinstance(r["setting"], dict) or not isinstance(r["log"], dict):
            raise UserError(f"{where}: runs[{i}] must hold its 'setting', 'repeat' and 'log'")


def prediction_summary(prof: dict, replicas: int) -> dict:
    """How the predictions were made: replays with the profile's call noise, or one at typical times."""
    noise = CallNoise.from_json(prof.get("fit", {}).get("noise"))
    if noise is None or replicas < 1:
        why = "asked for (--replicas 0)" if noise is not None else "the profile measured no call noise"
        return {"replicas": 0, "noise": None, "how": f"one replay at typical call times ({why})"}
    return {"replicas": replicas, "noise": {"p50": noise.at(0.5), "p95": noise.at(0.95), "max": noise.at(1.0),
                                            "calls": noise.calls},
            "how": f"median over {replicas} replays, each call's time times a draw of the profile's call noise"}


def profile_summary(prof: dict) -> dict:
    cost = {k: v for k, v in prof["cost"].items() if k not in ("prefill", "decode")}
    cost |= {k: {f: v for f, v in prof["cost"][k].items() if f in ("form", "coef", "knot", "lone")}
             for k in ("prefill", "decode") if k in prof["cost"]}
    return {"path": prof.get("_path"), "model": prof["model"], "device": prof["device"],
            "engine": prof.get("engine", "pdsim"), "cost": cost}


def rescore(report: dict, prof: dict, out: Path, stall_ms: float = 100.0, source: str | None = None,
            replicas: int = REPLICAS, slo: tuple[str, ...] | None = None) -> dict:
    """The same measured runs, predicted again with `prof` (e.g. after a refit); nothing re-run.

    The new report keeps every measurement and says which report and profile it came from; `slo`
    (default: the report's own) the constraints checked.
    """
    slo = tuple(str(c) for c in slo_constraints(report.get("slo", ()) if slo is None else slo))
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists; not overwriting it (choose another report path)")
    check_output(out, overwrite=True, inputs=[source], what="report")
    where = source or "the report"
    check_report(report, where)
    trace = Trace.from_dicts(report["trace"]["requests"], report["trace"]["meta"], source=f"{where} trace")
    if trace.sha256() != report["trace"]["sha256"]:
        raise UserError(f"{where}: the report's trace does not match its SHA-256; refusing to rescore it")
    try:
        runs = [dict(r, label=setting_label(r["setting"])) for r in report["runs"]]  # labels by today's rules
        settings = [setting(s) for s in report["settings"]]
        results = compare(prof, trace, settings, runs, stall_ms, replicas, *warmed_with(report), slo)
    except (KeyError, TypeError, ValueError, IndexError, EngineError) as e:  # a damaged run in a well-formed report
        raise UserError(f"{where}: its runs cannot be replayed ({type(e).__name__}: {e})") from None
    new = dict(report, profile=profile_summary(prof), prediction=prediction_summary(prof, replicas),
               rescored_from=source, runs=runs, results=results, **({"slo": list(slo)} if slo else {}))
    atomic_write_json(out, new)
    return new

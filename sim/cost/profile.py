"""A profile (a calibration's JSON) read, checked and turned into the cost model it asks for.

The built-in profile (`BUILTIN`) is illustrative, shaped like tiny-llm's Qwen3-0.6B run on an
Apple M4 Pro, not a measurement; the commands say so when they use it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.cost.curve import Curve
from sim.cost.fields import ProfileError
from sim.cost.mlxlm import mlx_lm_costs
from sim.cost.grid import GridCostModel
from sim.cost.model import LinearCostModel
from sim.cost.schema import read_profile
from sim.engine.heap import GROUPS
from sim.engine.memory import device_kv_tokens, memory_model, profile_kv_bytes, profile_state_tokens

BUILTIN = Path(__file__).parents[1] / "data" / "illustrative-m4pro-qwen3-0.6b.json"


def load_profile(path: str | Path) -> dict:
    """Read and check a profile JSON (`sim.cost.schema`); ProfileError with one line on any problem."""
    return read_profile(path)


def cost_model(prof: dict) -> LinearCostModel | GridCostModel:
    """The cost model a profile asks for: each step's `use` ("fit", the default, or "grid"; profiles
    before per-step choices say it once, as `cost.use`)."""
    c = prof["cost"]
    mlx = mlx_lm_costs(c["mlx_lm"]) if "mlx_lm" in c else None
    memory, kv_bytes, capacity = memory_model(prof), profile_kv_bytes(prof), device_kv_tokens(prof)
    states = profile_state_tokens(prof)
    if "prefill" not in c:  # a profile of mlx-lm's calls only
        return LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), mlx=mlx, pdsim_forms=False, memory=memory,
                               kv_bytes=kv_bytes, kv_capacity=capacity, state_tokens=states,
                               heap_groups=int(c.get("heap_groups", GROUPS)))
    lin = LinearCostModel(tuple(c["prefill"]["coef"]), tuple(c["decode"]["coef"]), float(c.get("iteration", 0.0)),
                          join=_triple(c.get("join")), leave=_triple(c.get("leave")),
                          prefill_dense=Curve.from_pairs(c["prefill"].get("dense")),
                          decode_dense=Curve.from_pairs(c["decode"].get("dense")),
                          decode_knot=float(c["decode"].get("knot") or "inf"), decode_lone=c["decode"].get("lone"),
                          copy=float(c.get("copy", 0.0)), fresh=float(c.get("fresh", 0.0)),
                          gather=None if c.get("gather") is None else float(c["gather"]),
                          fresh_step=None if c.get("fresh_step") is None else float(c["fresh_step"]),
                          fresh_step_faults=None if c.get("fresh_step_faults") is None
                          else float(c["fresh_step_faults"]),
                          grow=None if c.get("grow") is None else float(c["grow"]),
                          grow_single=None if c.get("grow_single") is None else float(c["grow_single"]),
                          grow_single_faults=None if c.get("grow_single_faults") is None
                          else float(c["grow_single_faults"]),
                          prefill_tile=int(c["prefill"].get("tile", 0)),
                          prefill_rem=tuple(c["prefill"].get("remainder", (0.0, 0.0))), mlx=mlx, memory=memory,
                          kv_bytes=kv_bytes, kv_capacity=capacity, state_tokens=states,
                          heap_groups=int(c.get("heap_groups", GROUPS)),
                          mixed_coef=tuple(map(float, c["mixed"]["coef"])) if "mixed" in c else None,
                          mixed_dense=Curve.from_pairs(c["mixed"].get("dense")) if "mixed" in c else None,
                          mixed_tiled=bool(c.get("mixed", {}).get("tiled")))
    grid = {step: c[step].get("use", c.get("use", "fit")) == "grid" for step in ("prefill", "decode")}
    if any(grid.values()):
        return GridCostModel(lin, np.asarray(c["prefill"]["grid"], float), np.asarray(c["decode"]["grid"], float),
                             lin.iteration, grid["prefill"], grid["decode"], memory=memory)
    return lin


def _triple(v) -> tuple[float, float, float]:
    """`join`/`leave` coefficients (a, b, c); a bare number is a constant cost."""
    v = [] if v is None else [v] if isinstance(v, (int, float)) else list(v)
    return tuple(float(x) for x in (v + [0.0, 0.0, 0.0])[:3])


def check_profile_matches(prof: dict, model: str | None = None, device: str | None = None,
                          force: bool = False) -> list[str]:
    """Refuse a profile made for another model or device; with force, return warnings instead."""
    problems = []
    if model and prof["model"]["name"] != model:
        problems.append(f"profile {prof.get('_path', '')} is for model {prof['model']['name']!r}, not {model!r}")
    have = prof["device"].get("id")
    if device and have and have != device:
        problems.append(f"profile {prof.get('_path', '')} was measured on {have!r}, this is {device!r}")
    if problems and not force:
        raise ProfileError(problems[0] + " (pass --force to use it anyway)")
    return problems

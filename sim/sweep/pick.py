"""Picking a setting from a sweep: constraints on metric columns, one objective, the Pareto front.

A constraint reads `METRIC<=X` (or >=, <, >); a row meets it only with a finite value that
satisfies it, so a metric a run could not measure never passes a constraint silently. The pick is
made within each (trace, rate scale) group: settings are compared on the same traffic only.
Metric names are the registry's (`sim.metrics.registry`); an alias names the same column, and a
bare objective is optimized in the direction the registry says is better.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from policies.budget import auto_target
from sim.core.errors import UserError
from sim.metrics import registry

OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*(\S+)\s*$")
GROUP_KEYS = ("trace", "rate_scale")


class PickError(UserError, ValueError):
    """A constraint or objective that cannot be used; the message names it."""


@dataclass(frozen=True)
class Constraint:
    metric: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"

    def holds(self, values: pd.Series) -> pd.Series:
        v = pd.to_numeric(values, errors="coerce").astype(float)
        return pd.Series(np.isfinite(v) & OPS[self.op](v, self.bound), index=values.index)


@dataclass(frozen=True)
class Objective:
    metric: str = registry.DEFAULT_OBJECTIVE
    maximize: bool = True

    def __str__(self) -> str:
        return f"{'maximize' if self.maximize else 'minimize'} {self.metric}"


def parse_constraint(text: str) -> Constraint:
    m = _CONSTRAINT.match(text)
    if not m:
        raise PickError(f"--slo {text!r}: expected METRIC<=X or METRIC>=X (or KEY:MS for a goodput target)")
    metric, op, val = m.groups()
    try:
        bound = float(val)
    except ValueError:
        raise PickError(f"--slo {text!r}: {val!r} is not a number") from None
    if not math.isfinite(bound):
        raise PickError(f"--slo {text!r}: the bound must be a finite number")
    return Constraint(registry.canonical(metric), op, bound)


def split_slo(items: list[str]) -> tuple[list[str], list[Constraint]]:
    """Separate per-request goodput targets (`ttft:2000`) from constraints on columns (`p99_ttft_ms<=2000`)."""
    goodput, constraints = [], []
    for item in items:
        if any(op in item for op in OPS):
            constraints.append(parse_constraint(item))
        elif ":" in item:
            goodput.append(item)
        else:
            raise PickError(f"--slo {item!r}: expected METRIC<=X, METRIC>=X, or KEY:MS (e.g. ttft:2000)")
    return goodput, constraints


def parse_objective(text: str) -> Objective:
    """`max:output_throughput`, `maximize:...`, `min:p99_ttft_ms`; a bare metric is optimized in the
    direction that is better for it (`p99_ttft_ms` minimized, `output_throughput` maximized)."""
    direction, sep, metric = text.partition(":")
    metric = registry.canonical(metric.strip() if sep else text.strip())
    if not sep:
        m = registry.get(metric)
        if m is None or m.better is None:
            raise PickError(f"--objective {text!r}: say max:{metric} or min:{metric}"
                            + ("" if m is None else " (neither is better for it)"))
        direction = "max" if m.better == "higher" else "min"
    direction = direction.strip().lower()
    if direction not in ("max", "maximize", "min", "minimize") or not metric:
        raise PickError(f"--objective {text!r}: expected max:METRIC or min:METRIC")
    return Objective(metric, direction.startswith("max"))


def check_names(constraints: list[Constraint], objective: Objective, latency: str | None, goodput: bool,
                columns: tuple[str, ...] = ("budget", "batch_size", "rate_scale")) -> None:
    """Fail before any simulation if a name is not a column the sweep will produce (a registry
    metric, or one of `columns`), or needs a per-request target that was not given."""
    known = registry.names() + list(columns)
    wanted = [(f"--slo {c}", c.metric) for c in constraints] + [("--objective", objective.metric)]
    if latency:
        wanted.append(("--latency", latency))
    for where, metric in wanted:
        m = registry.get(metric)
        if m is not None and m.needs_slo and not goodput:
            raise PickError(f"{where}: {metric} needs a per-request target such as --slo ttft:2000")
        if metric not in known:
            close = sorted(n for n in known if metric.split("_")[0] in n)[:6]
            hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known)}"
            raise PickError(f"{where}: unknown metric {metric!r}; {hint}")
    lat = registry.get(latency) if latency else None
    if lat is not None and lat.better != "lower":
        raise PickError(f"--latency {latency}: the front's latency axis needs a metric where lower is better")


def feasible(df: pd.DataFrame, constraints: list[Constraint]) -> pd.Series:
    ok = pd.Series(True, index=df.index)
    for c in constraints:
        if c.metric not in df.columns:
            raise PickError(f"--slo {c}: unknown metric {c.metric!r} (not a column of the results)")
        ok &= c.holds(df[c.metric])
    return ok


def rank(df: pd.DataFrame, constraints: list[Constraint], objective: Objective,
         tiebreak: str | None = None) -> pd.DataFrame:
    """Feasible rows with a finite objective, best first (ties: lower `tiebreak`, smaller budget, label;
    fixed budgets by size, then auto:MS ones by target, then whole prompts)."""
    if objective.metric not in df.columns:
        raise PickError(f"--objective: unknown metric {objective.metric!r} (not a column of the results)")
    obj = pd.to_numeric(df[objective.metric], errors="coerce").astype(float)
    rows = df[feasible(df, constraints) & np.isfinite(obj)].copy()
    keys, asc = ["_obj"], [not objective.maximize]
    rows["_obj"] = obj[rows.index]
    if tiebreak and tiebreak in rows.columns and tiebreak != objective.metric:
        rows["_tie"] = pd.to_numeric(rows[tiebreak], errors="coerce").astype(float)
        keys.append("_tie")
        asc.append(True)
    if "budget" in rows.columns:  # then the smaller budget: fixed, then auto:MS, whole prompts last
        fixed = pd.to_numeric(rows["budget"], errors="coerce").astype(float)
        auto = pd.Series([auto_target(b) for b in rows["budget"]], index=rows.index, dtype=float)
        rows["_kind"] = np.where(fixed.notna(), 0, np.where(auto.notna(), 1, 2))
        rows["_budget"] = fixed.fillna(auto).fillna(math.inf)
        keys += ["_kind", "_budget"]
        asc += [True, True]
    if "label" in rows.columns:
        keys.append("label")
        asc.append(True)
    rows = rows.sort_values(keys, ascending=asc, kind="mergesort")
    return rows.drop(columns=[k for k in ("_obj", "_tie", "_kind", "_budget") if k in rows.columns])


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Rows no other row beats on both lower `x` (latency) and higher `y` (throughput), sorted by `x`.

    Rows with a missing x or y are left out. Equal points are all kept (neither beats the other).
    """
    for col in (x, y):
        if col not in df.columns:
            raise PickError(f"Pareto front: unknown metric {col!r} (not a column of the results)")
    xs = pd.to_numeric(df[x], errors="coerce").astype(float)
    ys = pd.to_numeric(df[y], errors="coerce").astype(float)
    ok = np.isfinite(xs) & np.isfinite(ys)
    sub = pd.DataFrame({"x": xs[ok], "y": ys[ok]})
    sub = sub.sort_values(["x", "y"], ascending=[True, False], kind="mergesort")
    keep, best_before = [], -math.inf
    for _, group in sub.groupby("x", sort=True):
        top = group["y"].max()
        if top > best_before:
            keep.extend(group.index[group["y"] == top])
            best_before = top
    return df.loc[keep]


@dataclass
class Pick:
    """The outcome for one group of rows."""
    group: dict
    best: pd.Series | None
    runners_up: pd.DataFrame
    front: pd.DataFrame
    feasible: int
    total: int


def pick(df: pd.DataFrame, constraints: list[Constraint], objective: Objective, latency: str,
         throughput: str = registry.DEFAULT_OBJECTIVE, top: int = 3) -> list[Pick]:
    """For each (trace, rate scale) group: the best feasible row, the next `top`, the Pareto front."""
    keys = [k for k in GROUP_KEYS if k in df.columns]
    groups = df.groupby(keys, sort=False, dropna=False) if keys else [((), df)]
    out = []
    for key, rows in groups:
        key = key if isinstance(key, tuple) else (key,)
        ranked = rank(rows, constraints, objective, tiebreak=latency)
        front = pareto_front(rows, latency, throughput)
        out.append(Pick(dict(zip(keys, key)), ranked.iloc[0] if len(ranked) else None,
                        ranked.iloc[1:1 + top], front, len(ranked), len(rows)))
    return out


def default_latency(constraints: list[Constraint]) -> str:
    """The latency axis of the front: the first upper bound on a time where lower is better, else
    the decode-completion gap's p95."""
    for c in constraints:
        m = registry.get(c.metric)
        if c.op in ("<=", "<") and m is not None and m.unit == "ms" and m.better == "lower":
            return m.name
    return registry.DEFAULT_LATENCY


def throughput_of(objective: Objective) -> str:
    """The front's throughput axis: the objective when it is maximized, else output throughput."""
    return objective.metric if objective.maximize else registry.DEFAULT_OBJECTIVE

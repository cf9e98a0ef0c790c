"""Plain-text tables for the terminal.

Hand-written on purpose: pandas' `DataFrame.to_string` (the table printer among the dependencies)
right-aligns every column and has no per-column alignment, while these tables left-align their
label column, which users and tests read by line prefix (`prefill ...`), and put a rule under the
header; the whole function is a few lines.
"""
from __future__ import annotations

import math


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def table(rows: list[dict], columns: list[str], headers: list[str] | None = None) -> str:
    headers = headers or columns
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])

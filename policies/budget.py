"""Chunk budgets: a fixed number of tokens, `auto:TARGET_MS`, and what the budget is when idle.

`auto:TARGET_MS` sizes each iteration's chunk from the cost model instead of fixing it: the
decode gap a chunk causes grows with the chunk, and with the prompt's cached prefix and the
decode batch's contexts, so one fixed budget is too small early in a prompt and too large late in
it. Every iteration the policy takes the longest chunk whose predicted iteration time (host work,
the chunk, and the iteration's decodes, priced by the same cost model the simulator charges,
`sim.cost.price.iteration_seconds`) is at most the target; at least 1 token, so prefill always
progresses even where one token alone misses the target. The search is a bisection for a
boundary: the chunk n fits and n + 1 does not (or n is the whole rest of the prompt). Where the
profile prices a longer chunk cheaper than a shorter one (BLAS tiles: 128 tokens faster than
120), a chunk longer than n may fit too; the one taken still fits.

`idle_budget`: "budget" (the budget applies whatever runs) or "whole": when no request is
decoding (none holds or waits for a decode slot) there is no decode gap to protect, so the whole
rest of the prompt runs in one call.
"""
from __future__ import annotations

import math

from policies.base import PolicyError

AUTO = "auto:"
IDLE_BUDGETS = ("budget", "whole")  # idle_budget's values; "budget" is the default
MAX_TOKENS = 1 << 53  # a larger budget can only be a typo (the CLI's largest count)


def parse_budget(value) -> int | str | None:
    """A budget as a setting holds it: None (whole prompts), a whole number of tokens >= 1, or
    `auto:MS` with MS a finite number of milliseconds > 0, written canonically (`auto:40`).
    PolicyError, in one line naming the value, for anything else."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        if value is not None and not 1 <= value <= MAX_TOKENS:
            raise PolicyError(f"budget must be a positive number of tokens up to {MAX_TOKENS:,}, got {value}")
        return value
    if isinstance(value, float) and value.is_integer():
        return parse_budget(int(value))
    text = str(value).strip()
    if text.isdigit():
        return parse_budget(int(text))
    if not text.lower().startswith(AUTO):
        raise PolicyError(f"budget {value!r}: expected a whole number of tokens >= 1 or auto:TARGET_MS (e.g. auto:40)")
    ms_text = text[len(AUTO):]
    try:
        ms = float(ms_text)
    except ValueError:
        raise PolicyError(f"budget {value!r}: the target after 'auto:' must be a number of milliseconds "
                          f"(e.g. auto:40), got {ms_text!r}") from None
    if not math.isfinite(ms) or ms <= 0:
        raise PolicyError(f"budget {value!r}: the target must be a finite number of milliseconds > 0")
    return f"{AUTO}{ms:g}"


def auto_target(budget) -> float | None:
    """The target of an `auto:MS` budget, in seconds; None for a fixed budget or whole prompts."""
    if isinstance(budget, str) and budget.startswith(AUTO):
        return float(budget[len(AUTO):]) / 1e3
    return None


def is_adaptive(budget, idle_budget: str | None) -> bool:
    """Whether a setting uses either option of this module (both need a policy that reads a budget)."""
    return auto_target(budget) is not None or idle_budget == "whole"


def check_idle_budget(value) -> str:
    """idle_budget as a setting holds it ("budget" when not given)."""
    if value is None:
        return "budget"
    if value not in IDLE_BUDGETS:
        raise PolicyError(f"idle_budget must be one of {', '.join(IDLE_BUDGETS)}, got {value!r}")
    return value


def largest_fitting(fits, left: int) -> int:
    """The chunk `auto` takes, of a prompt with `left` tokens to go: `left` if it fits, 1 if
    nothing fits (the floor), else a boundary n found by bisection: fits(n) and not fits(n + 1)."""
    if fits(left):
        return left
    lo, hi = 1, left  # invariant: fits(lo) or lo == 1 (the floor); not fits(hi)
    if not fits(lo):
        return 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo

"""Which way a run went: its scheduling decisions in order, the engine's against the replays'.

A replay can price every call well and still miss a tail by taking another path: one decode step
more before an arrival, and a request leaves before another joins, so a batch's cache grows where
no request waits on it. A metric's miss is a miss of the prices only where the replays took the
engine's path, so a confirm says, for each measured run, how many replays took its path and where
the replay at typical call times parted from it: the first call that differs, how far the
replay's clock had run ahead of the engine's by then, and the earlier call whose time the replay
missed by most, which is usually what moved the paths apart.

A path is the run's calls in order without their times: each call's kind, requests and tokens.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.engine.log import Call, EventLog

Step = tuple[str, tuple[str, ...], int]


def path(log: EventLog) -> list[Step]:
    """The run's decisions: (kind, requests, tokens) of every call, in order."""
    return [(c.kind, c.rids, c.tokens) for c in log.calls]


def first_difference(a: list[Step], b: list[Step]) -> int | None:
    """The index of the first call where two paths differ (one path ending first counts); None:
    the same path."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def describe(call: Call | None) -> str:
    """A call as a reader names it: "prefill 2 (34 tokens)", "decode 0,1"."""
    if call is None:
        return "nothing (the run had ended)"
    sized = call.kind in ("prefill", "prompt", "preempt")
    return f"{call.kind} {','.join(call.rids)}" + (f" ({call.tokens} tokens)" if sized else "")


@dataclass(frozen=True)
class Parting:
    """Where a replay left a measured run's path."""
    call: int  # the index of the first call that differs
    at_s: float  # when the engine started its call there (or ended its last)
    engine: str  # what the engine did there, and what the replay did instead
    replay: str
    replay_ahead_s: float  # the engine's clock minus the replay's at that call: + the replay ran fast
    missed: str  # the earlier call whose time the replay missed by most ("" when none came before)
    missed_at_s: float
    missed_measured_s: float
    missed_replayed_s: float


def parting(run: EventLog, replay: EventLog) -> Parting | None:
    """Where `replay` left `run`'s path; None where it took the same path."""
    mine, theirs = run.calls, replay.calls
    i = first_difference(path(run), path(replay))
    if i is None:
        return None
    at = mine[i].start if i < len(mine) else mine[-1].end
    ahead = at - (theirs[i].start if i < len(theirs) else theirs[-1].end)
    before = [(abs((m.end - m.start) - (r.end - r.start)), j) for j, (m, r) in enumerate(zip(mine[:i], theirs[:i]))]
    j = max(before)[1] if before else None
    m, r = (mine[j], theirs[j]) if j is not None else (None, None)
    return Parting(i, at, describe(mine[i] if i < len(mine) else None),
                   describe(theirs[i] if i < len(theirs) else None), ahead,
                   describe(m) if m else "", m.start if m else 0.0, m.end - m.start if m else 0.0,
                   r.end - r.start if r else 0.0)


def paths_of(runs: list[EventLog], repeats: list[int], replays: list[EventLog], typical: EventLog) -> dict:
    """For each measured run: how many of `replays` took its path, and where `typical` (the replay
    at typical call times) parted from it (None: it did not)."""
    own = [path(r) for r in replays]
    out = []
    for rep, run in zip(repeats, runs):
        mine = path(run)
        gone = parting(run, typical)
        out.append({"repeat": rep, "same": sum(p == mine for p in own),
                    "parted": asdict(gone) if gone else None})
    return {"replays": len(replays), "runs": out}


def summary(paths: dict) -> str:
    """One line for a confirm's console: the replays on each run's path, and the first parting."""
    runs = paths["runs"]
    line = (f"replays that took each run's path (of {paths['replays']}): "
            + " ".join(f"r{r['repeat']} {r['same']}" for r in runs))
    gone = next((r for r in runs if r["parted"]), None)
    if gone is None:
        return line + "; the replay at typical times took every run's path"
    p = gone["parted"]
    return (line + f"; r{gone['repeat']}: the replay at typical times parts at {p['at_s']:.2f} s (call {p['call']}: "
            f"the engine ran {p['engine']}, the replay {p['replay']}), its clock {abs(p['replay_ahead_s']):.2f} s "
            f"{'ahead of' if p['replay_ahead_s'] >= 0 else 'behind'} the engine's"
            + (f"; the call it missed most before: {p['missed']} at {p['missed_at_s']:.2f} s, "
               f"{p['missed_measured_s'] * 1e3:.0f} ms measured, {p['missed_replayed_s'] * 1e3:.0f} ms replayed"
               if p["missed"] else ""))

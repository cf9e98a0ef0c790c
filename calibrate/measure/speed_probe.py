"""How fast the machine runs now, against its calibration: a short fixed run timed around each confirm run.

A shared machine changes speed: on the 2-vCPU VM pdsim is built on, confirm runs made minutes after
a calibration ran 0.85-1.47x as fast as it, and every measured figure moved with them. That is the
machine, not the cost model, and no cost model can predict it. So each confirm worker serves this
probe, in its own process, just before and just after its timed run: two requests of 8 tokens under
fifo, prompts of 32 and 64 tokens, steady decodes of a batch of one, then four prompts of unaligned
length served by their prefill alone (`PROMPTS`; its joins and buffer growths are left out). The
median over the probe's prefills of predicted over measured is the machine's prefill speed then,
over its decodes its decode speed (`probe_speed`; `sim.cost.speed.MachineSpeed`: the two move apart, a
prefill is bound by arithmetic and a decode by memory). That also scales a prediction by whatever
the model gets wrong on the probe's own shapes, so a calibration serves the same probe before and
after each of its engine runs and keeps it. The speed is read with no price in it: each probe's
time for each call against the calibration's probes in the same place, before a run or after it
(`positional_speed`), the reading priced by the profile kept beside it (and used where the
calibration kept no probe after its runs). The run is predicted at the speed
(`sim.predict.replays`), and the report keeps the prediction at the calibration's speed beside it.
The probe is never a call of the run being scored. A profile of mlx-lm's calls is probed on
BatchGenerator (`MLX_SETTING`: the same requests, one prompt a call), its prompt calls giving the
prefill speed and its generation steps the decode speed (a confirm of three settings had runs 28%
apart in speed, and without the probe nothing in the prediction says so).
"""
from __future__ import annotations

import mmap
import statistics
import time

import numpy as np

import policies
from calibrate.engine.executor import RealEngine
from sim.cost.model import CostModel
from sim.cost.speed import MachineSpeed
from sim.engine.log import Call, EventLog
from sim.metrics.residuals import call_kind, call_ratios
from traces.generators import fixed
from traces.trace import Trace

SETTING = {"policy": "fifo"}
MLX_SETTING = {"policy": "mlx-lm", "prefill_step": 64, "prompt_concurrency": 1, "decode_concurrency": 2}
PREFILLS, DECODES = ("prefill", "prompt"), ("decode", "generate")  # call kinds of each speed (`sim.cost.speed`)
ALLOC_BYTES = 64 << 20  # fresh pages mapped and touched by each probe (`allocation_seconds`)
ALLOC_METHOD = "mmap"  # how (older probes timed an MLX array: not compared with these)


# The probe's requests, all at t=0 under fifo: two that decode (8 tokens each: steady decodes of a
# batch of one) and four whose one token comes from their prefill (unaligned prompts, as runs have).
# The four make twelve prefills a run (a probe before it and one after), not four. One call strays
# from its run's prefill speed by 4.8% (sd, over 684 calls) and the median of four by 2.6%, as four
# independent draws would. The median of twelve strays 2.1% (of four: 2.1-3.1% by confirm round):
# what is left is drift between the probes and the run, not the probe's noise.
PROMPTS, OUTPUTS = (32, 64, 21, 37, 45, 53), (8, 8, 1, 1, 1, 1)


def probe_trace(vocab: int) -> Trace:
    """The probe's requests (`PROMPTS`, `OUTPUTS`; about 6 s on Qwen3-0.6B on this CPU)."""
    return fixed([0.0] * len(PROMPTS), list(PROMPTS), list(OUTPUTS), seed=5, vocab=vocab)


def probe_speed(logs: list[EventLog], cost: CostModel) -> MachineSpeed | None:
    """The median over the probes' prefills, and over their decodes, of predicted/measured: above
    1 the machine ran them faster than at its calibration; None without calls to price (pdsim's
    calls with a profile of mlx-lm's calls only)."""
    if not cost.pdsim_forms and any(c.kind in ("prefill", "decode") for log in logs for c in log.calls):
        return None
    ratios = call_ratios(logs, cost)
    prefill = [r for kind, _, r in ratios if kind in PREFILLS]
    decode = [r for kind, _, r in ratios if kind in DECODES]
    if not prefill or not decode:
        return None
    return MachineSpeed(statistics.median(prefill), statistics.median(decode))


def allocation_seconds(nbytes: int = ALLOC_BYTES, hold: list[mmap.mmap] | None = None) -> float:
    """Seconds to map `nbytes` of fresh anonymous memory and touch each of its pages: what a join,
    a buffer growth or a fresh process pays per page on top of its copy (`fresh` and `grow_single`
    in `sim.cost.model`). On this VM that is page faults, 3-4 us a 4 KiB page (64 MiB in 50-67 ms),
    not the machine's compute: it can cost 3-5x more for half an hour while prefills and decodes
    keep their speed, so the probes' calls cannot see it. The region is mapped here, not asked of
    MLX or malloc: an MLX array of the same size times the allocator's state as much as the
    machine (a freed block it still holds makes the pages old), and two such probes minutes apart
    read 3.3x and 0.4x the calibration's speed. `hold`: a list that
    keeps the mapping (unmapped when its holder closes it) instead of unmapping it here."""
    region = mmap.mmap(-1, nbytes)
    pages = np.frombuffer(region, dtype=np.uint8)
    t = time.perf_counter()
    pages[::mmap.PAGESIZE] = 1
    seconds = time.perf_counter() - t
    del pages
    if hold is None:
        region.close()
    else:  # kept mapped by the caller (`Probe`), so the next call cannot fault in its warm pages
        hold.append(region)
    return seconds


def memory_speed(probes: list[dict], reference: list[dict]) -> float | None:
    """The calibration's allocation time (median over its probes, `reference`) over the time now
    (median over `probes`): below 1, fresh memory costs more than when the profile was made. None
    where either side has none timed by today's method (`ALLOC_METHOD`; older probes have none)."""
    now = [t for p in probes if p.get("alloc_method") == ALLOC_METHOD for t in p.get("alloc_s") or ()]
    then = [t for p in reference if p.get("alloc_method") == ALLOC_METHOD for t in p.get("alloc_s") or ()]
    if not now or not then or min(now) <= 0:
        return None
    return statistics.median(then) / statistics.median(now)


DEAR_READINGS = 3  # the dearest allocation readings whose median prices a page fault the host serves


def dear_page_seconds(probes: list[dict]) -> float | None:
    """Seconds per page (4 KiB here) that a page fault costs when the host has to back the page: the
    median of the `DEAR_READINGS` dearest per-page allocation times over `probes` (None with
    fewer readings, or none timed by today's method). On this Firecracker VM a fault costs
    2.5-4 us where the guest reuses a page it freed a moment ago and 10-16 us where, it seems,
    the host has taken the page back (the VM's kernel reports free pages to the host: virtio
    balloon's free page reporting). Read directly, a process touching 4 GB of new pages pays
    1.5-1.9 us a page for the first 0.8-1.6 GB (pages the guest had freed and not yet reported)
    and 11-12 us for the rest. The probes read one, the other or a mixture. A single decode's
    buffer growth paid the dear price in 13 of 18 growths of one confirm's meTile runs, and those
    set the runs' worst gaps."""
    per_page = _per_page(probes)
    if len(per_page) < DEAR_READINGS:
        return None
    return statistics.median(per_page[-DEAR_READINGS:])


def page_price(runs: list[dict], dear: float | None) -> float:
    """A page fault's price around these runs (a confirm's, every setting's) over the
    calibration's dear one (`dear_page_seconds`; 1.0 where either is unknown), at most 1: the
    dearest per-page reading of their probes. On this VM the price is one of two by the hour: in
    one meTile confirm every probe read 2.5-2.7 us a page, where the calibration's dearest read
    11.5, and all 18 of its single-decode growths paid 0-3 us a fault. A probe reads the price of
    a moment, so one dear reading says the hour has dear faults: one run's two probes read 2.5 and
    2.9 us where its growths paid 13-14. Capped, as the dear price already is the host backing a
    page."""
    read = _per_page([r["probe"] for r in runs if r.get("probe")])
    return min(1.0, read[-1] / dear) if dear and read else 1.0


def _per_page(probes: list[dict]) -> list[float]:
    """The probes' allocation readings by today's method, in seconds per page, cheapest first."""
    timed = [p for p in probes if p.get("alloc_method") == ALLOC_METHOD and p.get("alloc_bytes")]
    return sorted(t * mmap.PAGESIZE / p["alloc_bytes"] for p in timed for t in p.get("alloc_s") or ())


def timed_speed(logs: list[EventLog], reference: list[EventLog]) -> MachineSpeed | None:
    """The median over the probes' prefills, and over their decodes, of the calibration's time for
    the same call (the median over its probes, `reference_probes`) over the time now: the machine's
    speed with no cost model in it. None where the calls are not the calibration's, one for one."""
    return _speed(_timed_ratios(logs, reference))


def positional_speed(logs: list[EventLog], reference: list[list[EventLog]]) -> MachineSpeed | None:
    """`timed_speed` with each probe timed against the calibration's probes in the same place: the
    one before a run (a process that has served nothing) against those before the calibration's
    runs, the one after against those after. None unless both sides have a probe before and after.

    A process's first calls fault their memory in and its later ones reuse it, so the two places
    run at two speeds, and the confirm's warm-up (the trace itself) moves the one after. Priced
    by the profile (fitted on warm grid calls), over 50 runs pdsim's probe before read prefills at
    0.86-1.05x where the run's own calls ran 0.94-1.07x, and mlx-lm's probe after read them at
    1.10-1.18x where they ran 0.95-1.06x. Timed place by place and moved partway
    (`sim.cost.speed.SpeedRules`), the speed strays from the run's own by a median 1.8% on
    prefills (priced: 2.8%), at most 8% (14%), and mlx-lm's settings read 1.00-1.03x; on decodes
    by 2.7% (2.4%), at most 12% (13%). Over 48 more runs: prefills 1.6%, at most 5.5% (priced
    1.7%, 9.0%); decodes 1.8%, at most 7.7% (3.0%, 8.9%)."""
    if len(logs) != 2 or not reference or any(len(r) != 2 for r in reference):
        return None
    ratios = [_timed_ratios([logs[i]], [r[i] for r in reference]) for i in (0, 1)]
    if any(r is None for r in ratios):
        return None
    return _speed(tuple(ratios[0][k] + ratios[1][k] for k in (0, 1)))


def timed_in_place(logs: list[EventLog], places: list[list[EventLog]]) -> MachineSpeed | None:
    """The machine's speed with no price in it: `positional_speed` where both sides probed before
    and after their runs, else `timed_speed` against all of the calibration's probes."""
    return positional_speed(logs, places) or timed_speed(logs, [log for ls in places for log in ls])


def _timed_ratios(logs: list[EventLog], reference: list[EventLog]) -> tuple[list[float], list[float]] | None:
    """The calibration's time over the time now, call by call, prefills and decodes apart."""
    if not logs or not reference:
        return None
    shapes = [[shape(c) for c in log.calls] for log in reference + logs]
    if any(s != shapes[0] for s in shapes):
        return None
    then = [statistics.median(c.end - c.start for c in calls) for calls in zip(*(log.calls for log in reference))]
    prefill, decode = [], []
    for log in logs:
        for (kind, *_), t, c in zip(shapes[0], then, log.calls):
            if t > 0 and c.end > c.start:
                (prefill if kind in PREFILLS else decode if kind in DECODES else []).append(t / (c.end - c.start))
    return prefill, decode


def _speed(ratios: tuple[list[float], list[float]] | None) -> MachineSpeed | None:
    if not ratios or not ratios[0] or not ratios[1]:
        return None
    return MachineSpeed(statistics.median(ratios[0]), statistics.median(ratios[1]))


def shape(c: Call) -> tuple:
    """What makes two calls the same work: a call is timed only against one of its own shape."""
    return call_kind(c), c.tokens, c.prefix, c.contexts, c.joined, c.left, len(c.rids)


def reference_probes(prof: dict) -> list[dict]:
    """The probes a calibration served around its engine runs (`calibrate.measure.engine_runs`; none in
    profiles that predate speed probes), as a confirm run keeps its own (`Probe.result`)."""
    return [r["probe"] for r in prof.get("engine_runs") or [] if (r.get("probe") or {}).get("logs")]


def probe_engine(prof: dict, engine: str) -> str | None:
    """Which engine a confirm's probes run on, so the profile prices their calls: BatchGenerator
    for a confirm of it with a profile of its calls, else pdsim's executor; None: neither priced."""
    if engine == "mlx-lm" and "mlx_lm" in prof["cost"]:
        return "mlx-lm"
    return "pdsim" if "prefill" in prof["cost"] else None


class Probe:
    """The machine's speed just before and just after a timed run (`calibrate.measure.speed_probe`), on an
    engine of its own, so the run's engine state is the one the warm-up left; `engine`: what the
    spec asks for (`probe_engine`; True, from older specs: pdsim's; None: no probe). A
    calibration's engine runs serve both too (about 6 s each): on this VM the two together
    tracked a confirm run's speed within 3.5% on average, the one before alone within 5.8%.

    The probes' fresh pages stay mapped until `result`. Unmapped at once, they are warm pages the
    run's first calls fault in before the guest has handed them back to the host: three meTile
    growths that came first in their runs paid 2.0-2.9 us a faulted page, where the growths after
    a prefill paid 11-13, and those first ones set fifo's max ITL."""

    def __init__(self, lm, engine: str | bool | None):
        self.engine = "pdsim" if engine is True else engine or None
        self.lm, self.trace, self.logs, self.alloc = lm, probe_trace(lm.vocab_size), [], []
        self.held: list[mmap.mmap] = []  # the probes' mappings, given back in `result`
        self.setting = MLX_SETTING if self.engine == "mlx-lm" else SETTING
        self.pdsim = RealEngine(lm) if self.engine == "pdsim" else None

    def run(self) -> None:
        if self.engine == "mlx-lm":
            from calibrate.engine.batchgen import run_batch_generator
            self.logs.append(run_batch_generator(self.lm, self.trace, self.setting)[0].log.to_dict())
        elif self.engine == "pdsim":
            self.logs.append(self.pdsim.run(self.trace, policies.make(**self.setting)).log.to_dict())
        if self.engine:
            self.alloc.append(allocation_seconds(hold=self.held))

    def result(self) -> dict:
        """The probes' readings; their pages are given back here, after the run they bracket."""
        for region in self.held:
            region.close()
        self.held.clear()
        return {"trace": self.trace.to_dict(), "setting": self.setting, "logs": self.logs,
                "alloc_s": self.alloc, "alloc_bytes": ALLOC_BYTES,
                "alloc_method": ALLOC_METHOD}

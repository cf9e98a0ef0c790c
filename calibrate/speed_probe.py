"""How fast the machine runs now, against its calibration: a short fixed run timed around each confirm run.

A shared machine changes speed: on the 2-vCPU VM pdsim is built on, confirm runs made minutes
after a calibration ran 0.85-1.47x as fast as it, and every measured figure moved with them.
That is the machine, not the cost model, and no cost model can predict it. So each confirm
worker serves this probe, in its own process, just before and just after its timed run: two
requests under fifo, prompts of 32 and 64 tokens (aligned grid shapes) and steady decodes of a
batch of one, the calls a calibration prices best (its joins and buffer growths are left out).
The median over the probe's prefills of predicted over measured is the machine's prefill speed
then, over its decodes its decode speed (`sim.speed.MachineSpeed`: the two move apart, a
prefill is bound by arithmetic and a decode by memory); the run is predicted at them
(`sim.predict.replays`), and the report keeps the prediction at the calibration's speed beside
it. The probe is never a call of the run being scored.
"""
from __future__ import annotations

import statistics

import policies

from calibrate.executor import RealEngine
from sim.costmodel import CostModel
from sim.log import EventLog
from sim.residuals import call_ratios
from sim.speed import MachineSpeed
from traces.generators import fixed
from traces.trace import Trace

SETTING = {"policy": "fifo"}


def probe_trace(vocab: int) -> Trace:
    """The probe's requests: at t=0, prompts 32 and 64, 8 tokens each (about 3 s on Qwen3-0.6B, CPU)."""
    return fixed([0.0, 0.0], [32, 64], [8, 8], seed=5, vocab=vocab)


def probe_speed(logs: list[EventLog], cost: CostModel) -> MachineSpeed | None:
    """The median over the probes' prefills, and over their decodes, of predicted/measured: above
    1 the machine ran them faster than at its calibration; None without calls to price (a profile
    of mlx-lm's calls only)."""
    if not getattr(cost, "pdsim_forms", True):
        return None
    ratios = call_ratios(logs, cost)
    prefill = [r for kind, _, r in ratios if kind == "prefill"]
    decode = [r for kind, _, r in ratios if kind == "decode"]
    if not prefill or not decode:
        return None
    return MachineSpeed(statistics.median(prefill), statistics.median(decode))


class Probe:
    """The machine's speed just before and just after a timed run (`calibrate.speed_probe`), on an
    engine of its own, so the run's engine state is the one the warm-up left; `on`: the spec asks
    for it (confirm does, with a profile that prices pdsim's engine; a calibration's runs do not)."""

    def __init__(self, lm, on: bool):
        self.engine, self.trace, self.logs, self.on = RealEngine(lm), probe_trace(lm.vocab_size), [], on

    def run(self) -> None:
        if self.on:
            self.logs.append(self.engine.run(self.trace, policies.make(**SETTING)).log.to_dict())

    def result(self) -> dict:
        return {"trace": self.trace.to_dict(), "setting": SETTING, "logs": self.logs}

"""A cost model on a machine that runs at another speed than when it was calibrated.

A shared machine changes speed from minute to minute, and not alike for every call: a prefill
chunk is bound by arithmetic, a decode step by memory bandwidth, so a neighbour's memory traffic
slows decodes more than prefills (on the 2-vCPU VM pdsim is built on, speed probes a few seconds
apart read prefills at 1.04x and decodes at 1.19x the calibration's speed). A confirm measures
both around each run (`calibrate.measure.speed_probe`) and predicts the run at them (`sim.predict`),
moved part of the way only, by the profile's rules (`SpeedRules`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sim.cost.model import CostModel


@dataclass(frozen=True)
class SpeedRules:
    """How a confirm turns the speed its probes read into the speed it predicts a run at, as the
    profile's host measured it (the profile's `speed_rules`; neutral where nothing was measured).

    `probe_weight`: how far, in log scale, a run's own speed follows its probes' reading: a probe
    of a few seconds reads the machine's drift larger than the run beside it shows. `run_decode`:
    how much faster a run in a process that has served its trace decodes than pdsim's probes say
    (only pdsim's probes are corrected). Both are measured by confirm rounds on a host, not by one
    calibration; docs/confirm.md gives the figures behind the values a CPU calibration writes."""
    probe_weight: float = 1.0
    run_decode: float = 1.0

    @staticmethod
    def of(prof: dict) -> "SpeedRules":
        """The profile's rules; a profile that predates them keeps the rules it was predicted with."""
        rules = prof.get("speed_rules")
        if rules is None:
            return XEON_VM
        return SpeedRules(float(rules["probe_weight"]), float(rules["run_decode"]))

    def to_json(self, source: str) -> dict:
        return {"probe_weight": self.probe_weight, "run_decode": self.run_decode, "source": source}


# Measured on the 2-vCPU Xeon VM pdsim is built on, over 28 confirmed settings (probe weight: 0.8
# held 12 of 28 settings to all three accuracy targets, 0.6 and 1.0 each 10) and 105 runs (decodes
# 1.35% faster than probed); docs/confirm.md. A CPU calibration writes these into its profile.
XEON_VM = SpeedRules(probe_weight=0.8, run_decode=1.0135)


@dataclass(frozen=True)
class MachineSpeed:
    """Predicted over measured call time, per kind: above 1 the machine runs faster than at its
    calibration. `prefill`: prompt chunks (mlx-lm's prompt calls); `decode`: every other call
    (decode steps, batch rebuilds, KV copies, mlx-lm's first forwards and steps)."""
    prefill: float = 1.0
    decode: float = 1.0
    # A page fault's price now over the calibration's dear one (`calibrate.measure.speed_probe.page_price`):
    # what a growth pays for its faults (`grow_single_faults`, `fresh_step_faults`). On a shared VM it
    # changes by the hour: probes have read 2.6 us a page where the calibration read 11.5, and meTile's
    # growths then paid 0-3 us a fault; in other hours they read 6-16 and growths paid 10-22.
    page: float = 1.0

    def of(self, cost: CostModel) -> CostModel:
        """`cost` with every call's price divided by its kind's speed."""
        return cost if (self.prefill, self.decode, self.page) == (1.0, 1.0, 1.0) else AtSpeed(cost, self)

    def to_json(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode, **({"page": self.page} if self.page != 1.0 else {})}

    def partway(self, rules: SpeedRules, pdsim_probes: bool = True) -> "MachineSpeed":
        """This speed moved only `rules.probe_weight` of the way from the calibration's (1.0), in log
        scale, the decodes' then times `rules.run_decode` where pdsim's own probes read them. A
        page's price is read directly (a probe faults pages in as a growth does), and moves all the way."""
        w = rules.probe_weight
        return MachineSpeed(self.prefill ** w, self.decode ** w * (rules.run_decode if pdsim_probes else 1.0), self.page)


def _at(price: float | None, speed: float) -> float | None:
    """An optional price at a speed (None stays None: the profile has no such price)."""
    return None if price is None else price / speed


class AtSpeed:
    """A cost model's prices at a `MachineSpeed`; everything else (the memory model, the host's
    time between calls, KV sizes) is the cost model's own."""

    def __init__(self, cost: CostModel, speed: MachineSpeed):
        self.cost, self.speed = cost, speed

    def __getattr__(self, name: str):
        return getattr(self.cost, name)

    @property
    def copy(self) -> float:
        return self.cost.copy / self.speed.decode

    @property
    def fresh(self) -> float:
        return self.cost.fresh / self.speed.decode

    @property
    def gather(self) -> float | None:
        return _at(self.cost.gather, self.speed.decode)

    @property
    def fresh_step(self) -> float | None:
        return self._faulted(self.cost.fresh_step, self.cost.fresh_step_faults)

    @property
    def grow(self) -> float | None:
        return _at(self.cost.grow, self.speed.decode)

    @property
    def grow_single(self) -> float | None:
        return self._faulted(self.cost.grow_single, self.cost.grow_single_faults)

    @property
    def grow_single_faults(self) -> float | None:
        """`grow_single`'s faults at the page's price (what a growth in held memory does not pay)."""
        return _at(self.cost.grow_single_faults, 1 / self.speed.page)

    def _faulted(self, price: float | None, faults: float | None) -> float | None:
        """A price whose `faults` part moves with the page's price, the rest with the decode's."""
        if price is None or faults is None:
            return _at(price, self.speed.decode)
        return (price - faults) / self.speed.decode + faults * self.speed.page

    def prefill(self, chunk: int, prefix: int) -> float:
        return self.cost.prefill(chunk, prefix) / self.speed.prefill

    def prefill_steps(self, chunk: int, prefix: int, steps: int) -> np.ndarray:
        return self.cost.prefill_steps(chunk, prefix, steps) / self.speed.prefill

    def decode(self, contexts: Sequence[int], single: bool = False) -> float:
        return self.cost.decode(contexts, single) / self.speed.decode

    def decode_steps(self, contexts: Sequence[int], steps: int, single: bool = False) -> np.ndarray:
        return self.cost.decode_steps(contexts, steps, single) / self.speed.decode

    def membership(self, joined: int, left: int, contexts: Sequence[int]) -> float:
        return self.cost.membership(joined, left, contexts) / self.speed.decode

    def mlx_lm_call(self, kind: str, tokens: int, idx: int, contexts: Sequence[int], written: int,
                    fresh: int) -> float:
        speed = self.speed.prefill if kind == "prompt" else self.speed.decode
        return self.cost.mlx_lm_call(kind, tokens, idx, contexts, written, fresh) / speed

    def generate_steps(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        return self.cost.generate_steps(contexts, steps) / self.speed.decode

    def mixed(self, chunks: Sequence[int], prefixes: Sequence[int]) -> float:
        """At the prefill speed where a prompt rides in it (arithmetic-bound), else the decode speed."""
        speed = self.speed.prefill if sum(chunks) > len(chunks) else self.speed.decode
        return self.cost.mixed(chunks, prefixes) / speed

    def mixed_steps(self, prefixes: Sequence[int], steps: int) -> np.ndarray:
        return self.cost.mixed_steps(prefixes, steps) / self.speed.decode  # decode rows only

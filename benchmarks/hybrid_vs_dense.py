"""A dense and a hybrid model side by side, each on its own profile, as `pdsim tune` would answer
for it: its SLOs derived from its calibration, the capacity of fifo, eager and chunked over
budgets, and the pick; then, on one common trace, the p95 and max decode gap each budget causes.

Run: python benchmarks/hybrid_vs_dense.py DENSE.json HYBRID.json
Prints tables; asserts nothing. Simulation only: about a minute.
"""
import argparse

import policies
from sim.commands import capacity as capacity_cmd
from sim.commands.tune_capacity import BUDGETS, TRAFFIC, base_rate, default_slos, settings_for
from sim.core.table import table
from sim.cost.profile import cost_model, load_profile
from sim.metrics.scoring import score
from sim.replay import simulate
from sim.sweep.capacity import DEFAULT_RANGE, search
from sim.sweep.results import SweepPlan
from traces.generators import gamma


def tune_pick(prof: dict) -> dict:
    """`pdsim tune`'s capacity stage on this profile: its SLOs, the pick and its capacity."""
    cost = cost_model(prof)
    trace = gamma(rate=round(base_rate(cost, "cpu"), 4), **TRAFFIC["cpu"])
    slo = default_slos(cost, "cpu")
    plan = SweepPlan({"trace": trace}, settings_for("pdsim", "cpu"), prof, slo=slo)
    inputs = plan.inputs()
    found = search(settings_for("pdsim", "cpu"), "trace", inputs, plan.constraints, DEFAULT_RANGE, progress=False)
    result = capacity_cmd.summary(found, "trace", inputs, plan.constraints)
    best = result["settings"][0]
    return {"model": prof["model"]["name"], "slo": " and ".join(slo), "pick": best["label"],
            "capacity_req_s": best["capacity_req_s"], "runner_up": result["settings"][1]["label"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profiles", nargs="+")
    a = p.parse_args()
    profs = [load_profile(path) for path in a.profiles]
    print(table([tune_pick(prof) for prof in profs], ["model", "slo", "pick", "capacity_req_s", "runner_up"]))
    trace = gamma(rate=0.05, **TRAFFIC["cpu"])  # one common trace, slow enough for either model
    rows = []
    for b in BUDGETS["cpu"]:
        row = {"setting": f"chunked/b{b}/bs4"}
        for prof in profs:
            cost = cost_model(prof)
            m = score(simulate(trace, policies.make("chunked", budget=b, batch_size=4), cost))
            name = prof["model"]["name"]
            row[f"{name} gap p95 ms"] = round(m["decode_gap_p95_ms"], 1)
            row[f"{name} gap max ms"] = round(m["decode_gap_max_ms"], 1)
        rows.append(row)
    print(f"\none trace for every model: {len(trace)} requests, gamma at 0.05 requests/s; the decode gaps chunked causes")
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

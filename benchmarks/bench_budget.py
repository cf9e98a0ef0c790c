"""Simulator speed with adaptive budgets (auto:MS, idle_budget whole) against a fixed budget, on the
same Poisson trace.

Run: python benchmarks/bench_budget.py [--requests N ...]. Prints figures; asserts nothing. An
auto chunk is searched for (a bisection, each candidate priced as the replay charges it) and its
iterations are priced call by call (its chunks change every iteration, `sim.steady`); its
chunk-free iterations still run as steady stretches.
"""
from speed import main

SETTINGS = (
    {"policy": "chunked", "budget": 128, "batch_size": 8},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "idle_budget": "whole"},
    {"policy": "chunked", "budget": "auto:60", "batch_size": 8},
    {"policy": "chunked", "budget": "auto:60", "batch_size": 8, "idle_budget": "whole"},
)


if __name__ == "__main__":
    main(SETTINGS)

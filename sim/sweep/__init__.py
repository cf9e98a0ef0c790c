"""Sweeps: replay traces under a grid of settings (`run`, on local processes or a Dask
cluster), write the results (`results`) and pick the best setting under constraints (`pick`)."""
from sim.sweep.run import Inputs, grid, run_sweep

__all__ = ["Inputs", "grid", "run_sweep"]

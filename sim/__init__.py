"""The simulator: the engine state machine, cost models, the SimPy replay, metrics, sweeps,
reports and the command line. Nothing here imports MLX, so simulations and sweeps run anywhere.

Layers, lowest first (each imports only those below it; `tests/test_layers.py` checks):
`sim.core` (errors, input and output files), `traces`, `sim.engine` (what the engine holds and
how each call changes it), `sim.cost` (what a call costs), `policies` (what runs next),
`sim.replay` / `sim.steady` / `sim.predict` and `sim.metrics` (running and scoring a trace),
`sim.sweep` and `sim.report`, `calibrate` (real kernels), then `sim.commands` and `sim.cli`.
"""

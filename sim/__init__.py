"""The simulator: engine state machine, cost models, SimPy replay, metrics, sweeps, reports, CLI.

Nothing here imports MLX, so simulations and sweeps run on any machine.
"""

"""Everything that runs real MLX kernels, and only this package does.

`engine` builds the model and runs a policy's calls on MLX (pdsim's executor, and mlx-lm's own
BatchGenerator) behind the correctness gate; `host` says which machine and BLAS ran and keeps
freed memory in the process; `measure` times the grid, the engine runs and the speed probes,
resumably; `fit` turns timings into a profile's cost and memory models; `confirm` runs settings
on the real engine by the seeds' protocol and scores the prediction; `calibration` is the whole
calibration end to end."""

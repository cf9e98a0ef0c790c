"""Everything that runs real MLX kernels: model, step functions, profiler, fit, spot checks."""

"""From timings to a profile: pdsim's cost forms (`pdsim`), mlx-lm BatchGenerator's
(`mlxlm`), the peak-memory model (`memory`), each chosen and judged on points it has not seen."""

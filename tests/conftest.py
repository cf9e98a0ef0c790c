"""The tests' own MLX (in this process) and the `pdsim` commands they start must run one BLAS:
a profile records its BLAS in the device id, and a command refuses a profile from another device."""
import os

os.environ.setdefault("PDSIM_BLAS_CHECKED", "1")  # no re-exec with another BLAS (calibrate/host/blas.py)

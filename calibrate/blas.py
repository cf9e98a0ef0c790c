"""Which BLAS MLX's CPU kernels call, and switching to an optimized one when it is installed.

On Linux the `mlx[cpu]` wheel links a reference BLAS (a 1024x1024 fp32 matmul ~270 ms); with a
system OpenBLAS preloaded, MLX's `cblas_sgemm` calls resolve to it (~9 ms). Preloading needs a
fresh process, so `ensure_fast_blas` re-executes the command once with LD_PRELOAD set.
This module does not import MLX: it must run before MLX is loaded.
"""
from __future__ import annotations

import glob
import os
import platform
import sys

CANDIDATES = ["/usr/lib/*/libopenblas.so.0", "/usr/lib/*/openblas-pthread/libopenblas.so.0",
              "/usr/lib64/libopenblas.so.0", "/usr/local/lib/libopenblas.so.0"]
MARK = "PDSIM_BLAS_CHECKED"


def find_openblas() -> str | None:
    for pattern in CANDIDATES:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def blas_in_use() -> str:
    """Name the BLAS this process has loaded (Linux: from /proc/self/maps)."""
    if platform.system() == "Darwin":
        return "Accelerate"
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    for line in maps.splitlines():
        if "libopenblas" in line:
            return "OpenBLAS " + line.split()[-1]
    for line in maps.splitlines():
        if "libmkl" in line:
            return "MKL " + line.split()[-1]
    return "reference BLAS (bundled with mlx[cpu]; slow)"


def ensure_fast_blas(argv: list[str]) -> None:
    """On Linux, re-exec this command once with an installed OpenBLAS preloaded (if not already)."""
    if platform.system() != "Linux" or os.environ.get(MARK) or "libopenblas" in os.environ.get("LD_PRELOAD", ""):
        return
    lib = find_openblas()
    env = dict(os.environ, **{MARK: "1"})
    if lib is None:
        print("note: no OpenBLAS installed; MLX on the CPU uses its slow reference BLAS "
              "(Debian: apt-get install libopenblas0-pthread)", file=sys.stderr)
        os.environ[MARK] = "1"
        return
    env["LD_PRELOAD"] = (lib + " " + env.get("LD_PRELOAD", "")).strip()
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "sim.cli", *argv], env)

"""Which BLAS MLX's CPU kernels call, and switching to an optimized one when it is installed.

On Linux the `mlx[cpu]` wheel links a reference BLAS (a 1024x1024 fp32 matmul ~270 ms); with a
system OpenBLAS preloaded, MLX's `cblas_sgemm` calls resolve to it (~9 ms). Preloading needs a
fresh process, so `ensure_fast_blas` re-executes the command once with LD_PRELOAD set.
An OpenBLAS older than the CPU (Debian's 0.3.21 on a recent Xeon, under KVM) does not know
the core and falls back to its generic SSE3 kernels ("Prescott"): a 1024x1024 fp32 matmul then
takes ~48 ms instead of ~7 ms. `core_override` names the kernels the CPU's flags allow, and the
re-executed process runs with them; every profile records the core (`blas_in_use`).
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
# OpenBLAS's fallbacks when it does not recognise a CPU: generic kernels far below what it can run
GENERIC_CORES = {"prescott", "core2", "nehalem", "katmai", "coppermine", "northwood", "banias", "atom"}


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
            core = openblas_core(line.split()[-1])
            return "OpenBLAS " + line.split()[-1] + (f" (core {core})" if core else "")
    for line in maps.splitlines():
        if "libmkl" in line:
            return "MKL " + line.split()[-1]
    return "reference BLAS (bundled with mlx[cpu]; slow)"


def openblas_core(lib: str) -> str | None:
    """The kernel set an OpenBLAS library runs on this CPU (its `openblas_get_corename`)."""
    import ctypes
    try:
        fn = ctypes.CDLL(lib).openblas_get_corename
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    return (fn() or b"").decode() or None


def core_override(lib: str, flags: set[str] | None = None) -> str | None:
    """OPENBLAS_CORETYPE for a CPU that `lib` does not recognise (None when it does, or when the
    user set one): SkylakeX kernels where the CPU has AVX-512 F/BW/VL/DQ, Haswell where it has
    AVX2 and FMA. The correctness gate (chunked against one-shot logits) checks their results."""
    if os.environ.get("OPENBLAS_CORETYPE") or (openblas_core(lib) or "").lower() not in GENERIC_CORES:
        return None
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "SKYLAKEX"
    if {"avx2", "fma"} <= flags:
        return "HASWELL"
    return None


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def on_gpu() -> bool:
    """Whether MLX runs its kernels on a GPU here (a CUDA build with a GPU): no BLAS of ours then."""
    import mlx.core as mx
    return mx.default_device().type == mx.gpu


def ensure_fast_blas(argv: list[str], entry: tuple[str, ...] = ("-m", "sim.cli")) -> None:
    """On Linux, re-exec this command once with an installed OpenBLAS preloaded (if not already);
    `entry`: what runs it (pdsim's CLI, or a script's path)."""
    if platform.system() != "Linux" or os.environ.get(MARK) or "libopenblas" in os.environ.get("LD_PRELOAD", ""):
        return
    if on_gpu():
        return
    lib = find_openblas()
    env = dict(os.environ, **{MARK: "1"})
    if lib is None:
        print("note: no OpenBLAS installed; MLX on the CPU uses its slow reference BLAS "
              "(Debian: apt-get install libopenblas0-pthread)", file=sys.stderr)
        os.environ[MARK] = "1"
        return
    env["LD_PRELOAD"] = (lib + " " + env.get("LD_PRELOAD", "")).strip()
    if core := core_override(lib):
        env["OPENBLAS_CORETYPE"] = core
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *entry, *argv], env)

"""Keep freed memory in the engine's process, as MLX's GPU allocators do.

On a Mac, MLX's Metal allocator keeps freed buffers for reuse (its cache limit defaults to the
memory limit), and so does its CUDA allocator. On a Linux CPU, MLX keeps only 32 MB of freed
buffers and hands the rest to glibc's `free`, and glibc gives large blocks back to the kernel:
a block above its mmap threshold (128 KB at first, then the largest mmapped block freed so far)
is unmapped when freed, and the heap's top is trimmed. The next call that needs that memory
faults every page in again, and on a VM a page the host has taken back costs ~12.5 us, not
~1.5. Which calls pay then depends on the allocator's history, which no shape says: the first
join of two, which builds no larger array than the warm-up had, faulted 87-91 MB in default
processes and nothing in processes that keep freed memory.

`keep_freed_memory` sets glibc to serve every block up to 32 MiB (glibc's largest mmap
threshold) from the heap and never to trim it, so freed memory stays with the process and the
engine pays page faults only where its footprint grows: what `sim.engine.kvcache`'s `fresh` counts.
It runs wherever pdsim builds a model (`calibrate.engine.model.build_model`), so calibration and
confirm runs measure the same engine. `PDSIM_MALLOC=default` leaves glibc as it is (to measure
what a default process pays); elsewhere than glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import os
import platform

from sim.core.errors import UserError

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's upper bound for it on 64-bit hosts (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int: never trim below 2 GiB of free top
ENV = "PDSIM_MALLOC"

_state: str | None = None


def keep_freed_memory() -> str:
    """Set glibc to keep freed memory (once per process); what this process's allocator does."""
    global _state
    if _state is None:
        _state = _configure()
    return _state


def _configure() -> str:
    wanted = os.environ.get(ENV, "keep")
    if wanted not in ("keep", "default"):
        raise UserError(f"{ENV}={wanted!r}: expected keep (the default) or default")
    if wanted == "default":
        return f"default ({ENV}=default)"
    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        return "default (not glibc)"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "default (mallopt refused)"
    return "keeps freed memory (glibc: blocks up to 32 MiB on the heap, no trim)"


"""What machine and software a measurement ran on, for profiles and reports."""
from __future__ import annotations

import platform
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version

import mlx.core as mx

from calibrate.host.blas import blas_in_use
from calibrate.host.malloc import keep_freed_memory
from sim.cost.speed import XEON_VM, SpeedRules


def _cpu_name() -> str:
    if platform.system() == "Darwin":
        import subprocess
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip() or platform.processor()
        except OSError:
            return platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name(cpu: str) -> str:
    """The GPU's own name (an NVIDIA card under CUDA; the chip on a Mac, as its CPU name reads)."""
    try:
        name = str(mx.device_info().get("device_name") or "")
    except (AttributeError, RuntimeError):
        name = ""
    return name or cpu


def _gpu_id(gpu: str, info: dict | None = None, cores: int | None = None) -> str:
    """A GPU's id: its name, then what separates machines that share it (Apple's chips come with
    several GPU core counts and memory sizes under one name: an M3 Max of 30 or 40 cores, 36 to
    128 GB), then MLX's CUDA-graph switch where it is set: on an H200 it moves a decode step's
    time between modes (about 4 and 6-7 ms with graphs, 7.2-7.8 ms steady without), so a profile
    timed one way prices the other wrongly. `info`: `mx.device_info()`; `cores`: the GPU's cores."""
    import os
    info = info or {}
    parts = [f"gpu:{gpu}"]
    if cores:
        parts.append(f"{cores} cores")
    if info.get("memory_size"):
        parts.append(f"{round(int(info['memory_size']) / 2 ** 30)} GiB")
    graphs = os.environ.get("MLX_USE_CUDA_GRAPHS")
    if graphs is not None:
        parts.append(f"cuda_graphs={graphs}")
    return ":".join(parts)


def _gpu_cores() -> int | None:
    """An Apple GPU's core count, from the IO registry (macOS only; None elsewhere or if unread)."""
    if platform.system() != "Darwin":
        return None
    try:
        out = subprocess.run(["ioreg", "-rd1", "-c", "AGXAccelerator"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'"gpu-core-count"\s*=\s*(\d+)', out)
    return int(found.group(1)) if found else None


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "unknown"


def host_info() -> dict:
    """Device, chip/CPU, OS, library versions and BLAS; `id` is what profiles are matched on."""
    import os
    dev = mx.default_device()
    kind = "gpu" if dev.type == mx.gpu else "cpu"
    cpu = _cpu_name()
    gpu = _gpu_name(cpu) if kind == "gpu" else None
    cores = os.cpu_count() or 0
    info = {
        "kind": kind,
        "name": f"{kind} ({cpu}, {cores} cores)" if kind == "cpu" else f"{kind} ({gpu})",
        "cpu": cpu,
        "cores": cores,
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "blas": blas_in_use() if kind == "cpu" else "n/a (GPU)",
        "malloc": keep_freed_memory(),  # freed memory stays with the engine's process (`calibrate.host.malloc`)
        # the device's room for weights and KV cache (`sim.engine.memory.device_kv_tokens`)
        "memory_limit_bytes": device_memory(),
    }
    # the BLAS kernels are part of a CPU device: the same CPU on generic kernels runs 5-7x slower
    blas = info["blas"].split(" (core ")[-1].rstrip(")") if " (core " in info["blas"] else info["blas"].split()[0]
    info["id"] = f"{kind}:{cpu}:{cores}:{blas}" if kind == "cpu" else _gpu_id(gpu, mx.device_info(), _gpu_cores())
    return info


def device_memory() -> int:
    """Bytes the engine may hold on this device: Metal's recommended working set where the device
    reports one (MLX's own limit there is 1.5x that, about 85% of a Mac's RAM, where the GPU
    starts to page), else what MLX lets this process allocate (here: from RAM)."""
    limit = int(mx.get_memory_limit())
    recommended = mx.device_info().get("max_recommended_working_set_size")
    return min(limit, int(recommended)) if recommended else limit


def speed_rules(host: dict) -> dict:
    """The confirm's speed rules a profile of this host records (`sim.cost.speed.SpeedRules`): the
    ones measured on a CPU where the host is a CPU, neutral elsewhere (nothing measured them there)."""
    if host["kind"] == "cpu":
        return XEON_VM.to_json("measured by confirm rounds on a 2-vCPU Xeon VM (docs/confirm.md)")
    return SpeedRules().to_json(f"not measured on a {host['kind']}: neutral")

"""The device a measurement names, and the BLAS pdsim preloads only where MLX runs on the CPU."""
import pytest

mx = pytest.importorskip("mlx.core")

import calibrate.host.blas as blas  # noqa: E402
from calibrate.host import machine as host  # noqa: E402


def test_this_cpu_is_named_by_its_cpu_and_blas():
    info = host.host_info()
    assert info["kind"] == ("gpu" if blas.on_gpu() else "cpu")
    if info["kind"] == "cpu":
        assert info["id"].startswith(f"cpu:{info['cpu']}:{info['cores']}:")


def test_a_gpu_is_named_by_mlx_not_by_the_cpu(monkeypatch):
    monkeypatch.setattr(host.mx, "device_info", lambda: {"device_name": "NVIDIA H200", "architecture": "sm_90"})
    assert host._gpu_name("Intel Xeon") == "NVIDIA H200"
    monkeypatch.setattr(host.mx, "device_info", lambda: {})
    assert host._gpu_name("Apple M4 Pro") == "Apple M4 Pro"  # nothing better: the chip's name


def test_a_gpu_timed_without_cuda_graphs_is_another_device(monkeypatch):
    monkeypatch.delenv("MLX_USE_CUDA_GRAPHS", raising=False)
    assert host._gpu_id("NVIDIA H200") == "gpu:NVIDIA H200"
    monkeypatch.setenv("MLX_USE_CUDA_GRAPHS", "0")
    assert host._gpu_id("NVIDIA H200") == "gpu:NVIDIA H200:cuda_graphs=0"


def test_macs_sharing_a_chip_name_are_told_apart_by_gpu_cores_and_memory(monkeypatch):
    monkeypatch.delenv("MLX_USE_CUDA_GRAPHS", raising=False)
    info = {"device_name": "Apple M3 Max", "memory_size": 48 * 2 ** 30}
    assert host._gpu_id("Apple M3 Max", info, 40) == "gpu:Apple M3 Max:40 cores:48 GiB"
    assert host._gpu_id("Apple M3 Max", info, 30) != host._gpu_id("Apple M3 Max", info, 40)
    assert host._gpu_id("Apple M3 Max", dict(info, memory_size=36 * 2 ** 30), 30) == "gpu:Apple M3 Max:30 cores:36 GiB"
    assert host._gpu_cores() is None or host.platform.system() == "Darwin"  # read on macOS only


def test_no_blas_preload_where_mlx_runs_on_a_gpu(monkeypatch, capsys):
    monkeypatch.delenv(blas.MARK, raising=False)
    monkeypatch.setattr(blas.platform, "system", lambda: "Linux")
    monkeypatch.setattr(blas, "on_gpu", lambda: True)

    def no_exec(*a):
        raise AssertionError("re-exec on a GPU")
    monkeypatch.setattr(blas.os, "execve", no_exec)
    blas.ensure_fast_blas(["calibrate"])
    assert "OpenBLAS" not in capsys.readouterr().err

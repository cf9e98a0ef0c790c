"""The engine's process keeps what it frees (`calibrate.host.malloc`): memory freed by one call is
reused by the next without page faults, where a default glibc process faults it in again."""
import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's allocator only")

PROBE = """
import json, resource
import mlx.core as mx
from calibrate.host.malloc import keep_freed_memory
state = keep_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
first = [mx.ones((600_000,)) for _ in range(60)]  # 2.4 MB each, 144 MB: MLX keeps 32 MB, glibc gets the rest
mx.eval(first)
del first
before = faults()
again = [mx.ones((640_000,)) for _ in range(40)]  # another size: no MLX cache hit, glibc serves them
mx.eval(again)
print(json.dumps({"state": state, "pages": faults() - before}))
"""


def probe(mode: str) -> dict:
    env = dict(os.environ, PDSIM_MALLOC=mode)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout)


def test_freed_memory_is_reused_without_faults():
    kept, default = probe("keep"), probe("default")
    assert kept["state"].startswith("keeps freed memory")
    assert default["state"].startswith("default")
    pages = 40 * 640_000 * 4 // 4096  # what the second batch of arrays spans
    assert default["pages"] > 0.8 * pages  # glibc gave the first batch back: every page faults again
    assert kept["pages"] < 0.1 * pages  # the heap still holds it


def test_keeping_is_set_once_and_reported():
    from calibrate.host.malloc import keep_freed_memory
    assert keep_freed_memory() == keep_freed_memory()


def test_an_unknown_setting_is_refused_in_one_line(tmp_path):
    env = dict(os.environ, PDSIM_MALLOC="sometimes")
    out = subprocess.run([sys.executable, "-m", "sim.cli", "calibrate", "--model", "qwen3-tiny", "--quick",
                          "-o", str(tmp_path / "tiny.json")],
                         env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "PDSIM_MALLOC='sometimes'" in out.stderr

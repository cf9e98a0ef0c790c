"""The installer (`.ci/install`) on the Pythons users have: a system Python that refuses `pip
install` (PEP 668's EXTERNALLY-MANAGED: Debian 12, Ubuntu 24.04, Homebrew) gets a virtual
environment of its own, and a machine with no Python >= 3.10 gets one line and exit code 2.

The environment is made for real and pdsim installed into it, without its dependencies
(`PDSIM_PIP_ARGS`): which Python the installer picks and whether it can install into it is ours
to test, the dependencies' wheels are pip's. pip still fetches the build backend (setuptools) from
the package index; with no index reachable the tests that install are skipped, saying so.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / ".ci" / "install"
NO_DEPS = "--no-deps"
UNREACHABLE = ("No matching distribution found for setuptools", "Failed to establish a new connection")


def externally_managed() -> str | None:
    """A Python >= 3.10 on this machine whose own pip refuses to install (PEP 668), if any."""
    for py in sorted(glob.glob("/usr/bin/python3.1[0-9]")) + [sys._base_executable]:
        try:
            stdlib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                    capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            continue
        if stdlib and (Path(stdlib) / "EXTERNALLY-MANAGED").exists():
            return py
    return None


def run_install(tmp_path: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PDSIM_", "VIRTUAL_ENV", "PYTHON"))}
    e.update(PATH=path, PDSIM_VENV=str(tmp_path / "venv"), PDSIM_PIP_ARGS=NO_DEPS, **env)
    p = subprocess.run(["/bin/bash", str(INSTALL)], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)
    if p.returncode != 0 and any(s in p.stderr for s in UNREACHABLE):
        pytest.skip(f"no package index reachable for setuptools: {p.stderr.strip().splitlines()[-1]}")
    return p


def test_a_system_python_that_refuses_pip_gets_an_environment_of_its_own(tmp_path):
    py = externally_managed()
    if py is None:
        pytest.skip("no externally managed Python >= 3.10 on this machine (PEP 668)")
    refused = subprocess.run([py, "-m", "pip", "install", "--dry-run", "--no-index", "pdsim-none"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr
    # only that Python on the PATH, as `PATH=/usr/bin:/bin` on a fresh Debian
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(py)
    p = run_install(tmp_path, f"{bin_dir}:/usr/bin:/bin")
    assert p.returncode == 0, p.stderr
    venv_py = tmp_path / "venv" / "bin" / "python"
    base = subprocess.run([str(venv_py), "-c", "import sys; print(sys.base_prefix, sys.prefix)"],
                          capture_output=True, text=True).stdout.split()
    assert base[0] != base[1]  # a virtual environment, over the system Python
    shown = subprocess.run([str(venv_py), "-m", "pip", "show", "pdsim"], capture_output=True, text=True).stdout
    assert "Name: pdsim" in shown
    assert (tmp_path / "venv" / "bin" / "pdsim").exists()  # README's `.venv/bin/pdsim`, once its deps are in
    # run again: the environment is reused, not made anew
    marker = tmp_path / "venv" / "kept"
    marker.write_text("")
    assert run_install(tmp_path, f"{bin_dir}:/usr/bin:/bin").returncode == 0
    assert marker.exists()


def tools(tmp_path: Path) -> Path:
    """A folder with the shell tools the installer uses and no Python."""
    d = tmp_path / "tools"
    d.mkdir()
    for tool in ("bash", "dirname", "id", "uname", "rm", "ls", "cat", "chromium"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (d / tool).symlink_to(found)
    return d


def test_no_recent_python_is_one_line_and_exit_2(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    old = bin_dir / "python3"  # a stock Mac's: 3.9
    old.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python 3.9.6'; exit 0; fi\nexit 1\n")
    old.chmod(0o755)
    p = run_install(tmp_path, f"{bin_dir}:{tools(tmp_path)}")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Python >= 3.10" in lines[0] and "3.9.6" in lines[0]
    assert not (tmp_path / "venv").exists()


def test_pdsim_python_names_a_python_off_the_path(tmp_path):
    py = sys._base_executable
    p = run_install(tmp_path, str(tools(tmp_path)), PDSIM_PYTHON=py)
    assert p.returncode == 0, p.stderr
    made_from = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-c", "import sys; print(sys.base_prefix)"],
                               capture_output=True, text=True).stdout.strip()
    assert made_from == subprocess.run([py, "-c", "import sys; print(sys.base_prefix)"],
                                       capture_output=True, text=True).stdout.strip()

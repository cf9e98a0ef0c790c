"""The README is a front door: short, and every command in it runs as a user types it.

Each `pdsim` line of the README's shell blocks runs in order in a fresh folder (the calibrate
line writes the profile the confirm line reads; `pdsim tune` calibrates, having no cached
profile), on qwen3-tiny instead of qwen3-0.6b and with one repeat per confirmed setting, so the
whole walk takes a couple of minutes. Nothing else is changed.
"""
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
FAST = [("qwen3-0.6b", "qwen3-tiny"), ("--repeats 4", "--repeats 1")]


def commands() -> list[str]:
    """The `pdsim ...` lines of the README's sh blocks, in order (the set-up block's main job too)."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = line.strip().removeprefix("bash .ci/install && ").removeprefix(".venv/bin/")
            if line.startswith("pdsim ") and line not in out:  # set-up command 1's tune is the example's
                out.append(line)
    return out


def fast(line: str) -> list[str]:
    for slow, quick in FAST:
        line = line.replace(slow, quick)
    args = shlex.split(line)[1:]
    if args[0] == "tune" and "--model" not in args:
        args += ["--model", "qwen3-tiny", "--repeats", "1"]
    return args


def test_readme_is_a_front_door():
    assert README.count("\n") <= 200
    assert "stop " not in README.lower().replace("stop count", "")


def test_every_readme_command_runs(tmp_path):
    lines = commands()
    names = {shlex.split(line)[1] for line in lines}
    assert {"simulate", "sweep", "report", "calibrate", "confirm", "tune", "traces", "policies", "metrics"} <= names
    for line in lines:
        args = fast(line)
        cwd = tmp_path / "tune" if args[0] == "tune" else tmp_path  # no cached profile: tune calibrates
        cwd.mkdir(exist_ok=True)
        p = subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=cwd, capture_output=True,
                           text=True, timeout=900)
        assert p.returncode == 0, f"{line}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"

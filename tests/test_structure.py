"""How the code is put together: the library never imports the command line, every command lives
in one place and calls library functions, and metric names come from one registry."""
import ast
import re
from pathlib import Path

import pytest

from sim.metrics import registry

ROOT = Path(__file__).parent.parent
CLI = {ROOT / "sim" / "cli.py", *(ROOT / "sim" / "commands").glob("*.py")}
LIBRARY = [p for pkg in ("sim", "policies", "traces", "calibrate") for p in (ROOT / pkg).rglob("*.py") if p not in CLI]


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (lazy imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_code_does_not_import_the_cli(path):
    cli = sorted(n for n in imported(path) if n == "sim.cli" or n.startswith(("sim.cli.", "sim.commands")))
    assert cli == [], f"{path.relative_to(ROOT)} imports the command line: {cli}"


def test_every_command_lives_in_sim_commands():
    from sim.cli import COMMANDS
    assert all(m.startswith("sim.commands.") for m in COMMANDS.values())
    assert not list((ROOT / "calibrate").glob("cmd_*.py"))


def test_tune_calls_library_functions_not_the_command_line():
    """`pdsim tune` used to re-enter `sim.cli.main` with argv lists and read the JSON files back."""
    path = ROOT / "sim" / "commands" / "tune.py"
    assert "sim.cli" not in imported(path)
    calls = {n.func.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name)}
    assert "main" not in calls


def test_registry_views_name_registry_metrics():
    for view in (registry.SUMMARY, registry.CONFIRMED, registry.CONFIRM_CHART, registry.SWEEP_SHOWN,
                 (registry.DEFAULT_OBJECTIVE, registry.DEFAULT_LATENCY)):
        assert set(view) <= set(registry.NAMES)
    assert not set(registry.ALIASES) & set(registry.NAMES)
    assert {m.family for m in registry.gap_chart_metrics()} == set(registry.GAP_CHART)
    for m in registry.METRICS.values():
        assert m.better in ("lower", "higher", None) and m.unit and m.definition


def test_metric_names_are_not_written_out_in_the_modules_that_use_them():
    """sweep, pick, report and confirm take their metric lists from the registry (a name may appear
    in a docstring or help text, not as a list of literals)."""
    for rel in ("sim/sweep/run.py", "sim/sweep/pick.py", "sim/report/frames.py", "sim/report/page.py", "calibrate/confirm/protocol.py",
                "sim/commands/simulate.py", "sim/commands/sweep.py"):
        tree = ast.parse((ROOT / rel).read_text())
        lists = [n for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple))
                 and sum(isinstance(e, ast.Constant) and e.value in registry.METRICS for e in n.elts) >= 2]
        assert lists == [], f"{rel} lists metric names itself (line {lists[0].lineno})"


def test_readme_defines_every_metric():
    text = (ROOT / "docs" / "metrics.md").read_text()
    missing = [n for n in registry.NAMES if f"`{n}`" not in text]
    assert missing == [], f"docs/metrics.md misses {missing}"


def test_pyproject_installs_the_mlx_lm_the_policy_models():
    """The mlx-lm policy models one BatchGenerator; a fresh install gets exactly that version."""
    from policies.mlxlm import MODELLED
    text = (ROOT / "pyproject.toml").read_text()
    pins = set(re.findall(r'"mlx-lm([^";]*)"', text))
    assert pins == {f"=={v}" for v in MODELLED}, pins

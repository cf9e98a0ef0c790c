"""The layer order: which package may import which, so the tree stays an architecture diagram.

Lowest first; a module may import its own layer and those below it, never one above (imports
anywhere in a file count, inside functions too). `sim.commands` and `sim.cli` may import
`calibrate` only inside the commands that run kernels, so `sim` never loads MLX for a replay.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
LAYERS = [  # (layer, module prefixes), lowest first
    ("core", ("sim.core",)),
    ("traces", ("traces",)),
    ("engine", ("sim.engine",)),
    ("cost", ("sim.cost",)),
    ("policies", ("policies",)),
    ("run", ("sim.replay", "sim.steady", "sim.predict", "sim.metrics")),
    ("sweep", ("sim.sweep", "sim.report")),
    ("calibrate", ("calibrate",)),
    ("cli", ("sim.commands", "sim.cli")),
]
CALIBRATE_ORDER = ["calibrate.host", "calibrate.engine", "calibrate.fit", "calibrate.measure", "calibrate.profiles",
                   "calibrate.mlxlm_calibration", "calibrate.calibration", "calibrate.confirm"]
MLX = ("mlx", "mlx_lm")


def layer_of(module: str) -> int | None:
    if module == "sim":  # the package's own docstring
        return 0
    found = [(len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    return max(found)[1] if found else None


def modules() -> dict[str, Path]:
    out = {}
    for pkg in ("sim", "calibrate", "policies", "traces"):
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module, inside a function) for every import in the file."""
    tree, out = ast.parse(path.read_text()), []
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) not in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, id(node) not in top))
    return out


MODULES = modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(name):
    mine = layer_of(name)
    assert mine is not None, f"{name} belongs to no layer: add its package to LAYERS"
    above = [m for m, _ in imports(MODULES[name]) if (layer_of(m) or 0) > mine
             and not (LAYERS[mine][0] == "cli" and m.startswith("calibrate"))]
    assert above == [], f"{name} ({LAYERS[mine][0]}) imports a higher layer: {above}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("calibrate.")))
def test_calibrate_subpackages_import_downwards(name):
    """host < engine < fit < measure < profiles < the calibrations < confirm."""
    def rank(m):
        return max((i for i, p in enumerate(CALIBRATE_ORDER) if m == p or m.startswith(p + ".")), default=None)
    mine = rank(name)
    above = [m for m, _ in imports(MODULES[name]) if mine is not None and (rank(m) or -1) > mine]
    assert above == [], f"{name} imports {above}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith("calibrate")))
def test_only_calibrate_imports_mlx(name):
    """`sim`, `policies` and `traces` never import MLX; the commands that run kernels import
    `calibrate` inside the function that runs them."""
    found = [(m, inner) for m, inner in imports(MODULES[name]) if m.split(".")[0] in MLX]
    assert found == [], f"{name} imports {found}"
    if name.startswith(("sim.commands", "sim.cli")):
        eager = [m for m, inner in imports(MODULES[name]) if m.startswith("calibrate") and not inner]
        assert eager == [], f"{name} imports calibrate at its top: {eager}"

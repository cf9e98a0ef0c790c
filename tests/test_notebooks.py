"""The notebooks run top to bottom on a fresh kernel, and are stored without outputs."""
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_are_there():
    assert {p.stem for p in NOTEBOOKS} == {"sweep_chunk_budget", "compare_policies", "inspect_calibration"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs stored"


def _run(nb, path: Path):
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    return nb


def _drew_a_chart(outputs) -> bool:
    """An altair chart's output: a Vega-Lite bundle, or the HTML renderer's vegaEmbed call."""
    for o in outputs:
        data = o.get("data", {})
        if any("vegalite" in k for k in data) or "vegaEmbed" in data.get("text/html", ""):
            return True
    return False


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path):
    nb = _run(nbformat.read(path, as_version=4), path)
    last = nb.cells[-1] if nb.cells[-1].cell_type == "code" else None
    if last is not None and path.stem != "inspect_calibration":
        # the closing chart was drawn
        assert _drew_a_chart(last.outputs)


def test_calibration_notebook_shows_samples_of_a_given_profile(tmp_path):
    """Point the parameter cell at a profile with samples, as a user would."""
    from sim.cost.profile import BUILTIN, cost_model, load_profile
    prof = load_profile(BUILTIN)
    cost = cost_model(prof)
    samples = [{"step": "prefill", "chunk": c, "prefix": 0, "batch": 1, "context_sum": 0,
                "seconds": cost.prefill(c, 0) * 1.05, "spread": 0.0, "fitted": cost.prefill(c, 0),
                "held_out": c == 64} for c in (16, 64, 256)]
    samples += [{"step": "decode", "chunk": 1, "prefix": 100, "batch": b, "context_sum": 100 * b,
                 "seconds": cost.decode([100] * b) * 0.95, "spread": 0.0, "fitted": cost.decode([100] * b),
                 "held_out": False} for b in (1, 4)]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({k: v for k, v in prof.items() if k != "_path"} | {"samples": samples}))
    nb_path = next(p for p in NOTEBOOKS if p.stem == "inspect_calibration")
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells[1].source = f"PROFILE = {str(path)!r}"
    nb = _run(nb, nb_path)
    last = nb.cells[-1].outputs
    assert _drew_a_chart(last)
    assert "held out" in "".join(o.get("text", "") for o in last)

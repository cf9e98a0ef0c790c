"""The mlx-lm fit's shapes (`calibrate.fit.mlxlm`), on synthetic calls with a known law: knots at
the grid's sizes, unaligned prompt sizes priced by a remainder term, a prompt curve that never
falls, a generation curve that may."""
import random

import pytest

from calibrate.fit.mlxlm import fit_step, pick_tile, price

TILE = 16


def law(n: int, idx: int) -> float:
    """A prompt call of n rows through the weights at write position idx: aligned sizes are fast."""
    return 0.3 + 0.01 * n + (0.1 if n % TILE else 0.0) + 2e-6 * n * idx


def prompt(n: int, idx: int, source: str | None = None, noise: float = 1.0) -> dict:
    s = {"step": "prompt", "rows": 1, "chunk": n, "idx": idx, "seconds": law(n, idx) * noise}
    return s | ({"source": source} if source else {})


def prompts(noise: float = 0.0) -> list[dict]:
    rng = random.Random(3)
    grid = [prompt(n, idx, noise=1 + rng.uniform(-noise, noise))
            for n in (16, 24, 32, 40, 64, 100, 128, 256) for idx in (0, 400)]
    engine = [prompt(n, idx, "engine:spread", 1 + rng.uniform(-noise, noise)) for n, idx in ((23, 0), (31, 0), (47, 64))]
    return grid + engine


def test_unaligned_prompt_sizes_pick_a_tile_and_pay_its_remainder():
    samples = prompts()
    assert pick_tile(samples, (0.0, 0.0)) == TILE
    m = fit_step("prompt", samples, tile=TILE)
    assert m.prompt_dense.sizes == (16, 32, 64, 128, 256)  # multiples of the tile; never an engine call's size
    assert m.prompt_rem[0] == pytest.approx(0.1, rel=0.02)
    for n, idx in ((31, 0), (33, 200), (48, 100), (200, 0)):  # sizes the fit never saw
        assert m.prompt(1, n, idx) == pytest.approx(law(n, idx), rel=0.02)
    assert m.prompt(1, 31, 0) > m.prompt(1, 32, 0)
    # without the tile, the unaligned calls bend the aligned knots up: 32 rows priced ~5% high
    plain = fit_step("prompt", samples)
    assert plain.prompt(1, 32, 0) / law(32, 0) - 1 > 0.03


def test_a_prompt_curve_never_falls_a_generation_curve_may():
    rng = random.Random(0)
    noisy = [dict(s, seconds=s["seconds"] * rng.uniform(0.6, 1.4)) for s in prompts()]
    for tile in (0, TILE):
        ys = fit_step("prompt", noisy, tile=tile).prompt_dense.seconds
        assert all(a <= b for a, b in zip(ys, ys[1:]))
    # batch 7 slower than 8, as qwen3-0.6b's on this CPU: the fit keeps it
    steps = [{"step": "generate", "batch": b, "context_max": x, "seconds": (0.74 if b == 7 else 0.3 + 0.04 * b) + 1e-5 * b * x}
             for b in range(1, 9) for x in (100, 400, 800)]
    m = fit_step("generate", steps)
    assert m.step([400] * 7) > m.step([400] * 8)
    assert price(m, "generate", steps) == pytest.approx([s["seconds"] for s in steps], rel=0.02)


def test_a_rows_faults_are_priced_where_the_row_is_fresh_not_on_every_row_written():
    """Grid merges (profiles before stop 42) fault in every page they build; the engine's calls
    fault only where `sim.engine.heap` says a row is fresh. A written row costs its copy, a fresh one
    its faults at the fitted page price: a first forward that faults nothing is priced at its
    copy alone, not at the faults of an average first forward (stops 37-43: 1.11-1.23x)."""
    copy, page, per_fresh = 30e-6, 10e-6, 50
    step = lambda b, x: 0.3 + 0.02 * b + 1e-5 * b * x
    steps = [{"step": "generate", "batch": b, "context_max": x, "seconds": step(b, x)}
             for b in range(1, 9) for x in (100, 400, 800)]
    grid = [{"step": "generate", "batch": b, "context_max": x, "joined": 1, "written": b * x, "faults": 56 * b * x,
             "seconds": step(b, x) + (copy + 56 * page) * b * x} for b in (2, 4, 6) for x in (300, 600)]
    engine = [{"step": "generate", "source": "engine:spread", "batch": b, "context_max": x, "first": first,
               "written": w, "fresh": f, "faults": per_fresh * f,
               "seconds": step(b, x) + copy * w + page * per_fresh * f}
              for b, x, w, f, first in ((2, 150, 500, 40, False), (3, 160, 900, 0, False), (4, 170, 1400, 20, False),
                                        (4, 200, 2000, 0, False), (1, 120, 256, 0, True), (2, 90, 768, 300, True),
                                        (1, 140, 512, 0, True), (3, 130, 1024, 0, True))]
    m = fit_step("generate", steps + grid + engine)
    assert m.copy == pytest.approx(copy, rel=0.05) and m.first_copy is None
    assert m.fresh == pytest.approx(per_fresh * page, rel=0.05)
    quiet = {"step": "generate", "batch": 1, "context_max": 120, "first": True, "written": 256, "fresh": 0}
    assert price(m, "generate", [quiet])[0] == pytest.approx(step(1, 120) + copy * 256, rel=0.01)
    # the same samples with no fault counts (profiles before stop 37): the grid's faults priced as copies
    old = fit_step("generate", [{k: v for k, v in s.items() if k != "faults"} for s in steps + grid + engine])
    assert old.copy > 5 * m.copy

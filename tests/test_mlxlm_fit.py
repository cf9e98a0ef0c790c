"""The mlx-lm fit's shapes (`calibrate.mlxlm_fit`), on synthetic calls with a known law: knots at
the grid's sizes, unaligned prompt sizes priced by a remainder term, a prompt curve that never
falls, a generation curve that may."""
import random

import pytest

from calibrate.mlxlm_fit import fit_step, pick_tile, price

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

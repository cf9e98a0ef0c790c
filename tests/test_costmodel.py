"""The cost model's forms and their fit: what a profile says is what the simulator charges."""
import json
import mmap
import random
import statistics
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, strategies as st

from calibrate.fit.copies import fit_copies
from calibrate.fit.mixed import fit_mixed
from calibrate.fit.pdsim import fit_form, fit_profile
from calibrate.measure.speed_probe import ALLOC_METHOD, dear_page_seconds, page_price
from sim.cost.copies import is_gather, kv_copies
from sim.cost.curve import Curve
from sim.cost.model import LinearCostModel
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.cost.fields import ProfileError
from sim.cost.price import price
from sim.cost.speed import AtSpeed, MachineSpeed


def test_curve_interpolates_between_sizes_is_flat_below_and_never_falls_beyond():
    c = Curve((1, 4, 8), (1.0, 2.5, 2.0))
    assert [c(1), c(4), c(8)] == [1.0, 2.5, 2.0]
    assert c(2) == pytest.approx(1.5) and c(6) == pytest.approx(2.25)
    assert c(0) == 1.0  # below the first measured size: flat
    assert c(16) == 2.0  # the last segment falls: beyond it, flat rather than ever cheaper
    assert Curve((1, 2), (1.0, 3.0))(4) == pytest.approx(7.0)  # a rising last segment extends


@given(st.integers(1, 600), st.integers(0, 4000), st.integers(1, 40), st.sampled_from([float("inf"), 1000.0]),
       st.sampled_from([None, 3e-7]))
def test_stretch_costs_are_the_per_call_costs(chunk, prefix, steps, knot, lone):
    m = LinearCostModel((1e-3, 2e-5, 3e-8, 4e-6), (2e-3, 1e-4, 5e-8, 2e-8), decode_knot=knot, decode_lone=lone,
                        prefill_dense=Curve((8, 64, 512), (0.5, 0.9, 4.0)), decode_dense=Curve((1, 4, 16), (0.4, 0.7, 0.7)))
    assert m.prefill_steps(chunk, prefix, steps).tolist() == [m.prefill(chunk, prefix + j * chunk) for j in range(steps)]
    for ctx in ([prefix + 1, prefix // 2 + 1], [prefix + 1]):
        assert m.decode_steps(ctx, steps).tolist() == [m.decode([c + j for c in ctx]) for j in range(steps)]
        calibrated = replace(m, mixed_coef=(1e-3, 2e-5, 3e-8, 4e-6, 5e-4), mixed_dense=Curve((2, 64), (0.3, 0.9)),
                             mixed_tiled=True, prefill_tile=8, prefill_rem=(1e-3, 2e-4))
        for mixed in (m, calibrated, AtSpeed(calibrated, MachineSpeed(1.1, 0.9))):  # vLLM's decode-only forwards
            assert mixed.mixed_steps(ctx, steps).tolist() == [mixed.mixed([1] * len(ctx), [c + j for c in ctx])
                                                              for j in range(steps)]


def _samples(truth: LinearCostModel, noise: float = 0.0) -> list[dict]:
    rng = random.Random(0)
    out = []
    for L in (8, 16, 32, 64, 128):
        for P in (0, 256, 1024):
            t = truth.prefill(L, P) * (1 + rng.uniform(-noise, noise))
            out.append({"step": "prefill", "chunk": L, "prefix": P, "seconds": t, "times": [t]})
    for B in (1, 2, 4, 8):
        for M in (64, 512, 2048):
            t = truth.decode([M] * B) * (1 + rng.uniform(-noise, noise))
            out.append({"step": "decode", "batch": B, "context_max": M, "seconds": t, "times": [t]})
    for M in (64, 512, 2048):  # a request alone on its own cache
        t = truth.decode([M], single=True) * (1 + rng.uniform(-noise, noise))
        out.append({"step": "decode", "batch": 1, "context_max": M, "single": True, "seconds": t, "times": [t]})
    return out


TRUTH = LinearCostModel((0.0, 0.0, 2e-8, 3e-5), (0.0, 0.0, 4e-6),
                        prefill_dense=Curve((8, 16, 32, 64, 128), (0.6, 0.55, 0.8, 1.3, 2.1)),
                        decode_dense=Curve((1, 2, 4, 8), (0.43, 0.5, 0.68, 0.72)))


def test_fit_recovers_the_dense_curve_and_attention_terms():
    s = _samples(TRUTH)
    f = fit_form("prefill", [x for x in s if x["step"] == "prefill"])
    assert f.coef == pytest.approx([0, 0, 2e-8, 3e-5], rel=1e-4, abs=1e-12)
    assert [d[0] for d in f.dense] == [8, 16, 32, 64, 128]
    assert [d[1] for d in f.dense] == pytest.approx([0.6, 0.55, 0.8, 1.3, 2.1], rel=1e-4)
    f = fit_form("decode", [x for x in s if x["step"] == "decode"])
    assert f.knot == 512  # the middle of 64, 512, 2048: the grid measures far beyond it
    assert f.coef == pytest.approx([0, 0, 4e-6, 4e-6], rel=1e-4, abs=1e-12)  # one slope: both segments equal
    assert f.lone == pytest.approx(4e-6, rel=1e-4)  # a lone request priced as a row, as the truth does
    assert [d[1] for d in f.dense] == pytest.approx([0.43, 0.5, 0.68, 0.72], rel=1e-4)


def test_decode_attention_slope_may_change_at_the_knot():
    """A row's attention costing half as much per token beyond 512 (as when the BLAS starts
    threading) is recovered, and priced so beyond the grid; a grid that does not reach far past
    its middle context keeps one slope; a lone request's own slope is recovered."""
    truth = LinearCostModel((0.0, 0.0, 2e-8, 3e-5), (0.0, 0.0, 4e-6, 2e-6), decode_knot=512,
                            prefill_dense=TRUTH.prefill_dense, decode_dense=TRUTH.decode_dense)
    s = [x for x in _samples(truth) if x["step"] == "decode" and not x.get("single")]
    f = fit_form("decode", s)
    assert (f.knot, f.coef) == (512, pytest.approx([0, 0, 4e-6, 2e-6], rel=1e-4, abs=1e-12))
    assert f.model().decode([4096] * 3) == pytest.approx(truth.decode([4096] * 3))
    assert truth.decode([4096]) - truth.decode([2048]) == pytest.approx(2048 * 2e-6)
    short = [x for x in s if x["context_max"] < 2048]
    assert fit_form("decode", short).knot == float("inf") and len(fit_form("decode", short).coef) == 3
    lone = LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 4e-6), decode_lone=9e-6, decode_dense=TRUTH.decode_dense)
    f = fit_form("decode", [x for x in _samples(lone) if x["step"] == "decode"])
    assert f.lone == pytest.approx(9e-6, rel=1e-4) and f.coef[2:] == pytest.approx([4e-6, 4e-6], rel=1e-4)
    assert f.model().decode([3000], single=True) == pytest.approx(0.43 + 9e-6 * 3000)
    assert f.model().decode([3000]) == pytest.approx(0.43 + 4e-6 * 3000)  # a batch of one: a row


def test_fit_recovers_a_tile_remainder_kv_copies_and_joins():
    """Chunks beyond a multiple of 16 rows paying extra (once, per row beyond, and per row of the
    chunk), and decode calls that copy KV buffers or change the batch, are recovered from samples
    that exercise them; the tile by cross-validation."""
    truth = LinearCostModel((0.0, 0.0, 2e-8, 3e-5), (0.0, 0.0, 4e-6), prefill_dense=TRUTH.prefill_dense,
                            decode_dense=TRUTH.decode_dense, prefill_tile=16, prefill_rem=(0.05, 0.01, 4e-4), copy=2e-4,
                            join=(0.03, 0.0, 0.0), leave=(0.02, 0.0, 0.0))
    rng = random.Random(1)
    pre = [{"step": "prefill", "chunk": L, "prefix": P, "written": 0} for L in (8, 16, 32, 64, 128)
           for P in (0, 256, 1024)]
    pre += [{"step": "prefill", "chunk": rng.randrange(9, 128), "prefix": rng.choice((0, 300)), "written": 0}
            for _ in range(24)]
    for x in pre:
        x["seconds"] = truth.prefill(x["chunk"], x["prefix"])
    dec = [{"step": "decode", "batch": B, "context_max": M, "written": w, "joined": j, "left": lft}
           for B in (1, 2, 3, 4, 8) for M in (64, 300, 900) for w, j, lft in ((0, 0, 0), (B * 512, 1, 0),
                                                                             (B * 300, 0, 1), (B * 256, 0, 0))]
    for x in dec:
        x["seconds"] = (truth.decode([x["context_max"]] * x["batch"]) + truth.copy * x["written"]
                        + truth.membership(x["joined"], x["left"], [x["context_max"]] * x["batch"]))
    fitted = fit_profile(pre + dec)
    assert fitted["cost"]["prefill"]["tile"] == 16
    assert fitted["cost"]["prefill"]["remainder"] == pytest.approx([0.05, 0.01, 4e-4], rel=1e-3)
    assert fitted["cost"]["copy"] == pytest.approx(2e-4, rel=1e-4)
    assert fitted["cost"]["join"][0] == pytest.approx(0.03, rel=1e-3)
    assert fitted["cost"]["leave"][0] == pytest.approx(0.02, rel=1e-3)
    assert max(e["cv_form_mean"] for e in fitted["fit"]["errors"].values()) < 1e-3


def test_a_mixed_forward_pays_the_prefills_tile_remainder_so_aligned_forwards_the_grid_lacks_are_priced():
    """vLLM's forward runs its T rows through the kernels a prefill chunk of T rows runs. The grid's
    mixed forwards are all unaligned (budgets' remainders); one that fills a 32-token budget is
    aligned. With the prefill fit's remainder known, the mixed fit prices the aligned forward as
    the kernels run it; fitted without it, a form through unaligned forwards misprices it."""
    truth = LinearCostModel((0.0, 0.0, 8e-6, 2e-5), (0.0, 0.0, 4e-6), prefill_dense=TRUTH.prefill_dense,
                            decode_dense=TRUTH.decode_dense, prefill_tile=16, prefill_rem=(0.0, 4e-3, 2e-4),
                            mixed_coef=(0.3, 7e-3, 9e-6, 2.5e-5, 9e-3), mixed_tiled=True)
    assert truth.mixed([32], [0]) == pytest.approx(0.3 + 7e-3 * 32 + 9e-6 * 32 * 16 + 9e-3)  # aligned: no remainder
    assert truth.mixed([30], [0]) == pytest.approx(0.3 + 7e-3 * 30 + 9e-6 * 30 * 15 + 9e-3 + 4e-3 * 14 + 2e-4 * 30)
    rng = random.Random(2)
    pre = [{"step": "prefill", "chunk": L, "prefix": P, "written": 0} for L in (8, 16, 32, 64, 128)
           for P in (0, 256, 700)]
    pre += [{"step": "prefill", "chunk": rng.randrange(9, 128), "prefix": rng.choice((0, 300)), "written": 0}
            for _ in range(24)]
    mixed = [{"step": "mixed", "chunks": [1] * d + [n], "prefixes": [c] * d + [0], "written": 0}
             for d in (0, 1, 4) for c in (200, 600) for n in (24, 77, 163, 211)]
    assert all(sum(m["chunks"]) % 16 for m in mixed)  # the grid's forwards: every one unaligned
    for x in pre:
        x["seconds"] = truth.prefill(x["chunk"], x["prefix"])
    for x in mixed:
        x["seconds"] = truth.mixed(x["chunks"], x["prefixes"])
    dec = [{"step": "decode", "batch": b, "context_max": c, "written": 0} for b in (1, 2, 4, 8) for c in (64, 300, 900)]
    for x in dec:
        x["seconds"] = truth.decode([x["context_max"]] * x["batch"])
    cost = fit_profile(pre + dec + mixed)["cost"]
    assert cost["prefill"]["tile"] == 16 and cost["mixed"]["tiled"] is True
    fitted = replace(truth, prefill_rem=tuple(cost["prefill"]["remainder"]), mixed_coef=tuple(cost["mixed"]["coef"]),
                     mixed_dense=Curve.from_pairs(cost["mixed"].get("dense")))
    for rows, prefixes in (([32], [0]), ([1, 1, 30], [120, 90, 64]), ([1, 1, 1, 1], [50, 60, 70, 80])):
        assert fitted.mixed(rows, prefixes) == pytest.approx(truth.mixed(rows, prefixes), rel=1e-3)
    plain = fit_mixed(mixed, [], truth)["cost"]  # no tile known
    untiled = replace(truth, mixed_coef=tuple(plain["coef"]), mixed_dense=Curve.from_pairs(plain.get("dense")),
                      mixed_tiled=False)
    assert abs(untiled.mixed([32], [0]) / truth.mixed([32], [0]) - 1) > 0.03
    prof = load_profile(BUILTIN)  # a profile's `tiled` reaches the cost model
    prof["cost"]["mixed"] = cost["mixed"]
    assert getattr(cost_model(prof), "linear", cost_model(prof)).mixed_tiled is True


def test_a_leaves_gather_is_priced_apart_and_one_stalled_sync_sets_no_price():
    """Syncs where requests only leave write their rows by a gather, cheaper per row than a join's
    pad and concatenate; the fit prices the two apart, and a single stalled sync (10x its price)
    moves no price by more than the timing noise."""
    truth = LinearCostModel((0.0,) * 4, (0.0,) * 3, copy=6e-5, fresh=3e-4, gather=4e-5,
                            join=(0.01, 0.0, 0.0), leave=(0.005, 0.0, 0.0))
    rng = random.Random(3)
    syncs = []
    for _ in range(40):
        joined, left = rng.choice(((1, 0), (2, 0), (0, 1), (0, 2), (1, 1)))
        written = rng.randrange(200, 4000)
        fresh = rng.randrange(0, written) if joined and rng.random() < 0.5 else 0
        t = kv_copies(truth, written, fresh, is_gather("sync", joined, left))
        t += truth.join[0] * (joined > 0) + truth.leave[0] * (left > 0)
        syncs.append({"step": "sync", "batch": 4, "context_max": 500, "written": written, "fresh": fresh,
                      "joined": joined, "left": left, "seconds": t * rng.uniform(0.98, 1.02)})
    leaves = [s for s in syncs if is_gather("sync", s["joined"], s["left"])]
    leaves[0]["seconds"] *= 10  # a stall
    k = fit_copies(syncs)
    for name in ("copy", "fresh", "gather", "join", "leave"):
        assert getattr(k, name) == pytest.approx(getattr(truth, name) if name not in ("join", "leave")
                                                 else getattr(truth, name)[0], rel=0.1), name
    assert fit_copies([s for s in syncs if s not in leaves]).gather is None  # no gather timed: it costs `copy`
    assert kv_copies(k, 1000, 0, gather=True) < kv_copies(k, 1000, 0)


def test_a_fresh_row_costs_what_the_typical_fresh_join_paid_and_warm_rows_set_the_copy_price():
    """Fresh rows cost 2-5x more in one join than another; the price is the median join's, not
    one a large cheap join sets; the syncs that wrote no fresh rows set the per-row copy price."""
    copy, join = 3e-5, 0.002
    warm = [{"step": "sync", "batch": 4, "written": w, "fresh": 0, "joined": 1, "left": 0, "seconds": join + copy * w}
            for w in (500, 900, 1300, 2000, 2600)]
    per_row = [(3000, 1e-4, 4000), (2500, 1.5e-4, 3000), (400, 4e-4, 500), (600, 5e-4, 700), (300, 6e-4, 900)]
    dear = [{"step": "sync", "batch": 3, "written": w, "fresh": f, "joined": 1, "left": 0,
             "seconds": join + copy * w + p * f} for f, p, w in per_row]
    k = fit_copies(warm + dear)
    assert k.copy == pytest.approx(copy, rel=1e-3) and k.join == pytest.approx(join, rel=1e-2)
    assert k.fresh == pytest.approx(4e-4, rel=1e-3)  # the median join's, not what the two large cheap ones pull it to



def test_a_fresh_row_is_priced_by_its_faults_where_the_syncs_counted_them():
    """A fresh row costs its page faults: how many a row faults and what one costs scatter apart
    (the host backs some faults, the guest others), so the price is the typical faults per row
    times the typical fault's price, not the typical ratio, which three cheap syncs set here."""
    copy, join = 3e-5, 0.002
    warm = [{"step": "sync", "batch": 4, "written": w, "fresh": 0, "joined": 1, "left": 0, "faults": 0,
             "seconds": join + copy * w} for w in (500, 900, 1300, 2000, 2600)]
    per_row = [(10, 10e-6), (30, 2e-6), (45, 2.5e-6), (29, 10e-6), (28, 11e-6)]  # faults a fresh row, s a fault
    dear = [{"step": "sync", "batch": 3, "written": 1500, "fresh": 800, "joined": 1, "left": 0, "faults": n * 800,
             "seconds": join + copy * 1500 + n * 800 * t} for n, t in per_row]
    assert fit_copies(warm + dear).fresh == pytest.approx(29 * 10e-6, rel=1e-3)
    uncounted = [{k: v for k, v in s.items() if k != "faults"} for s in dear]
    assert fit_copies(warm + uncounted).fresh == pytest.approx(45 * 2.5e-6, rel=1e-3)  # the median ratio

GROWTH_TRUTH = LinearCostModel((0.0, 0.0, 2e-8, 3e-5), (0.0, 0.0, 4e-6), prefill_dense=TRUTH.prefill_dense,
                               decode_dense=TRUTH.decode_dense, copy=2e-5, fresh=3e-4, fresh_step=5e-5, grow=9e-5)


def _timed_at_growth_truth(grows: list[dict], warm: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """Prefills, steady decodes and joining syncs around these growing decodes, every sample (the
    growths too) timed at `GROWTH_TRUTH`: (prefills, decodes, syncs)."""
    truth = GROWTH_TRUTH
    pre = [{"step": "prefill", "chunk": L, "prefix": P, "written": 256 * (P == 0)}
           for L in (8, 16, 32, 64, 128) for P in (0, 300)]
    dec = [{"step": "decode", "batch": B, "context_max": M, "written": 0} for B in (1, 2, 4) for M in (64, 300, 900)]
    syncs = [{"step": "sync", "batch": B, "context_max": 300, "written": w, "fresh": f, "joined": 1, "left": 0}
             for B, w, f in ((2, 1200, 600), (3, 1800, 0), (4, 2400, 1200), (3, 900, 0), (2, 600, 0))]
    for x in pre:
        x["seconds"] = truth.prefill(x["chunk"], x["prefix"]) + kv_copies(truth, x["written"], 0, step=True)
    for x in dec + grows + warm:
        x["seconds"] = truth.decode([x["context_max"]] * x["batch"]) + kv_copies(truth, x["written"], x.get("fresh", 0),
                                                                                 step=True, grow=True)
    for x in syncs:
        x["seconds"] = kv_copies(truth, x["written"], x["fresh"])
    return pre, dec, syncs


def test_a_steps_own_growth_has_its_own_prices():
    """A decode's own growth writes its rows at `grow`, fitted on the growths that met no fresh
    memory, and its fresh rows cost `fresh_step` more, fitted on those that did; syncs and
    prefills keep `copy` and `fresh`. Without such decodes a profile has neither price."""
    grows = [{"step": "decode", "batch": 1, "context_max": M, "written": M + 256, "fresh": M + 256, "source": "engine:f"}
             for M in (100, 180, 250)]
    warm = [{"step": "decode", "batch": B, "context_max": M, "written": B * (M + 256), "fresh": 0, "source": "engine:w"}
            for B, M in ((1, 49), (2, 88), (1, 232))]
    pre, dec, syncs = _timed_at_growth_truth(grows, warm)
    cost = fit_profile(pre + dec + grows + warm + syncs)["cost"]
    assert cost["grow"] == pytest.approx(9e-5, rel=0.05) and cost["copy"] == pytest.approx(2e-5, rel=0.05)
    assert cost["fresh_step"] == pytest.approx(5e-5, rel=0.05) and cost["fresh"] == pytest.approx(3e-4, rel=0.05)
    model = cost_model({"cost": cost})
    assert price(model, "decode", 1, 0, [100], True, 0, 0, 356, 356) == pytest.approx(grows[0]["seconds"], rel=0.02)
    assert price(model, "decode", 2, 0, [88, 88], True, 0, 0, 688, 0) == pytest.approx(warm[1]["seconds"], rel=0.02)
    assert price(model, "prefill", 64, 0, [64], True, 0, 0, 256, 0) == pytest.approx(pre[6]["seconds"], rel=0.02)
    assert price(model, "sync", 2, 0, [300, 300], True, 1, 0, 1200, 600) == pytest.approx(syncs[0]["seconds"], rel=0.02)
    assert not {"fresh_step", "grow"} & set(fit_profile(pre + dec + syncs)["cost"])


def test_a_single_decodes_own_growth_has_one_price_fresh_or_not_without_fault_counts():
    """A single decode whose own cache grows (meTile's loop) writes its rows at `grow_single`, the
    median of such decodes' cost beyond their price, fresh memory or not; the batch cache's
    growths keep `grow` and `fresh_step`. Without such decodes a profile has no such price."""
    grows = [{"step": "decode", "batch": 1, "context_max": M, "written": M + 256, "fresh": M + 256} for M in (100, 180)]
    warm = [{"step": "decode", "batch": 2, "context_max": 88, "written": 688, "fresh": 0}]
    pre, dec, syncs = _timed_at_growth_truth(grows, warm)
    truth = GROWTH_TRUTH
    alone = [{"step": "decode", "batch": 1, "contexts": [257], "context_max": 257, "single": True, "written": 512,
              "fresh": f, "seconds": truth.decode([257], True) + r * 512} for f, r in ((512, 4e-4), (0, 4.5e-4), (0, 9e-4))]
    cost = fit_profile(pre + dec + grows + warm + alone + syncs)["cost"]
    assert cost["grow_single"] == pytest.approx(4.5e-4, rel=0.05)
    assert cost["grow"] == pytest.approx(9e-5, rel=0.05) and cost["fresh_step"] == pytest.approx(5e-5, rel=0.05)
    model = cost_model({"cost": cost})
    lone = truth.decode([257], True)
    assert price(model, "decode", 1, 0, [257], False, 0, 0, 512, 512) == pytest.approx(lone + 4.5e-4 * 512, rel=0.02)
    assert price(model, "decode", 1, 0, [257], False, 0, 0, 512, 0) == pytest.approx(lone + 4.5e-4 * 512, rel=0.02)
    assert price(model, "decode", 1, 0, [257], True, 0, 0, 512, 512) == pytest.approx(
        lone + (9e-5 + 5e-5) * 512, rel=0.02)  # the batch cache's growth: unchanged
    assert "grow_single" not in fit_profile(pre + dec + grows + warm + syncs)["cost"]
    assert price(cost_model({"cost": {k: v for k, v in cost.items() if k != "grow_single"}}), "decode", 1, 0, [257],
                 False, 0, 0, 512, 0) == pytest.approx(lone + 9e-5 * 512, rel=0.02)  # older profiles: `grow`


def test_a_single_growth_that_counted_its_faults_is_priced_at_the_dear_page():
    """Given the dear page price (`page`), a single decode's own growth costs a row's copy
    (`grow`) plus the median faults per row of the growths that counted theirs, each at that
    price: not what the growths happened to pay (here one met pages the guest had just freed, at
    a tenth of the price). Growths without fault counts keep the median beyond their price."""
    grows = [{"step": "decode", "batch": 1, "context_max": M, "written": M + 256, "fresh": M + 256} for M in (100, 180)]
    warm = [{"step": "decode", "batch": 2, "context_max": 88, "written": 688, "fresh": 0}]
    pre, dec, syncs = _timed_at_growth_truth(grows, warm)
    lone, page = GROWTH_TRUTH.decode([257], True), 1.2e-5
    alone = [{"step": "decode", "batch": 1, "contexts": [257], "context_max": 257, "single": True, "written": 512,
              "fresh": 0, "faults": n, "seconds": lone + 9e-5 * 512 + n * cost}
             for n, cost in ((10_000, 1.2e-6), (15_000, page), (0, 0.0))]
    fit = fit_profile(pre + dec + grows + warm + alone + syncs, page=page)
    rows = statistics.median([10_000 / 512, 15_000 / 512])  # the growth that faulted nothing has no say
    assert fit["cost"]["grow_single"] == pytest.approx(9e-5 + rows * page, rel=0.05)
    assert fit["cost"]["grow_single_faults"] == pytest.approx(rows * page)  # the part a confirm reprices
    assert fit["fit"]["page_fault_s"] == page
    # a growth that meets fresh memory pays the faults on every row; one in memory the heap already
    # held (`sim.engine.heap`: after a warm-up that served the trace) pays the row's copy alone
    model = cost_model({"cost": fit["cost"]})
    assert price(model, "decode", 1, 0, [257], False, 0, 0, 512, 1) == pytest.approx(
        lone + fit["cost"]["grow_single"] * 512, rel=0.02)
    assert price(model, "decode", 1, 0, [257], False, 0, 0, 512, 0) == pytest.approx(lone + 9e-5 * 512, rel=0.05)
    slow = MachineSpeed(1.0, 0.5, 3.0).of(model)  # decodes at half speed, faults at three times the price
    grown, held = (price(slow, "decode", 1, 0, [257], False, 0, 0, 512, f) - price(slow, "decode", 1, 0, [257], False,
                                                                                   0, 0, 0, 0) for f in (1, 0))
    faults = fit["cost"]["grow_single_faults"] * 512
    assert held == pytest.approx((fit["cost"]["grow_single"] * 512 - faults) / 0.5, rel=1e-9)
    assert grown == pytest.approx(held + 3.0 * faults, rel=1e-9)
    cheap = (alone[0]["seconds"] - lone) / 512
    assert fit_profile(pre + dec + grows + warm + alone + syncs)["cost"]["grow_single"] < 0.5 * fit["cost"]["grow_single"]
    no_counts = [{k: v for k, v in s.items() if k != "faults"} for s in alone]
    by_median = fit_profile(pre + dec + grows + warm + no_counts + syncs, page=page)["cost"]
    assert by_median["grow_single"] == pytest.approx(cheap, rel=0.05)  # the median growth's
    assert "grow_single_faults" not in by_median


def test_a_steps_growth_that_counted_its_faults_is_priced_at_the_dear_page():
    """Given the dear page price, a step's fresh row costs the median faults per fresh row of the
    decode growths that counted theirs, each at that price: not what those growths happened to
    pay (here they met cheap pages, as both of stop 41's calibrations did). A prefill's growth
    faults its activations too, so it has no say while a decode growth counted faults."""
    page = 1.2e-5
    grows = [{"step": "decode", "batch": 1, "context_max": M, "written": M + 256, "fresh": f, "faults": n}
             for M, f, n in ((100, 40, 2000), (180, 170, 2600), (200, 172, 0))]
    warm = [{"step": "decode", "batch": 2, "context_max": 88, "written": 688, "fresh": 0}]
    pre, dec, syncs = _timed_at_growth_truth(grows, warm)
    grown = {"step": "prefill", "chunk": 256, "prefix": 0, "written": 256, "fresh": 256, "faults": 24_000,
             "seconds": GROWTH_TRUTH.prefill(256, 0) + kv_copies(GROWTH_TRUTH, 256, 256, step=True)}
    cost = fit_profile(pre + dec + grows + warm + [grown] + syncs, page=page)["cost"]
    per_row = statistics.median([2000 / 40, 2600 / 170]) * page  # the growth that faulted nothing has no say
    assert cost["fresh_step"] == pytest.approx(per_row) and cost["fresh_step_faults"] == pytest.approx(per_row)
    assert cost["fresh_step"] > 5 * GROWTH_TRUTH.fresh_step  # what these growths paid: cheap
    cheap = fit_profile(pre + dec + grows + warm + [grown] + syncs)["cost"]  # no page price: what they paid
    assert cheap["fresh_step"] == pytest.approx(GROWTH_TRUTH.fresh_step, rel=0.05) and "fresh_step_faults" not in cheap
    model = cost_model({"cost": cost})
    assert price(model, "decode", 1, 0, [300], True, 0, 0, 512, 100) - price(
        model, "decode", 1, 0, [300], True, 0, 0, 512, 0) == pytest.approx(100 * per_row, rel=0.01)
    at = MachineSpeed(1.0, 2.0, 0.25).of(model)
    assert at.fresh_step == pytest.approx(per_row * 0.25)  # all of it faults: it moves with the page's price


def test_a_growths_faults_are_priced_at_the_page_price_the_probes_read():
    """`MachineSpeed.page` reprices only the faults of a single decode's growth; the row's copy
    moves with the decode speed. The page price is the dearest probe reading around the confirm's
    runs over the calibration's dear price, at most 1 (`speed_probe.page_price`)."""
    builtin = load_profile(BUILTIN)["cost"]
    cost = cost_model({"cost": dict(builtin, grow=5e-5, grow_single=4e-4, grow_single_faults=3.5e-4)})
    at = MachineSpeed(1.0, 2.0, 0.25).of(cost)
    assert at.grow_single == pytest.approx(5e-5 / 2 + 3.5e-4 * 0.25)
    assert MachineSpeed(1.0, 2.0).of(cost).grow_single == pytest.approx(5e-5 / 2 + 3.5e-4)
    unsplit = cost_model({"cost": dict(builtin, grow=5e-5, grow_single=4e-4)})  # profiles before stop 37
    assert MachineSpeed(1.0, 2.0, 0.25).of(unsplit).grow_single == pytest.approx(2e-4)
    pages = (64 << 20) // mmap.PAGESIZE
    run = lambda *us: {"probe": {"alloc_s": [u * 1e-6 * pages for u in us], "alloc_bytes": 64 << 20,
                                 "alloc_method": ALLOC_METHOD}}
    assert page_price([run(2.5, 2.6), run(2.7, 2.5)], 11.5e-6) == pytest.approx(2.7 / 11.5)
    assert page_price([run(2.5, 2.6), run(2.9, 13.0)], 11.5e-6) == 1.0  # one dear reading: the hour has dear faults
    assert page_price([run(2.5, 2.6)], None) == 1.0 and page_price([{}], 11.5e-6) == 1.0


def test_the_dear_page_is_the_median_of_the_dearest_probe_readings():
    """`dear_page_seconds`: per 4 KiB page, the median of the three dearest allocation readings
    over the probes timed by today's method; None with fewer than three."""
    pages = (64 << 20) // mmap.PAGESIZE
    probe = lambda *us, method=ALLOC_METHOD: {"alloc_s": [u * 1e-6 * pages for u in us], "alloc_bytes": 64 << 20,
                                              "alloc_method": method}
    assert dear_page_seconds([probe(2.5, 11.0), probe(12.0, 2.6), probe(15.0, 3.0)]) == pytest.approx(12e-6)
    assert dear_page_seconds([probe(2.5, 11.0), probe(40.0, method="mlx")]) is None
    assert dear_page_seconds([]) is None


def test_an_engine_runs_one_off_call_sets_no_knot_of_the_curve():
    """The dense curve passes through the grid's sizes (medians over rounds); an engine run's call
    of another size, one noisy timing, is fitted but cannot bend the curve's end by a knot of its own."""
    pre = [{"step": "prefill", "chunk": L, "prefix": P, "written": 0} for L in (8, 16, 32, 64, 128, 256)
           for P in (0, 300)]
    for x in pre:
        x["seconds"] = TRUTH.prefill(x["chunk"], x["prefix"])
    slow = {"step": "prefill", "chunk": 208, "prefix": 0, "written": 0, "source": "engine:eager",
            "seconds": 1.3 * TRUTH.prefill(208, 0)}  # a stall in an engine run
    form = fit_form("prefill", pre + [slow], tile=0)
    assert [n for n, _ in form.dense] == [8, 16, 32, 64, 128, 256]
    assert form.dense != fit_form("prefill", pre, tile=0).dense  # the call is still fitted
    assert fit_form("prefill", [dict(x, source="engine:x") for x in pre + [slow]], tile=0).dense[-2][0] == 208  # no grid: every size


def test_held_out_errors_follow_the_measurement_noise(tmp_path):
    """Exact data fits to ~0; 2% noise gives held-out errors of the same order, and the profile
    the fit writes is loaded back into the same predictions."""
    exact = fit_profile(_samples(TRUTH))
    assert all(max(e["form_mean"], e["cv_form_mean"]) < 1e-3 for e in exact["fit"]["errors"].values())
    noisy = fit_profile(_samples(TRUTH, noise=0.02))
    for e in noisy["fit"]["errors"].values():
        assert 0 < e["form_mean"] < 0.05 and e["repeat_noise"] == 0
        assert 0.005 < e["cv_form_mean"] < 0.05 and e["cv_form_mean"] <= e["cv_form_max"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"model": {"name": "m"}, "device": {}, "cost": exact["cost"]}))
    m = cost_model(load_profile(path))
    assert m.prefill(100, 700) == pytest.approx(TRUTH.prefill(100, 700), rel=1e-3)
    assert m.decode([300, 900]) == pytest.approx(TRUTH.decode([300, 900]), rel=1e-3)


@pytest.mark.parametrize("dense", [[[8, 1.0], [4, 2.0]], [[8]], "x", [[8, True]]])
def test_a_malformed_dense_curve_is_refused(tmp_path, dense):
    cost = {"prefill": {"coef": [0, 0, 1e-8, 0], "dense": dense}, "decode": {"coef": [0.1, 0.01, 1e-6]}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"model": {"name": "m"}, "device": {}, "cost": cost}))
    with pytest.raises(ProfileError, match="cost.prefill.dense"):
        load_profile(path)


def test_decode_slopes_in_a_profile(tmp_path):
    """Two slopes need their knot; a lone request's slope must be a non-negative number."""
    cost = {"prefill": {"coef": [0, 0, 1e-8, 0]}, "decode": {"coef": [0.1, 0.01, 1e-6, 5e-7]}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"model": {"name": "m"}, "device": {}, "cost": cost}))
    with pytest.raises(ProfileError, match="cost.decode.knot"):
        load_profile(path)
    cost["decode"]["knot"], cost["decode"]["lone"] = 1000, -1
    path.write_text(json.dumps({"model": {"name": "m"}, "device": {}, "cost": cost}))
    with pytest.raises(ProfileError, match="cost.decode.lone"):
        load_profile(path)
    cost["decode"]["knot"], cost["decode"]["lone"] = 1000, 2e-6
    path.write_text(json.dumps({"model": {"name": "m"}, "device": {}, "cost": cost}))
    m = cost_model(load_profile(path))
    assert m.decode([3000] * 2) == pytest.approx(0.12 + 2 * (1e-6 * 1000 + 5e-7 * 2000))
    assert m.decode([3000], single=True) == pytest.approx(0.11 + 2e-6 * 3000)  # alone: its own slope


def test_grid_model_falls_back_to_the_whole_form_outside_its_grid():
    """Outside the measured grid the grid model uses the form, measured dense curve included."""
    from sim.cost.grid import GridCostModel
    pts = np.array([[b, m, TRUTH.decode([m] * b)] for b in (1, 2) for m in (16, 64)])
    grid = GridCostModel(TRUTH, np.array([[8, 0, 1.0], [16, 0, 2.0], [8, 64, 1.5]]), pts)
    assert grid.decode([32, 32]) == pytest.approx(TRUTH.decode([32, 32]))  # inside: interpolated
    assert grid.decode([128] * 4) == TRUTH.decode([128] * 4) > 0.68  # outside: the form
    assert grid.decode_steps([128] * 4, 3).tolist() == [TRUTH.decode([128 + j] * 4) for j in range(3)]


def test_speed_by_round_recovers_each_rounds_machine_speed():
    """Every point timed once per round; round r ran `speed[r]` times slower: the per-round median
    of timing over the point's median is that speed over the median speed."""
    from calibrate.fit.common import speed_by_round
    import statistics
    speed = [1.0, 1.2, 0.9, 1.1]
    pts = [{"seconds": 0.0, "times": [base * f for f in speed]} for base in (0.1, 0.3, 2.0)]
    for p in pts:
        p["seconds"] = statistics.median(p["times"])
    mid = statistics.median(speed)
    assert speed_by_round(pts) == pytest.approx([f / mid for f in speed])

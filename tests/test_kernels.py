"""The real engine's step functions on a tiny Qwen3: chunking, masks, batching, building."""

from __future__ import annotations

import json

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from calibrate.engine.kernels import (  # noqa: E402
    DecodeBatch,
    causal_mask,
    decode_one,
    new_cache,
    prefill_chunk,
)
from calibrate.engine.gate import tolerance  # noqa: E402
from calibrate.engine.model import QWEN3_CONFIGS, ModelError, build_model  # noqa: E402

CHUNK = 16


@pytest.fixture(scope="module")
def lm():
    return build_model("qwen3-tiny", dtype="float32", seed=0)


def prompt(n: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, size=n).tolist()


def chunked_logits(lm, tokens: list[int], chunk: int) -> np.ndarray:
    cache = new_cache(lm)
    out = [np.array(prefill_chunk(lm, cache, tokens[s:s + chunk], return_all_logits=True)[1])
           for s in range(0, len(tokens), chunk)]
    assert cache[0].offset == len(tokens)
    return np.concatenate(out)


@pytest.mark.parametrize("n", [CHUNK - 5, CHUNK, CHUNK + 1, 3 * CHUNK + 7])
def test_chunked_prefill_matches_one_shot(lm, n):
    tokens = prompt(n)
    one_shot = chunked_logits(lm, tokens, chunk=n)
    chunked = chunked_logits(lm, tokens, chunk=CHUNK)
    assert chunked.shape == (n, lm.vocab_size)
    tol = tolerance()  # the device's float32 products (TF32 on a CUDA GPU)
    np.testing.assert_allclose(chunked, one_shot, rtol=tol, atol=tol)


def test_last_position_logits_and_token(lm):
    tokens = prompt(CHUNK + 1)
    all_logits = chunked_logits(lm, tokens, chunk=len(tokens))
    tok, last = prefill_chunk(lm, new_cache(lm), tokens)
    assert last.shape == (lm.vocab_size,) and last.dtype == mx.float32
    tol = tolerance() / 10  # the same call on the same shapes: closer than chunked against one-shot
    np.testing.assert_allclose(np.array(last), all_logits[-1], rtol=tol, atol=tol)
    assert tok == int(np.argmax(all_logits[-1]))


def test_causal_mask_seed_example():
    inf = -np.inf
    expected = np.array([[0, 0, 0, 0, 0, 0, inf, inf],
                         [0, 0, 0, 0, 0, 0, 0, inf],
                         [0, 0, 0, 0, 0, 0, 0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(causal_mask(3, 5), expected)
    np.testing.assert_array_equal(causal_mask(4, 0), np.triu(np.full((4, 4), -np.inf), 1))


def test_causal_string_mask_is_our_mask():
    """mlx-lm passes "causal" for a chunk over a non-empty cache: it must mean causal_mask()."""
    rng = np.random.default_rng(0)
    q = mx.array(rng.standard_normal((1, 4, 3, 16)).astype(np.float32))
    k = mx.array(rng.standard_normal((1, 2, 8, 16)).astype(np.float32))
    v = mx.array(rng.standard_normal((1, 2, 8, 16)).astype(np.float32))
    sdpa = mx.fast.scaled_dot_product_attention
    by_string = sdpa(q, k, v, scale=0.25, mask="causal")
    by_array = sdpa(q, k, v, scale=0.25, mask=mx.array(causal_mask(3, 5)))
    np.testing.assert_allclose(np.array(by_string), np.array(by_array), rtol=1e-5, atol=1e-6)


def decode_alone(lm, tokens: list[int], steps: int) -> list[int]:
    cache = new_cache(lm)
    tok, _ = prefill_chunk(lm, cache, tokens)
    out = [tok]
    for _ in range(steps):
        out.append(decode_one(lm, cache, out[-1]))
    return out


def test_batched_decode_matches_alone(lm):
    """Different prompt lengths, joining at different times, one leaving and one rejoining."""
    prompts = {"a": prompt(37, 1), "b": prompt(5, 2), "c": prompt(20, 3), "d": prompt(64, 4)}
    steps = 12
    expected = {rid: decode_alone(lm, p, steps) for rid, p in prompts.items()}
    assert all(len(set(toks)) > 3 for toks in expected.values())  # not a degenerate repeat

    caches, out = {}, {}
    for rid, p in prompts.items():
        caches[rid] = new_cache(lm)
        out[rid] = [prefill_chunk(lm, caches[rid], p[:10])[0]]
        if len(p) > 10:  # chunked prefill, as the engine does it
            out[rid] = [prefill_chunk(lm, caches[rid], p[10:])[0]]

    batch = DecodeBatch(lm)
    # Step at which each request's membership changes: (ids in the batch from that step on).
    plan = {0: ["a"], 2: ["a", "b"], 4: ["c", "a", "b"], 7: ["c", "b", "d"],
            9: ["c", "b", "d", "a"]}
    active: list[str] = []
    counts = []
    for step in range(20):
        if step in plan:
            active = plan[step]
            counts.append(batch.sync(active, caches))
        assert batch.sync(active, caches) == (0, 0)
        new = batch.step([out[rid][-1] for rid in active])
        for rid, tok in zip(active, new):
            out[rid].append(tok)
        active_done = [rid for rid in active if len(out[rid]) == steps + 1]
        if active_done:
            for rid in active_done:
                caches.pop(rid)
            active = [rid for rid in active if rid not in active_done]
            batch.sync(active, caches)
    # "a" left at step 7 (written back to its own cache) and rejoined at step 9.
    assert counts == [(1, 0), (1, 0), (1, 0), (1, 1), (1, 0)]
    for rid in prompts:
        assert out[rid] == expected[rid], rid
    assert len(batch) == 0


def test_decode_one_after_leaving_batch(lm):
    """A request that leaves the batch continues alone from its written-back cache."""
    p = prompt(9, 7)
    expected = decode_alone(lm, p, 6)
    caches = {"x": new_cache(lm), "y": new_cache(lm)}
    tok_x = [prefill_chunk(lm, caches["x"], p)[0]]
    tok_y = prefill_chunk(lm, caches["y"], prompt(30, 8))[0]
    batch = DecodeBatch(lm)
    batch.sync(["y", "x"], caches)
    for _ in range(3):
        tok_y, t = batch.step([tok_y, tok_x[-1]])
        tok_x.append(t)
    assert batch.sync(["y"], caches) == (0, 1)
    assert caches["x"][0].offset == len(p) + 3
    for _ in range(3):
        tok_x.append(decode_one(lm, caches["x"], tok_x[-1]))
    assert tok_x == expected


def test_build_model_errors(tmp_path):
    with pytest.raises(ModelError, match="unknown model 'qwen9'.*qwen3-0.6b"):
        build_model("qwen9")
    with pytest.raises(ModelError, match="not a directory"):
        build_model("qwen3-tiny", weights=str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="not a Qwen3 config"):
        build_model("qwen3-tiny", weights=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_CONFIGS["qwen3-tiny"]))
    with pytest.raises(ModelError, match="do not have the shapes of qwen3-0.6b"):
        build_model("qwen3-0.6b", weights=str(tmp_path))


def test_hf_cache_lookup_is_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="no local snapshot of Qwen/Qwen3-0.6B"):
        build_model("qwen3-0.6b", weights="hf-cache")
    with pytest.raises(ModelError, match="no Hugging Face repository"):
        build_model("qwen3-tiny", weights="hf-cache")
    snapshot = tmp_path / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN3_CONFIGS["qwen3-tiny"]))
    (snapshot / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="abc123 do not have the shapes of qwen3-0.6b"):
        build_model("qwen3-0.6b", weights="hf-cache")


def test_load_local_weights_roundtrip(lm, tmp_path):
    """A snapshot directory (config.json + safetensors) loads offline into the same model."""
    from mlx.utils import tree_flatten

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_CONFIGS["qwen3-tiny"]))
    weights = dict(tree_flatten(lm.model.parameters()))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    loaded = build_model("qwen3-tiny", weights=str(tmp_path))
    assert loaded.source == str(tmp_path)
    tokens = prompt(11)
    a = prefill_chunk(lm, new_cache(lm), tokens)[1]
    b = prefill_chunk(loaded, new_cache(loaded), tokens)[1]
    np.testing.assert_array_equal(np.array(a), np.array(b))


def test_random_weights_deterministic_by_seed(lm):
    same = build_model("qwen3-tiny", seed=0)
    other = build_model("qwen3-tiny", seed=1)
    w = lambda m: np.array(m.model.model.embed_tokens.weight)  # noqa: E731
    np.testing.assert_array_equal(w(lm), w(same))
    assert not np.array_equal(w(lm), w(other))
    assert lm.source == "random" and lm.vocab_size == 1024 and lm.max_context == 4096


def test_quantized_4bit_prefill():
    q = build_model("qwen3-tiny", quant_bits=4)
    assert q.quant_bits == 4
    assert "scales" in q.model.model.layers[0].mlp.up_proj  # really quantized
    cache = new_cache(q)
    tok, logits = prefill_chunk(q, cache, prompt(20))
    assert 0 <= tok < q.vocab_size and logits.shape == (q.vocab_size,)
    assert np.isfinite(np.array(logits)).all()
    assert 0 <= decode_one(q, cache, tok) < q.vocab_size


def test_gate_tolerance_follows_the_devices_float32_products(lm):
    """The gate holds FP32's tolerance where float32 products are float32 (a CPU), TF32's where the
    measured product error says TF32 (a CUDA GPU), and a chunked prefill that computed something
    else fails it whatever the tolerance."""
    from calibrate.engine.gate import RTOL, TF32_ERROR, TF32_TOL, chunked_logits_match, matmul_rel_error, tolerance
    err = matmul_rel_error()
    expected = TF32_TOL if err > TF32_ERROR else RTOL
    assert 0 < err < 1e-2 and tolerance() == expected
    ok = chunked_logits_match(lm, prompt(21), 8, tolerance())
    assert ok["ok"] and ok["tolerance"] == expected and ok["max_abs_diff"] < expected
    # chunks run on a cache that already holds 5 tokens (a wrong offset) fail even TF32's tolerance
    import calibrate.engine.gate as gate
    real, made = gate.new_cache, []

    def second_shifted(lm_):  # the one-shot prefill's cache is clean, the chunked one's is not
        cache = real(lm_)
        if made:
            gate.prefill_chunk(lm_, cache, prompt(5, seed=9))
        made.append(cache)
        return cache
    try:
        gate.new_cache = second_shifted
        bad = chunked_logits_match(lm, prompt(21), 8, TF32_TOL)
    finally:
        gate.new_cache = real
    assert not bad["ok"]

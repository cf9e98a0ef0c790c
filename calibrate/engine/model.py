"""Build a Qwen3 or Qwen3.5 model with mlx-lm: random weights in the official shapes, or local weights.

Qwen3.5 is a hybrid: three Gated DeltaNet (linear-attention) layers to one full-attention layer
(`full_attention_interval` 4), built from mlx-lm's own `qwen3_5.TextModel`; a linear layer keeps a
fixed-size state per request (mlx-lm's `ArraysCache`: a conv state and a float32 recurrent
state) where an attention layer keeps a growing KV cache.

Timing is a property of shapes, not of weight values, so random weights are the default: no
download, and the same kernels run on the same shapes as the released checkpoint. Real weights
are only read from a local directory or the local Hugging Face cache, never from the network.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3, qwen3_5

from calibrate.host.malloc import keep_freed_memory
from sim.core.errors import UserError

_COMMON = dict(
    model_type="qwen3",
    vocab_size=151936,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    head_dim=128,
)

# Official shapes from the Qwen3 config.json files. qwen3-tiny is ours, for fast tests; it has an
# untied LM head because with random tied embeddings greedy decoding just repeats its input token
# (the residual stream keeps the token's own embedding), which would hide context bugs.
QWEN3_CONFIGS: dict[str, dict] = {
    "qwen3-0.6b": dict(_COMMON, hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(_COMMON, hidden_size=2048, num_hidden_layers=28, intermediate_size=6144,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(_COMMON, hidden_size=2560, num_hidden_layers=36, intermediate_size=9728,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(_COMMON, hidden_size=4096, num_hidden_layers=36, intermediate_size=12288,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-tiny": dict(_COMMON, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       vocab_size=1024, max_position_embeddings=4096, tie_word_embeddings=False),
}

_ROPE_35 = {"type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25}
# Qwen3.5's text model, the shapes of its published config.json (Qwen/Qwen3.5-0.8B: 18 linear and 6
# full-attention layers). qwen3.5-tiny is ours, for fast tests: three linear layers and one full.
HYBRID_CONFIGS: dict[str, dict] = {
    "qwen3.5-0.8b": dict(model_type="qwen3_5_text", vocab_size=248320, hidden_size=1024, num_hidden_layers=24,
                         intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                         linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                         linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                         rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=True,
                         rope_parameters=_ROPE_35),
    "qwen3.5-tiny": dict(model_type="qwen3_5_text", vocab_size=1024, hidden_size=64, num_hidden_layers=4,
                         intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                         linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=4,
                         rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
                         rope_parameters=_ROPE_35),
}
MODELS: dict[str, dict] = {**QWEN3_CONFIGS, **HYBRID_CONFIGS}  # every model `--model` names

# Hugging Face repositories, for weights="hf-cache" (looked up offline in the local cache only).
HF_REPOS: dict[str, str] = {
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
}

DTYPES: dict[str, mx.Dtype] = {
    "float32": mx.float32,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
}

# Keys that fix the kernels' shapes: weights must agree with the named model on these.
_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size")


class ModelError(UserError, ValueError):
    """A model cannot be built as asked; the message is one line a user can act on."""


def is_hybrid(config: dict) -> bool:
    """Whether the model has linear-attention layers (Qwen3.5, Qwen3-Next)."""
    return "full_attention_interval" in config


@dataclass
class LoadedModel:
    name: str
    model: qwen3.Model | qwen3_5.TextModel
    config: dict
    dtype: str
    quant_bits: int | None
    source: str  # "random" or the weights directory

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def max_context(self) -> int:
        return int(self.config["max_position_embeddings"])

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])


def weights_bytes(lm) -> int:
    """Bytes of the model's parameters, as MLX holds them."""
    return int(sum(v.nbytes for _, v in tree_flatten(lm.model.parameters())))


def reset_peak(lm) -> int:
    """Start a run's peak count; return the bytes in use that are not the run's, to subtract from the
    peak read at its end: arrays the process holds besides the model's weights (another model, a
    test's caches). sim.engine.memory predicts the weights and what the run builds, nothing else; run
    after mlx-lm's tests in one process, qwen3-tiny's runs read 1.35x their peak without this."""
    mx.reset_peak_memory()
    return max(0, mx.get_active_memory() - weights_bytes(lm))


def random_weights(model: nn.Module, seed: int, dtype: mx.Dtype = mx.float32, bits: int | None = None) -> nn.Module:
    """Every matrix uniform in +-1/sqrt(fan-in), as mlx.nn initializes a Linear; norms stay ones.

    Drawn in the precision timed, one parameter at a time: a float matrix in float32 with numpy
    (faster than MLX's CPU generator: a 0.6B model builds in 6.6 s instead of 12 s here) and cast
    at once; a quantized one (the model already `nn.quantize`d, nothing evaluated) as packed
    integers, its scales and biases mapping them onto the same range. So no copy of the model in
    float32 is ever held (a 4-bit Qwen3-8B would need 32 GB for it). The values do not change
    timings, and float32 draws are the same numbers whatever the dtype.
    """
    rng = np.random.default_rng(seed)
    params = dict(tree_flatten(model.parameters()))
    keep = getattr(model, "cast_predicate", None) or (lambda _: True)
    fresh = []
    for key, p in params.items():
        if p.ndim < 2 or key.endswith((".scales", ".biases")):
            continue
        if p.dtype == mx.uint32:  # packed: 32 // bits values per integer, in groups sharing a scale and bias
            base = key[:-len("weight")]
            scale = 1.0 / np.sqrt(p.shape[-1] * 32 // bits)
            levels = (1 << bits) - 1
            fresh += [(key, mx.array(rng.integers(0, 1 << 32, p.shape, dtype=np.uint32))),
                      (base + "scales", mx.full(params[base + "scales"].shape, 2 * scale / levels, dtype)),
                      (base + "biases", mx.full(params[base + "biases"].shape, -scale, dtype))]
            continue
        scale = np.float32(1.0 / np.sqrt(p.shape[-1]))
        w = rng.random(p.shape, dtype=np.float32)
        w -= np.float32(0.5)
        w *= 2 * scale
        w = mx.array(w)
        fresh.append((key, w.astype(dtype) if keep(key) else w))
        mx.eval(fresh[-1][1])  # the float32 draw freed before the next
    return model.update(tree_unflatten(fresh))


def build_model(
    name: str,
    dtype: str = "float32",
    quant_bits: int | None = None,
    weights: str | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Build `name` in `dtype`, optionally quantized to 4 or 8 bits, with all parameters evaluated.

    weights=None: random weights (deterministic by `seed`); a directory: a Hugging Face snapshot
    (config.json + *.safetensors); "hf-cache": the snapshot of `name` in the local HF cache.
    """
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    keep_freed_memory()  # before the weights: the engine's process keeps what it frees (`calibrate.host.malloc`)
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if quant_bits not in (None, 4, 8):
        raise ModelError(f"quant_bits must be None, 4 or 8, not {quant_bits!r}")

    if weights is None:
        config = dict(MODELS[name])
        model = architecture(config)  # its own initial weights are lazy: never evaluated
        if quant_bits is not None:
            nn.quantize(model, group_size=64, bits=quant_bits)
            config["quantization"] = {"group_size": 64, "bits": quant_bits}
        model = random_weights(model, seed, DTYPES[dtype], quant_bits)
        source = "random"
    elif name in HYBRID_CONFIGS:
        raise ModelError(f"{name}: only random weights for now (its shapes are what calibration times)")
    else:
        path = _hf_cache_snapshot(name) if weights == "hf-cache" else Path(weights).expanduser()
        config, model = _load_local(name, path)
        source = str(path)

    _cast(model, DTYPES[dtype])
    if quant_bits is not None and "quantization" not in config:
        nn.quantize(model, group_size=64, bits=quant_bits)
        config["quantization"] = {"group_size": 64, "bits": quant_bits}
    elif quant_bits is not None and config["quantization"].get("bits") != quant_bits:
        raise ModelError(f"weights at {source} are already quantized to "
                         f"{config['quantization'].get('bits')} bits, not {quant_bits}")
    mx.eval(model.parameters())
    model.eval()
    bits = config.get("quantization", {}).get("bits")
    return LoadedModel(name, model, config, dtype, bits, source)


def _cast(model: nn.Module, dtype: mx.Dtype) -> None:
    """Floating-point parameters to `dtype` (packed ints stay as they are), but what the model keeps
    in float32 whatever its dtype (Qwen3.5's A_log: mlx-lm's `cast_predicate`, as its loader casts)."""
    keep = getattr(model, "cast_predicate", None) or (lambda _: True)
    model.update(tree_unflatten([(k, v.astype(dtype)) for k, v in tree_flatten(model.parameters())
                                 if mx.issubdtype(v.dtype, mx.floating) and keep(k)]))


def architecture(config: dict) -> nn.Module:
    """mlx-lm's model for `config`: a dense Qwen3, or Qwen3.5's text model (a hybrid)."""
    if is_hybrid(config):
        return qwen3_5.TextModel(qwen3_5.TextModelArgs.from_dict(config))
    return qwen3.Model(qwen3.ModelArgs.from_dict(config))


def _hf_cache_snapshot(name: str) -> Path:
    """The newest local snapshot of `name` in the Hugging Face cache (no network)."""
    if name not in HF_REPOS:
        raise ModelError(f"{name} has no Hugging Face repository; use random weights")
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    folder = Path(hub) / ("models--" + HF_REPOS[name].replace("/", "--")) / "snapshots"
    snapshots = sorted((p for p in folder.glob("*") if (p / "config.json").exists()),
                       key=lambda p: p.stat().st_mtime)
    if not snapshots:
        raise ModelError(f"no local snapshot of {HF_REPOS[name]} under {folder}")
    return snapshots[-1]


def _load_local(name: str, path: Path) -> tuple[dict, qwen3.Model]:
    """Read config.json and *.safetensors from a local snapshot into a Qwen3 model."""
    if not path.is_dir():
        raise ModelError(f"weights path {path} is not a directory")
    config_file = path / "config.json"
    files = sorted(glob.glob(str(path / "*.safetensors")))
    if not config_file.exists() or not files:
        raise ModelError(f"weights path {path} lacks config.json or *.safetensors")
    config: dict[str, Any] = json.loads(config_file.read_text())
    if config.get("model_type") != "qwen3":
        raise ModelError(f"{config_file} is not a Qwen3 config "
                         f"(model_type={config.get('model_type')!r})")
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    expected = QWEN3_CONFIGS[name]
    wrong = [k for k in _SHAPE_KEYS if config.get(k) != expected[k]]
    if wrong:
        diffs = ", ".join(f"{k}={config.get(k)} (expected {expected[k]})" for k in wrong)
        raise ModelError(f"weights at {path} do not have the shapes of {name}: {diffs}")

    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    tensors: dict[str, mx.array] = {}
    for f in files:
        tensors.update(mx.load(f))
    tensors = model.sanitize(tensors)
    quant = config.get("quantization")
    if quant:  # pre-quantized (e.g. an MLX community snapshot): quantize the layers it quantized
        nn.quantize(model, group_size=quant["group_size"], bits=quant["bits"],
                    class_predicate=lambda p, m: f"{p}.scales" in tensors)
    try:
        model.load_weights(list(tensors.items()), strict=True)
    except ValueError as e:
        raise ModelError(f"weights at {path} do not fit a Qwen3 model: {e}".splitlines()[0]) from e
    return config, model


def build_as_profiled(model: dict) -> LoadedModel:
    """The model a profile's `model` section describes (name, dtype, quantization, weights)."""
    weights = model.get("weights")
    return build_model(model["name"], dtype=model.get("dtype", "float32"), quant_bits=model.get("quant_bits"),
                       weights=None if weights in (None, "random") else weights)

"""A model in the precision users serve: random weights drawn straight in the dtype (or packed
quantized integers) timed, and a calibration and confirm of it whose gate checks those kernels."""
import json

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from calibrate.engine.model import build_model
from tests.test_confirm import pdsim


def test_random_weights_are_drawn_in_the_precision_timed():
    f32 = dict(tree_flatten(build_model("qwen3-tiny").model.parameters()))
    bf16 = dict(tree_flatten(build_model("qwen3-tiny", dtype="bfloat16").model.parameters()))
    assert all(v.dtype == mx.bfloat16 for v in bf16.values())
    # the same draws, cast: a dtype changes the precision, not the model
    key = "model.layers.0.mlp.up_proj.weight"
    assert mx.array_equal(bf16[key], f32[key].astype(mx.bfloat16))
    q = build_model("qwen3-tiny", dtype="bfloat16", quant_bits=4)
    params = dict(tree_flatten(q.model.parameters()))
    assert q.quant_bits == 4 and params[key].dtype == mx.uint32 and params[key[:-6] + "scales"].dtype == mx.bfloat16
    # its packed integers span the same range as a float draw: +-1/sqrt(fan-in)
    w = np.array(mx.dequantize(params[key], params[key[:-6] + "scales"], params[key[:-6] + "biases"], 64, 4)
                 .astype(mx.float32))
    bound = 1 / np.sqrt(w.shape[-1])
    assert w.shape == f32[key].shape and np.abs(w).max() <= bound * 1.01 and w.std() > bound / 3


def test_a_4bit_bf16_calibration_and_its_confirm_gate_the_timed_kernels(tmp_path):
    prof = tmp_path / "q4.json"
    code, _, err = pdsim("calibrate", "--model", "qwen3-tiny", "--grid", "tiny", "--dtype", "bfloat16",
                         "--quant-bits", "4", "-o", str(prof))
    assert code == 0, err
    model = json.loads(prof.read_text())["model"]
    assert (model["dtype"], model["quant_bits"]) == ("bfloat16", 4)
    out = tmp_path / "c.json"
    code, _, err = pdsim("confirm", "--profile", str(prof), "--trace", "tinyllm", "--num-seqs", "3", "--min-in", "9",
                         "--max-in", "30", "--min-out", "3", "--max-out", "5", "--policy", "chunked", "--budget", "8",
                         "--batch-size", "2", "--repeats", "1", "-o", str(out))
    assert code == 0, err
    gate = json.loads(out.read_text())["gate"]
    assert gate["ok"] and (gate["dtype"], gate["quant_bits"]) == ("bfloat16", 4)
    assert all(g["tolerance"] > 1e-3 for g in gate["logits"])  # bfloat16's rounding, not float32's

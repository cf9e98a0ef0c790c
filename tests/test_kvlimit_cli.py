"""`--kv-limit` where input enters: parsed once (tokens or memory), refused in one line (exit 2)
when wrong or when a request could never fit, a setting option like the others (labels, grid
axes, `--setting` strings, `pdsim policies`), and its metrics in strict JSON."""
import json

import numpy as np
import pytest

import policies
from cli_checks import refused
from sim.cli import main
from sim.cost.profile import BUILTIN
from sim.engine.memory import KVLimit, kv_bytes_per_token, parse_kv_limit, profile_kv_bytes
from policies.settings import Setting, grid_settings, unique

PROFILE = json.loads(BUILTIN.read_text())
QWEN3_06B = dict(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_size=1024)


@pytest.mark.parametrize("text, limit", [
    ("4096", KVLimit(tokens=4096)), ("4096tok", KVLimit(tokens=4096)), (" 12 tokens ", KVLimit(tokens=12)),
    ("2GB", KVLimit(amount=2.0)), ("0.5GB", KVLimit(amount=0.5)), ("1.5GiB", KVLimit(amount=1.5, unit="GiB")),
    ("512MB", KVLimit(amount=512.0, unit="MB")), (4096, KVLimit(tokens=4096)), (4096.0, KVLimit(tokens=4096)),
    (None, None), ("none", None), (float("nan"), None), (np.int64(600), KVLimit(tokens=600)),
    (np.float64(600.0), KVLimit(tokens=600))])
def test_limits_parse(text, limit):
    assert parse_kv_limit(text) == limit


def test_bytes_per_kv_token_and_a_limit_in_memory():
    assert kv_bytes_per_token(QWEN3_06B, "float32") == 28 * 8 * 128 * 2 * 4 == 229_376
    assert kv_bytes_per_token(QWEN3_06B, "bfloat16") == 114_688
    assert profile_kv_bytes(PROFILE) == 114_688  # the built-in profile: Qwen3-0.6B in bfloat16
    assert parse_kv_limit("1GB").resolve(114_688) == 10**9 // 114_688
    assert parse_kv_limit("1GiB").resolve(114_688) == 2**30 // 114_688
    assert profile_kv_bytes({"model": {"name": "x", "shapes": {"num_hidden_layers": "28"}}}) is None


@pytest.mark.parametrize("value, needle", [("0", "between 1 and"), ("-5", "must be > 0"), ("2.5", "whole number"),
                                           ("2XB", "expected tokens"), ("0GB", "> 0"), ("infGB", "expected tokens")])
def test_bad_limits_are_refused_in_one_line(capsys, value, needle):
    refused(["simulate", "--kv-limit", value], capsys, "--kv-limit", needle)
    refused(["sweep", "--setting", f"chunked:budget=32,kv_limit={value}", "--no-progress"], capsys, "kv_limit", needle)


def test_a_request_that_can_never_fit_is_refused_before_the_run(capsys):
    refused(["simulate", "--kv-limit", "100"], capsys, "request 0 needs 527 tokens of KV cache", "could never finish")
    refused(["sweep", "--kv-limit", "none", "100", "--no-progress"], capsys, "could never finish")


def test_mlx_lm_refuses_a_limit(capsys):
    refused(["simulate", "--policy", "mlx-lm", "--kv-limit", "4096"], capsys, "mlx-lm", "no KV-cache limit")
    with pytest.raises(policies.PolicyError, match="no KV-cache limit"):
        Setting("mlx-lm", kv_limit="2GB")


def test_a_limit_in_memory_needs_the_models_shapes(tmp_path, capsys):
    doc = json.loads(json.dumps(PROFILE))
    del doc["model"]["shapes"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    refused(["simulate", "--profile", str(path), "--kv-limit", "2GB"], capsys, "give the limit in tokens")
    assert main(["simulate", "--profile", str(path), "--kv-limit", "4096"]) == 0


def test_a_limit_is_a_setting_option():
    assert Setting("chunked", 64, kv_limit="4096tok").label == "chunked/b64/bs4/kv4096"
    assert Setting("eager", kv_limit="0.50GB").label == "eager/bs4/kv0.5GB"
    assert Setting("chunked", 64).to_dict() == {"policy": "chunked", "budget": 64, "batch_size": 4,
                                                "decode": "batched", "order": "chunk-first"}  # no limit, no key
    assert len(unique([{"policy": "eager", "kv_limit": 4096}, {"policy": "eager", "kv_limit": "4096tok"}])) == 1
    grid = grid_settings(["chunked", "fifo"], [32], kv_limits=[None, 600, "1GB"])
    assert [Setting.of(s).label for s in grid] == ["chunked/b32/bs4", "chunked/b32/bs4/kv600", "chunked/b32/bs4/kv1GB",
                                                   "fifo", "fifo/kv600", "fifo/kv1GB"]
    assert "kv_limit" in policies.POLICIES["chunked"].uses and "kv_limit" not in policies.POLICIES["mlx-lm"].uses


def test_policies_lists_the_option(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "--kv-limit" in out and "kv_limit" in out


def test_simulate_and_sweep_report_preemptions(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["simulate", "--policy", "chunked", "--budget", "32", "--kv-limit", "600", "--json-out",
                 str(out)]) == 0
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert doc["setting"]["kv_limit"] == 600 and doc["metrics"]["preemptions"] >= 1
    assert doc["metrics"]["recomputed_tokens"] > 0
    assert "preemptions" in capsys.readouterr().out
    sw = tmp_path / "sw"
    assert main(["sweep", "--policy", "chunked", "eager", "--budget", "32", "--kv-limit", "none", "600", "0.1GB",
                 "-o", str(sw), "--no-progress", "--workers", "1"]) == 0
    import pandas as pd
    df = pd.read_csv(sw / "results.csv")
    assert set(df["label"]) == {"chunked/b32/bs4", "chunked/b32/bs4/kv600", "chunked/b32/bs4/kv0.1GB",
                                "eager/bs4", "eager/bs4/kv600", "eager/bs4/kv0.1GB"}
    by = df.set_index("label")
    assert by.loc["chunked/b32/bs4", "preemptions"] == 0 and by.loc["chunked/b32/bs4/kv600", "preemptions"] >= 1

"""mlx-lm at the command line: settings, sweeps over mlx_lm.server's flags, the listing, bad input."""
import argparse
import json
import subprocess
import sys

import pytest

from sim.cli import main
from sim.commands.common import add_policy_args, settings_from_args


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_settings_take_mlx_lm_options_only_for_mlx_lm():
    p = argparse.ArgumentParser()
    add_policy_args(p, many=True)
    a = p.parse_args(["--policy", "chunked", "mlx-lm", "--budget", "32", "--prefill-step", "64", "512",
                      "--prompt-concurrency", "2"])
    assert settings_from_args(a) == [
        {"policy": "chunked", "budget": 32, "batch_size": 4, "decode": "batched", "order": "chunk-first"},
        {"policy": "mlx-lm", "prefill_step": 64, "prompt_concurrency": 2, "decode_concurrency": 32},
        {"policy": "mlx-lm", "prefill_step": 512, "prompt_concurrency": 2, "decode_concurrency": 32}]
    a = p.parse_args(["--setting", "mlx-lm:prefill_step=128,decode_concurrency=4", "mlx-lm"])
    assert settings_from_args(a) == [
        {"policy": "mlx-lm", "prefill_step": 128, "prompt_concurrency": 8, "decode_concurrency": 4},
        {"policy": "mlx-lm", "prefill_step": 2048, "prompt_concurrency": 8, "decode_concurrency": 32}]
    from policies.settings import setting_label
    assert setting_label(settings_from_args(a)[0]) == "mlx-lm/s128/p8/d4"


def test_policies_lists_mlx_lm_and_its_flags(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    for name in ("mlx-lm", "--prefill-step", "--prompt-concurrency", "--decode-concurrency", "--prefill-step-size"):
        assert name in out


def test_sweep_over_the_three_options(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--trace", "poisson", "--num-requests", "20", "--rate", "2", "--policy", "mlx-lm", "chunked",
                 "--prefill-step", "64", "512", "--prompt-concurrency", "1", "4", "--decode-concurrency", "4", "32",
                 "--workers", "1", "--no-progress", "-o", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    labels = {r["label"] for r in doc["rows"]}
    assert {f"mlx-lm/s{s}/p{p}/d{d}" for s in (64, 512) for p in (1, 4) for d in (4, 32)} <= labels
    assert len(labels) == 9  # and chunked once
    rows = [r for r in doc["rows"] if r["policy"] == "mlx-lm"]
    assert {r["prefill_step"] for r in rows} == {64, 512} and all(r["completed"] == 20 for r in rows)
    # more prompts prefilled together finish the prompts sooner: the first token comes earlier
    ttft = {(r["prefill_step"], r["prompt_concurrency"], r["decode_concurrency"]): r["p50_ttft_ms"] for r in rows}
    assert ttft[512, 4, 32] < ttft[512, 1, 32]


@pytest.mark.parametrize("args, needle", [
    (["simulate", "--policy", "mlx-lm", "--prompt-concurrency", "0"], "--prompt-concurrency: must be >= 1"),
    (["simulate", "--policy", "mlx-lm", "--decode-concurrency", "0"], "--decode-concurrency: must be >= 1"),
    (["sweep", "--setting", "mlx-lm:prompt_concurrency=0"], "prompt_concurrency must be a whole number >= 1"),
    (["sweep", "--setting", "mlx-lm:page_size=3"], "expected KEY=VALUE"),
    (["sweep", "--policy", "mlx-lm", "--prefill-steps", "32"], "unrecognized arguments: --prefill-steps"),
    (["sweep", "--setting", "mlx-lm:decode_concurrency=0"], "decode_concurrency must be a whole number >= 1"),
    (["sweep", "--policy", "mlx-lm", "--prefill-step", "0"], "--prefill-step: must be >= 1"),
    (["simulate", "--policy", "mlx-lm", "--trace", "metile"], "prefilled before the clock"),
    (["confirm", "--engine", "vllm", "--profile", "x.json", "-o", "r.json"], "invalid choice: 'vllm'"),
    (["calibrate", "--engine", "sglang"], "invalid choice: 'sglang'"),
    (["tune", "--engine", "tgi"], "invalid choice: 'tgi'"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    code, out, err = run_cli(*args)
    assert code == 2, (out, err)
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

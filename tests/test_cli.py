"""The command line as a user meets it: output, files, and one-line errors with exit code 2."""
import json
import subprocess
import sys

import pytest

from sim.cli import main


def run_cli(*args):
    """Run pdsim in a fresh process, as a user would; return (code, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_simulate_prints_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["simulate", "--trace", "tinyllm", "--policy", "chunked", "--budget", "128",
                 "--batch-size", "4", "--json-out", str(out), "--slo", "ttft:2000"]) == 0
    text = capsys.readouterr().out
    assert "ILLUSTRATIVE" in text and "decode_gap_p95_ms" in text
    data = json.loads(out.read_text())
    assert data["metrics"]["completed"] == 8 and data["metrics"]["output_tokens"] == 256
    assert len(data["log"]["tokens"]) == 8
    # never overwritten unless asked
    assert main(["simulate", "--json-out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["simulate", "--json-out", str(out), "--overwrite"]) == 0


def test_smaller_budgets_cut_the_max_gap_and_cost_throughput(capsys):
    """The tiny-llm seed's trend, with the built-in profile shaped like its M4 Pro run."""
    from sim.commands.common import cost_from_args
    import argparse
    import policies
    from sim.metrics import score
    from sim.replay import simulate
    from traces.generators import tinyllm
    _, cost = cost_from_args(argparse.Namespace(profile=None, model=None, force=False))
    rows = [score(simulate(tinyllm(), policies.make("chunked", b, 4), cost)) for b in (32, 128, 512)]
    gaps = [r["decode_gap_max_ms"] for r in rows]
    tput = [r["output_tok_s"] for r in rows]
    assert gaps[0] < gaps[1] < gaps[2]
    assert tput[0] < tput[1] < tput[2]


def test_traces_gen_then_simulate_file(tmp_path, capsys):
    f = tmp_path / "t.jsonl"
    assert main(["traces", "gen", "poisson", "--num-requests", "20", "--rate", "2", "-o", str(f)]) == 0
    assert main(["simulate", "--trace", str(f), "--policy", "eager"]) == 0
    assert "20 requests" in capsys.readouterr().out


def test_policies_lists_every_policy(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    for name in ("fifo", "eager", "chunked", "--budget", "--batch-size", "--decode", "--order"):
        assert name in out


@pytest.mark.parametrize("args, needle", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--budget", "0"], "--budget: must be >= 1"),
    (["--batch-size", "0"], "--batch-size: must be >= 1"),
    (["--trace", "/no/such/file.jsonl"], "neither a file nor a generator"),
    (["--profile", "/no/such/profile.json"], "no such file"),
    (["--slo", "ttft=5"], "expected KEY:MS"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    code, out, err = run_cli("simulate", *args)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_malformed_trace_and_profile(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "arrival": 0, "prompt_len": 10, "output_len": 4}\n'
                   '{"id": "1", "arrival": 1, "prompt_len": -3, "output_len": 4}\n')
    code, _, err = run_cli("simulate", "--trace", str(bad))
    assert code == 2 and "line 2" in err and "prompt length" in err and "Traceback" not in err
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"model": {"name": "x"}, "device": {}, "cost": {"prefill": {"coef": [1, 2, 3]}}}))
    code, _, err = run_cli("simulate", "--profile", str(prof))
    assert code == 2 and "cost.decode.coef" in err and "Traceback" not in err
    code, _, err = run_cli("simulate", "--model", "qwen3-8b")
    assert code == 2 and "not 'qwen3-8b'" in err


def test_explicit_settings_parse_and_fail_clearly():
    import argparse
    from sim.commands.common import add_policy_args, settings_from_args
    p = argparse.ArgumentParser()
    add_policy_args(p, many=True)
    a = p.parse_args(["--setting", "fifo", "eager", "chunked:budget=32,order=decode-first", "--decode", "single"])
    assert settings_from_args(a) == [
        {"policy": "fifo", "budget": None, "batch_size": 4, "decode": "single", "order": "chunk-first"},
        {"policy": "eager", "budget": None, "batch_size": 4, "decode": "single", "order": "chunk-first"},
        {"policy": "chunked", "budget": 32, "batch_size": 4, "decode": "single", "order": "decode-first"}]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        settings_from_args(p.parse_args(["--setting", "chunked:size=3"]))
    with pytest.raises(ValueError, match="whole number"):
        settings_from_args(p.parse_args(["--setting", "chunked:budget=x"]))

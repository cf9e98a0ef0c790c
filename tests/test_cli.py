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
    assert data["metrics"]["completed"] == 8 and data["metrics"]["total_output_tokens"] == 256
    assert "log" not in data and data["log_file"] is None  # the event log only when asked, in its own file
    # never overwritten unless asked
    assert main(["simulate", "--json-out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["simulate", "--json-out", str(out), "--overwrite"]) == 0
    log = tmp_path / "run.npz"
    assert main(["simulate", "--json-out", str(out), "--overwrite", "--log-out", str(log)]) == 0
    from sim.metrics.logfile import read_log
    meta, events = read_log(log)
    assert len(events.tokens) == 8 and sum(map(len, events.tokens.values())) == 256
    assert json.loads(out.read_text())["log_file"] == str(log) and meta["metrics"]["completed"] == 8


def test_smaller_budgets_cut_the_max_gap_and_cost_throughput(capsys):
    """The tiny-llm seed's trend, with the built-in profile shaped like its M4 Pro run."""
    from sim.commands.common import cost_from_args
    import argparse
    import policies
    from sim.metrics.scoring import score
    from sim.replay import simulate
    from traces.generators import tinyllm
    _, cost = cost_from_args(argparse.Namespace(profile=None, model=None, force=False))
    rows = [score(simulate(tinyllm(), policies.make("chunked", b, 4), cost)) for b in (32, 128, 512)]
    gaps = [r["decode_gap_max_ms"] for r in rows]
    tput = [r["output_throughput"] for r in rows]
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
    assert code == 2 and "line 2" in err and "prompt_len" in err and "Traceback" not in err
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"model": {"name": "x"}, "device": {}, "cost": {"prefill": {"coef": [1, 2, 3]}}}))
    code, _, err = run_cli("simulate", "--profile", str(prof))
    assert code == 2 and "cost.decode" in err and "Traceback" not in err
    code, _, err = run_cli("simulate", "--model", "qwen3-8b")
    assert code == 2 and "not 'qwen3-8b'" in err


def test_explicit_settings_parse_and_fail_clearly():
    import argparse
    from sim.commands.common import add_policy_args, settings_from_args
    p = argparse.ArgumentParser()
    add_policy_args(p, many=True)
    a = p.parse_args(["--setting", "fifo", "eager", "chunked:budget=32,order=decode-first", "--decode", "single"])
    assert settings_from_args(a) == [  # fifo decodes one request at a time: batch size 1
        {"policy": "fifo", "budget": None, "batch_size": 1, "decode": "single", "order": "chunk-first"},
        {"policy": "eager", "budget": None, "batch_size": 4, "decode": "single", "order": "chunk-first"},
        {"policy": "chunked", "budget": 32, "batch_size": 4, "decode": "single", "order": "decode-first"}]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        settings_from_args(p.parse_args(["--setting", "chunked:size=3"]))
    with pytest.raises(ValueError, match="whole number"):
        settings_from_args(p.parse_args(["--setting", "chunked:budget=x"]))


def test_an_internal_bug_is_a_traceback_not_an_input_error(monkeypatch):
    """Only input errors are one line and exit 2: a ValueError from pdsim's own code is a bug, and
    must reach the user (and the test run) with its traceback."""
    import sim.commands.simulate as cmd

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")
    monkeypatch.setattr(cmd, "simulate_scored", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["simulate"])


def test_an_internal_bug_prints_its_traceback(tmp_path):
    """The same in a fresh process: a policy that returns no work breaks an engine invariant."""
    script = tmp_path / "run.py"
    script.write_text("import sys, policies\n"
                      "from policies.chunked import Chunked\n"
                      "Chunked.schedule = lambda self, state: []\n"
                      "from sim.cli import main\n"
                      "sys.exit(main(['simulate']))\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" in p.stderr and "EngineError" in p.stderr


@pytest.mark.parametrize("args, needle", [
    (["simulate", "--trace", "tinyllm", "--rate", "2"], "--rate: does not apply to trace tinyllm"),
    (["simulate", "--trace", "metile", "--num-seqs", "3"], "--num-seqs: does not apply"),
    (["simulate", "--trace", "tinyllm", "--arrivals", "gamma"], "--arrivals: does not apply"),
    (["traces", "gen", "poisson", "--burstiness", "8", "-o", "{tmp}/p.jsonl"], "--burstiness: does not apply"),
    (["traces", "info", "poisson", "--burstiness", "8"], "--burstiness: does not apply"),
    (["sweep", "--trace", "tinyllm", "metile", "--rate", "2", "--no-progress"], "--rate: does not apply"),
])
def test_options_a_trace_ignores_are_refused(args, needle, tmp_path, capsys):
    """Every trace option is used or refused: `traces gen poisson --burstiness 8` used to give
    Poisson arrivals (CV^2 0.94), `--rate` on tinyllm did nothing."""
    assert main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "p.jsonl").exists()


def test_options_given_to_one_of_several_traces_and_to_files(tmp_path, capsys):
    f = tmp_path / "t.jsonl"
    assert main(["traces", "gen", "gamma", "--num-requests", "5", "--rate", "2", "--burstiness", "1/3",
                 "-o", str(f)]) == 0
    # a pdsim trace file takes no generator options, nor a seed unless it samples
    for extra in (["--num-requests", "9"], ["--rate", "3"], ["--seed", "1"]):
        capsys.readouterr()
        assert main(["simulate", "--trace", str(f), *extra]) == 2
        assert "does not apply" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(f), "--sample", "3", "--seed", "1"]) == 0
    # with several traces, each takes the options it has
    assert main(["sweep", "--trace", "tinyllm", "poisson", "--num-requests", "6", "--rate", "2",
                 "--policy", "eager", "--no-progress"]) == 0


def _strict_json(text: str):
    """JSON as JavaScript's JSON.parse reads it: no NaN, no Infinity."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_json_outputs_are_strict_with_null_for_undefined(tmp_path, capsys):
    """A figure a run cannot measure (one request: no resumption gap) is null, never a bare NaN."""
    out = tmp_path / "one.json"
    assert main(["simulate", "--trace", "tinyllm", "--num-seqs", "1", "--json-out", str(out)]) == 0
    data = _strict_json(out.read_text())
    assert data["metrics"]["resume_gap_max_ms"] is None and data["metrics"]["request_goodput"] is None
    # evenly spaced arrivals: CV^2 0, infinite burstiness; undefined gaps with one request
    trace = tmp_path / "even.jsonl"
    trace.write_text("".join(json.dumps({"id": str(i), "arrival": float(i), "prompt_len": 4, "output_len": 2}) + "\n"
                             for i in range(4)))
    capsys.readouterr()
    assert main(["traces", "info", str(trace), "--json"]) == 0
    stats = _strict_json(capsys.readouterr().out)["stats"]
    assert stats["cv2"] == 0 and stats["burstiness"] is None
    assert main(["sweep", "--trace", "tinyllm", "--num-seqs", "1", "--policy", "eager", "--no-progress",
                 "-o", str(tmp_path / "sw")]) == 0
    rows = _strict_json((tmp_path / "sw" / "results.json").read_text())["rows"]
    assert rows[0]["resume_gap_max_ms"] is None


def test_metrics_command_lists_the_registry(capsys):
    from sim.metrics.registry import METRICS
    assert main(["metrics"]) == 0
    out = capsys.readouterr().out
    for name, m in METRICS.items():
        assert f"{name}  [{m.unit}" in out
    assert "alias output_tok_s" in out and "lower is better" in out

"""Every input issue 12 reproduced as a traceback, as the wrong words, or accepted silently: one
line naming the input and the problem, exit code 2 (`pdsim` in this process: `main`)."""
import json
import os

import pytest

from cli_checks import refused
from sim.cli import main
from sim.cost.profile import BUILTIN

PROFILE = json.loads(BUILTIN.read_text()) if hasattr(BUILTIN, "read_text") else json.load(open(BUILTIN))
ROW = {"id": "a", "arrival": 0, "prompt_len": 5, "output_len": 3}


def jsonl(tmp_path, text: str, name: str = "t.jsonl"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def profile(tmp_path, change, name="p.json"):
    doc = json.loads(json.dumps(PROFILE))
    change(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


# ---- tracebacks that are now one line ----------------------------------------------------------

def test_a_csv_field_over_128_kib(tmp_path, capsys):
    path = jsonl(tmp_path, 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,"' + "1" * 200_000
                 + '",44\n', "big.csv")
    refused(["simulate", "--trace", path], capsys, path, "line 2", "field larger")


@pytest.mark.parametrize("field", ["prompt_len", "arrival", "output_len"])
def test_infinity_in_pdsim_jsonl(tmp_path, capsys, field):
    path = jsonl(tmp_path, json.dumps(ROW).replace(f'"{field}": {ROW[field]}', f'"{field}": Infinity') + "\n")
    refused(["simulate", "--trace", path], capsys, path, "Infinity is not a JSON value")


def test_deeply_nested_json_in_a_trace_and_a_profile(tmp_path, capsys):
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    path = jsonl(tmp_path, deep + "\n")
    refused(["simulate", "--trace", path], capsys, path, "nested too deeply")
    prof = jsonl(tmp_path, deep, "p.json")
    refused(["simulate", "--profile", prof], capsys, prof, "nested too deeply")


@pytest.mark.parametrize("command", ["info", "convert"])
def test_a_prompt_of_1e18_tokens_is_refused_where_the_trace_is_read(tmp_path, capsys, command):
    path = jsonl(tmp_path, json.dumps(dict(ROW, prompt_len=10**18)) + "\n")
    extra = ["-o", str(tmp_path / "o.jsonl")] if command == "convert" else []
    refused(["traces", command, path, *extra], capsys, path, "larger than any model's context")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_trace_and_profile(tmp_path, capsys):
    path = jsonl(tmp_path, json.dumps(ROW) + "\n")
    os.chmod(path, 0)
    refused(["simulate", "--trace", path], capsys, path, "permission denied")
    prof = profile(tmp_path, lambda d: None)
    os.chmod(prof, 0)
    refused(["simulate", "--profile", prof], capsys, prof, "permission denied")


@pytest.mark.parametrize("change, needle", [
    (lambda d: d.__setitem__("model", 5), "'model' must be a JSON object"),
    (lambda d: d.__setitem__("device", "cpu"), "'device' must be a JSON object"),
    (lambda d: d.__setitem__("cost", [1, 2]), "'cost' must be a JSON object"),
    (lambda d: d["cost"]["prefill"].__setitem__("use", "grid"), "cost.prefill.grid"),
    (lambda d: d["cost"]["prefill"]["coef"].__setitem__(0, -1.0), "must be >= 0"),  # was "time went backwards"
    (lambda d: d["model"].__setitem__("max_context", 0.5), "max_context"),
    (lambda d: d["cost"].__setitem__("gather", -4e-5), "cost.gather"),
    (lambda d: d["cost"].__setitem__("fresh_step", "fast"), "cost.fresh_step"),
    (lambda d: d["cost"].__setitem__("grow", -1.0), "cost.grow"),
    (lambda d: d["cost"].__setitem__("grow_single", -4.5e-4), "cost.grow_single"),
    (lambda d: d["cost"].__setitem__("mlx_lm", {"prompt": {"coef": [0, 0, 0, 0]}, "generate": {"coef": [0, 0, 0, 0]},
                                                "host": {"decode": 1e-3}}), "cost.mlx_lm.host.decode"),
    (lambda d: d["cost"].__setitem__("mlx_lm", {"prompt": {"coef": [0, 0, 0, 0]}, "generate": {"coef": [0, 0, 0, 0]},
                                                "host": {"generate": 1e-3}, "tail": {"generate": -0.1}}),
     "cost.mlx_lm.tail.generate"),
    (lambda d: d.__setitem__("grid", {"chunks": [8], "offsets": [0], "batches": [1], "contexts": [10],
                                      "mixed": [], "prompt_max": 0}), "grid.prompt_max"),
    (lambda d: d.__setitem__("engine_runs", [{  # a calibration's speed probes, damaged
        "name": "w", "part": "train", "setting": {}, "trace": {"requests": []},
        "log": {"requests": [], "calls": [], "tokens": {}},
        "probe": {"setting": {}, "trace": {"requests": []}, "logs": [{"requests": []}]}}]),
     "engine_runs[0].probe.logs[0].calls"),
    (lambda d: d.__setitem__("engine_runs", [{  # a probe's allocation time, negative
        "name": "w", "part": "train", "setting": {}, "trace": {"requests": []},
        "log": {"requests": [], "calls": [], "tokens": {}},
        "probe": {"setting": {}, "trace": {"requests": []}, "logs": [], "alloc_s": [0.1, -0.1],
                  "alloc_bytes": 64 << 20}}]),
     "engine_runs[0].probe.alloc_s[1]"),
])
def test_profile_fields_of_the_wrong_type_or_value(tmp_path, capsys, change, needle):
    prof = profile(tmp_path, change)
    refused(["simulate", "--profile", prof], capsys, prof, needle)


def test_nan_coefficients_are_refused(tmp_path, capsys):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(PROFILE).replace('"coef": [', '"coef": [NaN, ', 1))
    refused(["simulate", "--profile", str(prof)], capsys, str(prof), "NaN is not a JSON value")


def test_refit_with_samples_that_are_not_a_list(tmp_path, capsys):
    prof = profile(tmp_path, lambda d: d.__setitem__("samples", "none"))
    refused(["calibrate", "--refit", prof, "-o", str(tmp_path / "o.json")], capsys, prof, "'samples' must be a list")


def test_add_rounds_to_samples_without_times(tmp_path, capsys):
    prof = profile(tmp_path, lambda d: d.update(
        samples=[{"step": "prefill", "key": "p1", "seconds": 0.1, "chunk": 8, "prefix": 0}],
        grid={"chunks": [8], "offsets": [0], "batches": [1], "contexts": [8], "repeats": 1}))
    refused(["calibrate", "--add-rounds", prof, "-o", str(tmp_path / "o.json")], capsys, prof, "no 'times'")


def test_rescore_given_a_profile(tmp_path, capsys):
    refused(["confirm", "--rescore", str(BUILTIN), "--profile", str(BUILTIN), "-o", str(tmp_path / "r.json")],
            capsys, str(BUILTIN), "a profile, not a confirm report")


def test_outputs_onto_a_directory_or_under_a_file(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    refused(["simulate", "--json-out", str(tmp_path / "d"), "--overwrite"], capsys, "is a directory")
    (tmp_path / "f").write_text("x")
    refused(["simulate", "--json-out", str(tmp_path / "f" / "x.json")], capsys, "is a file, not a folder")
    refused(["sweep", "-o", str(tmp_path / "f" / "x"), "--budget", "32"], capsys, "is a file, not a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_output_into_a_read_only_folder(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    refused(["simulate", "--json-out", str(ro / "x.json")], capsys, "permission denied")


@pytest.mark.parametrize("args, needle", [
    (["simulate", "--trace", "gamma", "--burstiness", "inf"], "--burstiness"),
    (["simulate", "--trace", "poisson", "--rate", "inf"], "--rate"),
    (["sweep", "--rate-scale", "inf"], "--rate-scale"),
    (["sweep", "--slo", "ttft:nan"], "ttft:nan"),
    (["simulate", "--slo", "ttft:nan"], "ttft:nan"),
    (["calibrate", "--batches", "1e20"], "--batches"),
    (["simulate", "--num-seqs", "1e20"], "--num-seqs"),
    (["confirm", "--warmup", "1e20"], "--warmup"),
])
def test_numbers_past_any_sense(capsys, args, needle):
    refused(args, capsys, needle)


# ---- the right words ---------------------------------------------------------------------------

@pytest.mark.parametrize("data", [bytes(range(256)), '{"id": "é"}\n'.encode("latin-1")])
def test_a_binary_or_latin1_trace_names_its_file(tmp_path, capsys, data):
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    refused(["simulate", "--trace", str(path)], capsys, str(path), "not UTF-8")


def test_a_directory_fifo_or_device_is_not_called_missing(tmp_path, capsys):
    refused(["simulate", "--trace", str(tmp_path)], capsys, "is a directory")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(["simulate", "--trace", str(fifo)], capsys, "FIFO")
    refused(["simulate", "--trace", "/dev/zero"], capsys, "a device")
    refused(["simulate", "--profile", "/dev/zero"], capsys, "a device")


def test_a_converted_trace_names_itself_not_the_csv_it_came_from(tmp_path, capsys):
    csv = tmp_path / "a.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
                   "2023-11-16 18:15:47.68,375,45\n")
    out = tmp_path / "a.jsonl"
    assert main(["traces", "convert", str(csv), "-o", str(out)]) == 0
    capsys.readouterr()
    out.write_text(out.read_text().replace('"prompt_len": 375', '"prompt_len": -5'))
    err = refused(["simulate", "--trace", str(out)], capsys, str(out), "line 3", "negative prompt_len")
    assert "a.csv" not in err


# ---- accepted silently before ------------------------------------------------------------------

@pytest.mark.parametrize("value, needle", [("3.5", "not a whole number"), ("true", "must be a whole number, got true"),
                                           ('"12"', "must be a whole number")])
def test_pdsim_jsonl_counts_are_whole_numbers_as_in_the_csvs(tmp_path, capsys, value, needle):
    path = jsonl(tmp_path, json.dumps(ROW).replace('"prompt_len": 5', f'"prompt_len": {value}') + "\n")
    refused(["simulate", "--trace", path], capsys, path, needle)


def test_a_bom_is_accepted_in_every_format(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("\ufeff" + json.dumps(ROW) + "\n")
    assert main(["simulate", "--trace", str(path)]) == 0
    csv = tmp_path / "t.csv"
    csv.write_text("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n")
    assert main(["simulate", "--trace", str(csv)]) == 0


def test_a_trace_longer_than_the_profiles_model_holds(tmp_path, capsys):
    path = jsonl(tmp_path, json.dumps(dict(ROW, prompt_len=200_000)) + "\n")
    prof = profile(tmp_path, lambda d: d["model"].__setitem__("max_context", 4096))
    for command in ("simulate", "sweep"):
        refused([command, "--trace", path, "--profile", prof], capsys, path, "holds 4,096")


def test_a_profile_for_another_device_is_refused_when_asked(tmp_path, capsys):
    prof = profile(tmp_path, lambda d: d["device"].__setitem__("id", "cpu:Other:2:GENERIC"))
    refused(["simulate", "--profile", prof, "--device", "cpu:Mine:2:SKYLAKEX"], capsys, "cpu:Other")


@pytest.mark.parametrize("slo, needle", [("bogus", "expected METRIC<=X"), ("no_such_metric<=5", "no_such_metric"),
                                          ("decode_gap_p95_ms<=abc", "not a number")])
def test_tune_checks_its_slo_before_any_work(tmp_path, capsys, slo, needle):
    out = tmp_path / "tune"
    refused(["tune", "--slo", slo, "-o", str(out)], capsys, "--slo", needle)
    assert not out.exists()  # refused before the calibration and before its output folder


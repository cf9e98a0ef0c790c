"""Never a wrong report: resumes prove they resume the same work, output folders hold one run's
files, partial files survive a torn line, outputs keep their modes, arguments are checked first.

Each test reproduces an item of issue 12 that failed before its fix."""
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.cli import main
from sim.cost.profile import BUILTIN, load_profile
from sim.core.errors import UserError
from sim.core.files import ExistsError, OutputError, atomic_write_json, check_output
from traces.generators import tinyllm

SWEEP = ["sweep", "--trace", "tinyllm", "--num-seqs", "6", "--policy", "chunked", "--no-progress", "--workers", "1"]


def exit_code(args: list[str]) -> int:
    """`main`'s exit code, a usage error (SystemExit from argparse) included."""
    try:
        return main(args)
    except SystemExit as e:
        return e.code


def pdsim(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "sim.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


# ---- a resumed confirm or calibration proves it resumes the same work --------------------------

def _manifest(trace, settings=None, repeats=2, warmup=1, cooldown=0.0, prof=None):
    from calibrate.confirm.runs import runs_manifest
    settings = settings or [{"policy": "chunked", "budget": 32, "batch_size": 2, "decode": "batched",
                             "order": "chunk-first"}]
    return runs_manifest(prof or load_profile(BUILTIN), trace, settings, repeats, warmup, cooldown)


def test_a_confirm_resume_with_other_inputs_is_refused(tmp_path):
    """The issue's case: interrupted after 2 runs on an 8-request trace, resumed with 4 requests."""
    from calibrate.confirm.runs import RunsFolder
    runs = tmp_path / "conf.json.runs"
    old = tinyllm(num_seqs=8)
    with RunsFolder(runs, _manifest(old)):
        (runs / "r0-0.json").write_text(json.dumps({"log": {}, "setting": {}}))
    with RunsFolder(runs, _manifest(old)):  # the same work resumes
        pass
    cases = {"trace": _manifest(tinyllm(num_seqs=4, min_in=16, max_in=64)),
             "settings": _manifest(old, [{"policy": "chunked", "budget": 64, "batch_size": 2, "decode": "batched",
                                          "order": "chunk-first"}]),
             "protocol": _manifest(old, repeats=3),
             "profile": _manifest(old, prof=dict(load_profile(BUILTIN), created="another day"))}
    for what, manifest in cases.items():
        with pytest.raises(UserError, match=f"other work.*{what}") as e:
            with RunsFolder(runs, manifest):
                pass
        assert str(runs) in str(e.value) and "\n" not in str(e.value)


def test_runs_without_a_record_of_their_work_are_not_reused(tmp_path):
    from calibrate.confirm.runs import RunsFolder
    runs = tmp_path / "conf.json.runs"
    runs.mkdir()
    (runs / "r0-0.json").write_text("{}")  # runs an older pdsim left, with no manifest
    with pytest.raises(UserError, match="no record of what they measured"):
        with RunsFolder(runs, _manifest(tinyllm(num_seqs=8))):
            pass


def test_a_run_file_of_another_setting_is_refused_and_a_torn_one_measured_again(tmp_path, capsys):
    from calibrate.confirm.runs import finished_run
    s = {"policy": "chunked", "budget": 32}
    path = tmp_path / "r0.json"
    path.write_text(json.dumps({"log": {}, "setting": {"policy": "chunked", "budget": 64}, "trace_sha256": "x"}))
    with pytest.raises(UserError, match="another setting or trace"):
        finished_run(path, s, "x")
    path.write_text('{"log": {"calls"')  # interrupted as it was written
    assert finished_run(path, s, "x") is None and "measuring that run again" in capsys.readouterr().out
    path.write_text("")
    assert finished_run(path, s, "x") is None
    # BatchGenerator timed synchronized (an older profile) is not a pipelined run (`calibrate.engine.batchgen`)
    mlx = {"policy": "mlx-lm", "prefill_step": 32}
    path.write_text(json.dumps({"log": {"calls": []}, "setting": mlx, "trace_sha256": "x"}))
    assert finished_run(path, mlx, "x")["setting"] == mlx
    with pytest.raises(UserError, match="a run timed synchronized"):
        finished_run(path, mlx, "x", pipelined=True)


def test_two_confirms_cannot_share_a_runs_folder(tmp_path):
    from calibrate.confirm.runs import RunsFolder
    m = _manifest(tinyllm(num_seqs=8))
    with RunsFolder(tmp_path / "r", m):
        with pytest.raises(UserError, match="another pdsim confirm"):
            with RunsFolder(tmp_path / "r", m):
                pass


# ---- partial results: a torn last line, an empty file, a header of other work ------------------

def test_a_torn_last_line_keeps_every_measurement(tmp_path):
    """A crash mid-write used to glue the next measurement to the fragment, and the following
    resume dropped it: 10 measured, 9 kept."""
    from calibrate.measure.journal import Journal
    path, head = tmp_path / "p.partial.jsonl", {"model": "m", "grid": [1, 2]}
    with Journal(path, head) as j:
        for i in range(9):
            j.append({"key": f"k{i}", "round": 0})
    with open(path, "a") as f:
        f.write('{"key": "k9", "rou')  # killed mid-write
    with Journal(path, head) as j:
        assert len(j.records) == 9
        j.append({"key": "k9", "round": 0})  # measured again after the resume
    with Journal(path, head) as j:
        assert [r["key"] for r in j.records] == [f"k{i}" for i in range(10)]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_a_line_glued_by_an_older_pdsim_is_recovered(tmp_path):
    from calibrate.measure.journal import Journal
    path, head = tmp_path / "p.partial.jsonl", {"model": "m"}
    path.write_text(json.dumps(head) + "\n" + '{"key": "a", "round": 0}\n' + '{"key": "b", "ro{"key": "c", "round": 0}\n')
    with Journal(path, head) as j:
        assert [r["key"] for r in j.records] == ["a", "c"]


@pytest.mark.parametrize("content", ["", '{"model": "m", "gr'])
def test_an_empty_partial_or_a_torn_header_starts_afresh(tmp_path, content):
    """A 0-byte partial used to be 'partial results of a different calibration'; a torn header a bare JSON error."""
    from calibrate.measure.journal import Journal
    path, head = tmp_path / "p.partial.jsonl", {"model": "m", "grid": [1]}
    path.write_text(content)
    with Journal(path, head) as j:
        assert j.records == []
        j.append({"key": "a", "round": 0})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [head, {"key": "a", "round": 0}]


def test_a_partial_of_other_work_or_not_ours_is_refused_in_one_line(tmp_path):
    from calibrate.measure.journal import Journal
    path = tmp_path / "p.partial.jsonl"
    with Journal(path, {"model": "m", "seed": 0}):
        pass
    with pytest.raises(UserError, match=r"different calibration \(seed differ") as e:
        with Journal(path, {"model": "m", "seed": 1}):
            pass
    assert "\n" not in str(e.value)
    path.write_text("garbage\n")
    with pytest.raises(UserError, match="not a partial-results header"):
        with Journal(path, {"model": "m"}):
            pass


def test_two_calibrations_cannot_append_to_one_partial(tmp_path):
    from calibrate.measure.journal import Journal
    path = tmp_path / "p.partial.jsonl"
    with Journal(path, {"model": "m"}):
        with pytest.raises(UserError, match="another pdsim is measuring"):
            with Journal(path, {"model": "m"}):
                pass


# ---- an output folder holds one run's files ----------------------------------------------------

def test_two_sweeps_to_one_folder_never_mix(tmp_path):
    """Two sweeps at once: one writes, the other is refused at once (it used to replace the
    first, or leave results.csv of one beside results.json of the other)."""
    from sim.core.outdir import file_sha256
    out = tmp_path / "sw"
    for trial in range(2):
        extra = ["--overwrite"] if trial else []
        a = pdsim(*SWEEP, "--budget", "32", "-o", str(out), *extra)
        b = pdsim(*SWEEP, "--budget", "64", "-o", str(out), *extra)
        (ca, oa, ea), (cb, ob, eb) = [(p.wait(120), p.stdout.read(), p.stderr.read()) for p in (a, b)]
        assert sorted([ca, cb]) in ([0, 0], [0, 2]), (ea, eb)
        wrote = [o for c, o in ((ca, oa), (cb, ob)) if c == 0]
        for c, e in ((ca, ea), (cb, eb)):
            if c == 2:
                assert ("another pdsim" in e or "exists" in e) and e.count("\n") == 1, e
        doc = json.loads((out / "results.json").read_text())
        assert doc["digests"]["results.csv"] == file_sha256(out / "results.csv")
        budgets = {r["budget"] for r in doc["rows"]}
        assert len(budgets) == 1 and f"b{budgets.pop()}" in (out / "results.csv").read_text()
        assert wrote


def test_a_locked_folder_refuses_a_second_writer(tmp_path):
    from sim.core.outdir import OutputFolder
    with OutputFolder(tmp_path / "o", ["results.json"]):
        with pytest.raises(OutputError, match=f"another pdsim \\(pid {os.getpid()}\\)"):
            with OutputFolder(tmp_path / "o", ["results.json"], overwrite=True):
                pass


def test_overwrite_replaces_the_whole_set_and_keeps_modes(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(SWEEP + ["--budget", "32", "64", "-o", str(out), "--logs", "2"]) == 0
    old_logs = sorted(p.name for p in (out / "logs").iterdir())
    os.chmod(out / "results.csv", 0o640)
    assert main(SWEEP + ["--budget", "16", "-o", str(out), "--overwrite"]) == 0
    assert not (out / "logs").exists() and len(old_logs) == 2  # no log of the old run beside the new results
    assert stat.S_IMODE(os.stat(out / "results.csv").st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_a_failed_sweep_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "new"
    assert main(SWEEP + ["--budget", "32", "--trace", "/no/such.jsonl", "-o", str(out)]) == 2
    assert not out.exists()


# ---- modes, inputs as outputs ------------------------------------------------------------------

def test_new_outputs_follow_the_umask_and_overwrite_keeps_the_old_mode(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o640
        os.umask(0o022)
        atomic_write_json(tmp_path / "b.json", {"x": 1})
        assert stat.S_IMODE(os.stat(tmp_path / "b.json").st_mode) == 0o644
        os.chmod(tmp_path / "b.json", 0o664)
        atomic_write_json(tmp_path / "b.json", {"x": 2}, overwrite=True)
        assert stat.S_IMODE(os.stat(tmp_path / "b.json").st_mode) == 0o664
    finally:
        os.umask(old)


def test_cli_outputs_are_not_0600(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        out = tmp_path / "t.jsonl"
        assert main(["traces", "gen", "tinyllm", "--num-seqs", "3", "-o", str(out)]) == 0
        assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
        os.chmod(out, 0o660)
        assert main(["traces", "gen", "tinyllm", "--num-seqs", "4", "-o", str(out), "--overwrite"]) == 0
        assert stat.S_IMODE(os.stat(out).st_mode) == 0o660
    finally:
        os.umask(old)


def test_an_output_equal_to_an_input_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    tinyllm(num_seqs=3).save_jsonl(trace)
    before = trace.read_text()
    for args in (["traces", "convert", str(trace), "-o", str(trace), "--overwrite"],
                 ["simulate", "--trace", str(trace), "--json-out", str(trace), "--overwrite"]):
        assert main(args) == 2
        assert "is also an input" in capsys.readouterr().err
    assert trace.read_text() == before


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: None, "is a file, not a folder"),
])
def test_outputs_onto_a_folder_or_under_a_file(tmp_path, make, words):
    if words == "is a directory":
        target = tmp_path / "d"
        make(target)
        with pytest.raises(OutputError, match=words):
            check_output(target, overwrite=True)
    else:
        (tmp_path / "f").write_text("x")
        with pytest.raises(OutputError, match=words):
            check_output(tmp_path / "f" / "out.json")


# ---- every argument checked before the first second of work ------------------------------------

def test_sweep_onto_an_existing_file_is_refused_before_it_runs(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("x")
    t0 = time.perf_counter()
    assert main(SWEEP + ["--budget", "32", "-o", str(out)]) == 2
    cap = capsys.readouterr()
    assert "is a file, not a folder" in cap.err and "sweep:" not in cap.out and time.perf_counter() - t0 < 5


@pytest.mark.parametrize("value", ["inf", "-1", "nan"])
def test_confirm_cooldown_is_checked_before_any_run(value, capsys):
    assert exit_code(["confirm", "--profile", str(BUILTIN), "--cooldown", value, "-o", "/nonexistent/r.json"]) == 2
    err = capsys.readouterr().err
    assert "--cooldown" in err and err.count("\n") == 1


@pytest.mark.parametrize("args", [["confirm", "--warmup", "1e20"], ["confirm", "--repeats", "100000"],
                                  ["calibrate", "--batches", "1e20"], ["calibrate", "--offsets", "-1"],
                                  ["simulate", "--num-seqs", "1e20"]])
def test_counts_past_any_sense_are_refused_by_the_parser(args, capsys):
    assert exit_code(args) == 2
    err = capsys.readouterr().err
    assert "error: argument" in err and err.count("\n") == 1


def test_ctrl_c_while_the_commands_are_imported_is_exit_130(monkeypatch, capsys):
    import importlib
    real = importlib.import_module

    def interrupted(name, *a):
        if name.startswith("sim.commands."):
            raise KeyboardInterrupt
        return real(name, *a)
    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert main(["simulate"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_a_report_refuses_a_sweep_folder_whose_files_do_not_belong_together(tmp_path, capsys):
    from sim.report.sources import ReportError, load_sweep
    out = tmp_path / "sw"
    assert main(SWEEP + ["--budget", "32", "64", "-o", str(out), "--logs", "1"]) == 0
    load_sweep(out)
    (out / "results.csv").write_text((out / "results.csv").read_text().replace("32", "33"))  # another sweep's
    with pytest.raises(ReportError, match="results.csv does not belong to its results.json"):
        load_sweep(out)


def test_a_refused_partial_is_left_as_it_was(tmp_path):
    from calibrate.measure.journal import Journal
    path = tmp_path / "p.partial.jsonl"
    path.write_text('{"model": "other"}\n{"key": "a", "round": 0}\n{"key": "b", "ro')
    before = path.read_bytes()
    with pytest.raises(UserError, match="different calibration"):
        with Journal(path, {"model": "m"}):
            pass
    assert path.read_bytes() == before

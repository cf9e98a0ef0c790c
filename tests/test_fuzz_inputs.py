"""No input makes a command print a traceback: trace rows in every supported format and profile
documents, drawn by hypothesis, are read (and, where accepted, simulated) or refused in one line
that names the file (exit 2)."""
import contextlib
import csv
import io
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.cost.profile import BUILTIN

PROFILE = json.loads(Path(BUILTIN).read_text())
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

numbers = st.one_of(st.integers(-5, 3000), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, 0.5, 1e18, -1, 2**24, 2**24 + 1]))
scalars = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=8))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=2))

CSV_HEADERS = {
    "azure": ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
    "burstgpt": ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"],
    "vidur": ["arrived_at", "num_prefill_tokens", "num_decode_tokens"],
    "lengths": ["num_prefill_tokens", "num_decode_tokens"],
}
JSON_FIELDS = {
    "pdsim": ["id", "arrival", "prompt_len", "output_len", "prefilled", "prompt_ids", "hash_ids"],
    "mooncake": ["timestamp", "input_length", "output_length", "hash_ids"],
}
csv_fields = st.one_of(numbers.map(str), st.text(max_size=12),
                       st.sampled_from(["2023-11-16 18:15:46.6805900", "2024-05-10 00:00:01.5+00:00", "", "nan",
                                        "inf", "1e400", "ChatGPT", "Conversation log", "-0"]))


def run(args: list[str]) -> tuple[int, str]:
    """`pdsim args` in this process: (exit code, stderr). Any exception but a usage exit fails the test."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(args)
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def check(path: Path, fmt: str | None = None) -> None:
    extra = ["--format", fmt] if fmt else []
    code, err = run(["traces", "info", str(path), *extra])
    assert code in (0, 2), err
    if code == 2:
        assert str(path) in err and err.count("\n") == 1 and "Traceback" not in err, err
        return
    code, err = run(["simulate", "--trace", str(path), *extra, "--max-prompt", "64", "--max-output", "8",
                     "--first", "20", "--policy", "chunked", "--budget", "32"])
    assert code in (0, 2), err
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, err


@FUZZ
@given(fmt=st.sampled_from(sorted(CSV_HEADERS)), rows=st.lists(st.lists(csv_fields, min_size=0, max_size=7),
                                                                 max_size=6),
       header_ok=st.booleans(), bom=st.booleans())
def test_csv_rows_never_crash(fmt, rows, header_ok, bom):
    header = CSV_HEADERS[fmt] if header_ok else CSV_HEADERS[fmt][:-1] + ["junk"]
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(header)
    for r in rows:
        w.writerow(r)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"t-{fmt}.csv"
        path.write_text(("\ufeff" if bom else "") + text.getvalue())
        check(path, fmt)
        check(path)  # detected


@FUZZ
@given(fmt=st.sampled_from(sorted(JSON_FIELDS)), data=st.data(), torn=st.booleans())
def test_json_rows_never_crash(fmt, data, torn):
    fields = JSON_FIELDS[fmt]
    rows = data.draw(st.lists(st.dictionaries(st.sampled_from(fields + ["x"]), values, max_size=len(fields) + 1),
                              max_size=5))
    lines = [json.dumps(r, allow_nan=True) for r in rows]
    if fmt == "pdsim" and data.draw(st.booleans()):
        lines.insert(0, json.dumps({"meta": data.draw(values), "sha256": data.draw(values)}))
    text = "\n".join(lines) + "\n"
    if torn and text.strip():
        text = text[: data.draw(st.integers(1, len(text)))]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"t-{fmt}.jsonl"
        path.write_text(text)
        check(path, fmt)
        check(path)


def _paths(doc, prefix=()):
    """Every (path, value) of a JSON document, to pick one to break."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p, _ in _paths(PROFILE) if p]


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(PATHS), st.one_of(values, st.just("<delete>"))), min_size=1,
                        max_size=3))
def test_profile_documents_never_crash(changes):
    doc = json.loads(json.dumps(PROFILE))
    for path, value in changes:
        node = doc
        try:
            for key in path[:-1]:
                node = node[key]
            if value == "<delete>":
                del node[path[-1]]
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed or replaced the parent
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.json"
        path.write_text(json.dumps(doc, allow_nan=True))
        code, err = run(["simulate", "--profile", str(path), "--num-seqs", "3", "--min-out", "4", "--max-out", "8"])
        assert code in (0, 2), err
        if code == 2:
            assert str(path) in err and err.count("\n") == 1 and "Traceback" not in err, err

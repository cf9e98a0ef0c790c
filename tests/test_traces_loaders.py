"""Public trace loaders, detection, shaping, `traces info/convert`, and one-line errors on bad input.

The public files are read from ../shared/traces/ (not part of the repository); tests that need them
skip when that folder is absent. Azure 2024, BurstGPT and Vidur/Splitwise samples are small files
written here into tmp_path.
"""
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from sim.cli import main as cli
from traces import shape
from traces.formats import arrival_times, detect, format_name, read
from traces.generators import gamma
from traces.load import load_file, resolve
from traces.shape import Shaping
from traces.stats import describe
from traces.trace import Request, Trace, TraceError

SHARED = Path(__file__).parents[1] / ".." / "shared" / "traces"
CODE = SHARED / "azure-2023" / "AzureLLMInferenceTrace_code.csv"
CONV = SHARED / "azure-2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = SHARED / "mooncake" / "synthetic_trace.jsonl"
ARXIV = SHARED / "vidur" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"


def shared(path: Path) -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"public traces folder {SHARED.resolve()} is absent")
    if not path.is_file():
        pytest.skip(f"public trace {path.name} is absent from {SHARED.resolve()}")
    return path


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00+00:00,100,10
2024-05-10 00:00:00.009930+00:00,200,20
2024-05-10 00:00:01.500000+00:00,300,0
2024-05-10 00:01:00+00:00,400,40
"""

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,30,447,Conversation log
200,ChatGPT,99,12,111,API log
233.5,ChatGPT,0,7,7,Conversation log
"""

BURSTGPT_NEW = """Timestamp,Session ID,Model,Request tokens,Response tokens,Total tokens,Log Type,Elapsed time
10,s1,GPT-4,100,5,105,API log,1.2
12,s1,GPT-4,200,6,206,API log,0.8
"""

VIDUR = """arrived_at,num_prefill_tokens,num_decode_tokens
0.0,374,44
4.314579,396,109
4.541877,879,55
5.8926549999999995,91,16
"""


# ---------------------------------------------------------------------------------------------
# The public files in ../shared/traces/

def test_azure_2023_code_rows_and_first_request():
    t = load_file(shared(CODE))
    assert len(t) == 8819
    r0 = t.requests[0]
    assert (r0.id, r0.arrival, r0.prompt_len, r0.output_len) == ("0", 0.0, 4808, 10)
    assert t.requests[1].arrival == pytest.approx(0.052)  # 18:17:04.0319600 - 18:17:03.9799600
    assert (t.requests[1].prompt_len, t.requests[1].output_len) == (3180, 8)
    assert t.meta["format"] == "azure" and t.meta["rows_read"] == 8819 and t.meta["read_to_end"]
    s = describe(t)
    assert (s.prompt.p50, s.prompt.max, s.output.p50) == (1469, 7437, 13)  # the README's figures


def test_azure_2023_conv_matches_readme_and_vidur_processed_copy():
    t = load_file(shared(CONV))
    assert len(t) == 19366
    s = describe(t)
    assert (s.prompt.p50, s.prompt.max, s.output.p50, s.output.max) == (1020, 14050, 129, 1000)
    # Vidur's splitwise_conv.csv is this trace with arrivals relative to the first request.
    assert [r.arrival for r in t.requests[:6]] == pytest.approx([0.0, 4.314579, 4.541877, 4.710427,
                                                                 5.892655, 6.311529])


def test_azure_2023_conv_loads_under_one_second():
    path = shared(CONV)
    best = min(_timed(lambda: load_file(path)) for _ in range(3))
    assert best < 1.0, f"loading {path.name} took {best:.3f} s"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_mooncake_keeps_hash_ids_as_prefix_blocks():
    t = load_file(shared(MOONCAKE))
    assert len(t) == 3993 and t.meta["format"] == "mooncake" and t.meta["block_tokens"] == 512
    r0 = t.requests[0]
    assert (r0.prompt_len, r0.output_len) == (40160, 6)
    assert r0.hash_ids == tuple(range(79))  # ceil(40160 / 512) blocks
    assert [r.arrival for r in t.requests[:3]] == [0.0, 0.0, 0.04]  # timestamps are milliseconds
    assert t.requests[-1].arrival == pytest.approx(1022.025)


def test_length_only_csv_draws_seeded_arrivals():
    path = shared(ARXIV)
    t = load_file(path, rate=5.0, seed=1)
    assert len(t) == 28257 and t.meta["format"] == "lengths"
    assert (t.requests[0].prompt_len, t.requests[0].output_len) == (3772, 54)
    assert t.meta["arrivals"] == {"process": "poisson", "rate": 5.0, "burstiness": 1.0, "seed": 1}
    assert describe(t).mean_rate == pytest.approx(5.0, rel=0.03)
    assert load_file(path, rate=5.0, seed=1).sha256() == t.sha256()
    assert load_file(path, rate=5.0, seed=2).sha256() != t.sha256()
    bursty = describe(load_file(path, arrivals="gamma", rate=5.0, burstiness=4.0, seed=1))
    assert bursty.burstiness == pytest.approx(4.0, rel=0.1)


def test_detection_of_each_shared_file():
    assert detect(shared(CODE)) == "azure"
    assert detect(shared(MOONCAKE)) == "mooncake"
    assert detect(shared(ARXIV)) == "lengths"


# ---------------------------------------------------------------------------------------------
# Formats written here

def test_azure_2024_both_timestamp_styles_and_zero_clamp(tmp_path):
    t = load_file(write(tmp_path, "azure24.csv", AZURE_2024))
    assert t.meta["format"] == "azure"
    assert [r.arrival for r in t.requests] == pytest.approx([0.0, 0.00993, 1.5, 60.0])
    assert [r.output_len for r in t.requests] == [10, 20, 1, 40]  # the 0 became 1 ...
    assert t.meta["clamped_zero"] == {"prompt": 0, "output": 1}  # ... and says so


def test_azure_rejects_mixed_utc_offsets(tmp_path):
    p = write(tmp_path, "mixed.csv", AZURE_2024 + "2024-05-10 00:02:00,1,1\n")
    with pytest.raises(TraceError, match=r"mixed\.csv line 6: .*UTC offset"):
        load_file(p)


def test_burstgpt_drops_failures_and_selects_model_and_log_type(tmp_path):
    p = write(tmp_path, "burst.csv", BURSTGPT)
    t = load_file(p)
    assert t.meta["format"] == "burstgpt"
    assert [r.id for r in t.requests] == ["0", "2", "3", "4"]  # row 1 failed (0 response tokens)
    assert [r.arrival for r in t.requests] == [0.0, 113.0, 195.0, 228.5]
    assert t.meta["dropped"] == {"failed": 1}
    assert t.meta["clamped_zero"] == {"prompt": 1, "output": 0}  # row 4's 0 request tokens
    conv = load_file(p, model="chatgpt", log_type="conversation")
    assert [r.id for r in conv.requests] == ["0", "4"]
    assert conv.meta["model"] == "chatgpt" and conv.meta["log_type"] == "conversation"
    assert conv.meta["dropped"] == {"failed": 1, "other model": 1, "other log type": 1}
    api = load_file(p, log_type="API log")
    assert [r.id for r in api.requests] == ["3"] and api.requests[0].arrival == 0.0


def test_burstgpt_newer_columns(tmp_path):
    t = load_file(write(tmp_path, "burst2.csv", BURSTGPT_NEW), model="GPT-4")
    assert [(r.arrival, r.prompt_len, r.output_len) for r in t.requests] == [(0.0, 100, 5), (2.0, 200, 6)]


def test_vidur_splitwise_processed(tmp_path):
    p = write(tmp_path, "splitwise_conv.csv", VIDUR)
    t = load_file(p)
    assert t.meta["format"] == "vidur"
    assert [r.arrival for r in t.requests] == pytest.approx([0.0, 4.314579, 4.541877, 5.892655])
    assert load_file(p, fmt="splitwise").sha256() == t.sha256()


def test_a_named_format_overrides_detection(tmp_path):
    p = write(tmp_path, "splitwise_conv.csv", VIDUR)
    t = load_file(p, fmt="lengths", rate=2.0)  # keep the lengths, draw new arrivals
    assert t.meta["format"] == "lengths" and [r.prompt_len for r in t.requests] == [374, 396, 879, 91]
    assert [r.arrival for r in t.requests] == pytest.approx(list(arrival_times(4, 2.0, 1.0, 0)))
    assert format_name("Azure-2024") == "azure"


def test_drawn_arrivals_match_the_gamma_generator():
    gen = gamma(50, rate=3.0, burstiness=2.0, seed=7)
    assert list(arrival_times(50, 3.0, 2.0, 7)) == [r.arrival for r in gen.requests]


def test_pdsim_jsonl_round_trip_keeps_hash_ids_and_meta(tmp_path):
    t = shape.first(load_file(shared(MOONCAKE)), 20)
    out = tmp_path / "mc.jsonl"
    t.save_jsonl(out)
    back = load_file(out)
    assert back.sha256() == t.sha256() and back.requests[0].hash_ids == t.requests[0].hash_ids
    assert back.meta["shaping"] == [{"op": "first", "n": 20}] and back.meta["format"] == "mooncake"


# ---------------------------------------------------------------------------------------------
# Streaming

def _azure_2024_file(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for i in range(n):
            f.write(f"2024-05-10 {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000000:06d}+00:00,"
                    f"{100 + i % 900},{1 + i % 300}\n")
    return path


def test_large_files_stream_and_stop_early(tmp_path):
    path = _azure_2024_file(tmp_path / "week.csv", 40_000)  # ~1.6 MB of text
    size = path.stat().st_size
    tracemalloc.start()
    try:
        t = load_file(path, shaping=Shaping(first=200))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(t) == 200 and not t.meta["read_to_end"] and t.meta["rows_read"] == 200
    assert peak < size / 4, f"peak {peak} B for a {size} B file: the text is not streamed"
    # A full read keeps the requests; beyond them, the reader needs little memory on the way.
    tracemalloc.start()
    try:
        requests, meta = read(path, "azure")
        kept, peak_full = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(requests) == 40_000 and meta["read_to_end"]
    assert peak_full - kept < size / 4, f"{peak_full - kept} B transient for a {size} B file"


# ---------------------------------------------------------------------------------------------
# Shaping

def _small() -> Trace:
    return Trace([Request(str(i), float(a), p, o) for i, (a, p, o) in
                  enumerate([(0, 100, 10), (1, 5000, 20), (2, 300, 900), (5, 40, 4), (9, 7000, 2000)])],
                 {"source": "test"})


def test_window_first_sample_speed_caps_record_what_they_did():
    t = _small()
    w = shape.window(t, 1.0, 5.0)
    assert [r.id for r in w.requests] == ["1", "2"] and [r.arrival for r in w.requests] == [0.0, 1.0]
    assert w.meta["shaping"] == [{"op": "window", "start_s": 1.0, "end_s": 5.0, "offset_s": 1.0}]
    assert [r.id for r in shape.first(t, 2).requests] == ["0", "1"]
    s1, s2 = shape.sample(t, 3, seed=4), shape.sample(t, 3, seed=4)
    assert s1.sha256() == s2.sha256() and len(s1) == 3 and s1.requests[0].arrival == 0.0
    assert [int(r.id) for r in s1.requests] == sorted(int(r.id) for r in s1.requests)
    fast = shape.speed(t, 2.0)
    assert [r.arrival for r in fast.requests] == [0.0, 0.5, 1.0, 2.5, 4.5]
    capped = shape.max_output(shape.max_prompt(t, 4096), 1000)
    assert [r.prompt_len for r in capped.requests] == [100, 4096, 300, 40, 4096]
    assert [r.output_len for r in capped.requests] == [10, 20, 900, 4, 1000]
    assert capped.meta["shaping"] == [{"op": "max_prompt", "cap": 4096, "clamped": 2},
                                      {"op": "max_output", "cap": 1000, "clamped": 1}]
    assert t.meta == {"source": "test"}  # the input is never changed


def test_prompt_cap_cuts_prompt_ids_and_hash_blocks():
    t = Trace([Request("0", 0.0, 1200, 5, prompt_ids=tuple(range(1200)), hash_ids=(7, 8, 9))],
              {"block_tokens": 512})
    r = shape.max_prompt(t, 600).requests[0]
    assert r.prompt_len == 600 and r.prompt_ids == tuple(range(600)) and r.hash_ids == (7, 8)


def test_pushed_down_shaping_equals_shaping_the_full_trace():
    path = shared(CONV)
    full = load_file(path)
    for s in (Shaping(window=(600.0, 1200.0)), Shaping(window=(600.0, None), first=50),
              Shaping(first=300, sample=40, seed=3, speed=4.0, max_prompt=2048, max_output=256)):
        fast, slow = load_file(path, shaping=s), shape.apply(full, s)
        assert fast.sha256() == slow.sha256()
        assert fast.meta["shaping"] == slow.meta["shaping"]
    assert not load_file(path, shaping=Shaping(window=(0.0, 60.0))).meta["read_to_end"]


def test_shaping_a_generator_through_resolve():
    t = resolve("poisson", shaping=Shaping(speed=2.0), num_requests=10, rate=1.0)
    assert t.meta["source"] == "poisson" and t.meta["shaping"] == [{"op": "speed", "factor": 2.0}]


def test_bad_shaping_is_a_trace_error():
    with pytest.raises(TraceError, match="holds no requests"):
        shape.window(_small(), 100.0, 200.0)
    with pytest.raises(TraceError, match="window end"):
        Shaping(window=(5.0, 1.0))
    with pytest.raises(TraceError, match="speed"):
        Shaping(speed=0.0)
    assert shape.parse_window(":600") == (0.0, 600.0) and shape.parse_window("10:") == (10.0, None)


# ---------------------------------------------------------------------------------------------
# Malformed input: one line naming the file, the line and the problem; exit code 2 from the CLI.

BAD = {
    "missing_column": ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4808\n",
                       r"line 1: missing column 'GeneratedTokens' for the azure format"),
    "short_row": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4808,10\n2023-11-16 18:17:04,5\n",
                  r"line 3: expected 3 fields, got 2"),
    "negative_length": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,-3,5\n",
                        r"line 3: negative num_prefill_tokens \(-3\)"),
    "not_a_number": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,ten,5\n",
                     r"line 3: num_prefill_tokens 'ten' is not a number"),
    "bad_timestamp": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4808,10\nyesterday,1,1\n",
                      r"line 3: timestamp 'yesterday' is not an ISO date-time"),
    "unsorted": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n3,10,5\n2,10,5\n",
                 r"line 4: arrivals not sorted: 2\.000000 s after 3\.000000 s \(line 3\)"),
    "empty": ("", r"empty file"),
    "header_only": ("TIMESTAMP,ContextTokens,GeneratedTokens\n", r"no data rows, only a header"),
    "unknown_header": ("a,b,c\n1,2,3\n", r"line 1: cannot tell the trace format"),
    "mooncake_field": ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 5, "input_length": 5}\n',
                       r"line 2: missing field 'output_length'"),
    "json": ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 5,\n', r"line 2: not JSON"),
    "json_array": ("[1, 2]\n", r"line 1: expected a JSON object"),
    "json_nested": ("[" * 200 + "]" * 200 + "\n", r"line 1: JSON nested too deeply"),
    "jsonl_of_csv": ("arrival,prompt_len\n0,5\n", r"line 1: not JSON"),  # a .jsonl file is read as JSON lines
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_input_names_file_line_and_problem(tmp_path, case, capsys):
    text, pattern = BAD[case]
    suffix = ".jsonl" if text.startswith(("{", "[")) or case.startswith("jsonl") else ".csv"
    p = write(tmp_path, case + suffix, text)
    with pytest.raises(TraceError, match=pattern) as e:
        load_file(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    assert cli(["traces", "info", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(p) in err and err.startswith("pdsim traces: error:")


def test_options_a_format_does_not_take_are_refused(tmp_path):
    p = write(tmp_path, "splitwise_conv.csv", VIDUR)
    with pytest.raises(TraceError, match="rate do not apply to the vidur format"):
        load_file(p, rate=3.0)
    with pytest.raises(TraceError, match="needs gamma arrivals"):
        load_file(p, fmt="lengths", burstiness=2.0)
    with pytest.raises(TraceError, match="unknown trace format"):
        load_file(p, fmt="parquet")


# ---------------------------------------------------------------------------------------------
# CLI

def test_cli_info_and_convert(tmp_path, capsys):
    src = write(tmp_path, "burst.csv", BURSTGPT)
    assert cli(["traces", "info", str(src), "--burstgpt-log", "conversation"]) == 0
    out = capsys.readouterr().out
    assert "(burstgpt)" in out and "requests     3" in out and "burstiness" in out
    dst = tmp_path / "out.jsonl"
    assert cli(["traces", "convert", str(src), "-o", str(dst), "--window", "0:200", "--speed", "2",
                "--max-output", "15"]) == 0
    t = load_file(dst)
    assert [r.arrival for r in t.requests] == [0.0, 56.5, 97.5]  # rows 0, 2, 3; row 4 is at 228.5 s
    assert [r.output_len for r in t.requests] == [15, 15, 12]
    assert [s["op"] for s in t.meta["shaping"]] == ["window", "speed", "max_output"]
    assert cli(["traces", "convert", str(src), "-o", str(dst)]) == 2  # no silent overwrite
    capsys.readouterr()
    assert cli(["traces", "info", str(dst), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["stats"]["count"] == 3 and info["sha256"] == t.sha256()


def test_simulate_accepts_a_public_format_file(tmp_path, capsys):
    src = write(tmp_path, "splitwise_conv.csv", VIDUR)
    assert cli(["simulate", "--trace", str(src), "--policy", "chunked", "--budget", "128"]) == 0
    assert "4 requests" in capsys.readouterr().out


def test_info_on_the_shared_azure_trace(capsys):
    assert cli(["traces", "info", str(shared(CODE)), "--first", "100"]) == 0
    out = capsys.readouterr().out
    assert "requests     100" in out and "read the first 100 rows only" in out


def test_generated_burstiness_reads_back():
    s = describe(gamma(20_000, rate=2.0, burstiness=3.0, seed=0))
    assert s.burstiness == pytest.approx(3.0, rel=0.1) and s.mean_rate == pytest.approx(2.0, rel=0.05)
    assert np.isnan(describe(gamma(1)).burstiness)


def test_burstiness_is_vllms_gamma_shape():
    """vLLM draws gaps with shape = burstiness and scale = 1/(rate * burstiness): below 1 is
    burstier. pdsim used shape 1/burstiness, so `--burstiness 4` meant what vLLM calls 0.25."""
    tr = gamma(500, rate=2.0, burstiness=0.25, seed=3)
    gaps = np.random.default_rng(3).gamma(shape=0.25, scale=1 / (2.0 * 0.25), size=500)
    gaps[0] = 0.0
    assert [r.arrival for r in tr.requests] == pytest.approx(np.cumsum(gaps).tolist())
    bursty, even = describe(gamma(20_000, rate=2.0, burstiness=0.25, seed=0)), describe(gamma(20_000, 2.0, 4.0))
    assert bursty.cv2 == pytest.approx(4.0, rel=0.1) and bursty.burstiness == pytest.approx(0.25, rel=0.1)
    assert even.cv2 == pytest.approx(0.25, rel=0.1)

"""Loaders for the public trace formats the field uses: one small reader per format, plus detection.

Why a reader per format and one shared collector: every format differs only in how a row becomes
(time, prompt length, output length); the rules a replay depends on are the same for all of them
and live in one place (`read`):

- Streaming: files are read row by row (`csv` / one `json.loads` per line), never as a whole text,
  so a week-long Azure 2024 file costs memory for the requests kept, not for its text. A window or
  a first-N limit stops the reading early (`read(start=, end=, limit=)`).
- Ids: a request's id is the 0-based index of its data row in the source file (header and blank
  lines not counted), so an id points back to its row even after rows are dropped or shaped away.
- Arrivals: seconds relative to the first kept request, which arrives at 0.0.
- Lengths: a negative or non-whole length is an error. A length of 0 (public logs have a few) is
  clamped to 1 and counted in `meta["clamped_zero"]`, except BurstGPT's 0 response tokens, which
  mark failed requests: those rows are dropped and counted in `meta["dropped"]["failed"]`.
- Errors: a `TraceError` whose one line names the file, the line (1-based, the header is line 1)
  and the problem; arrivals that go backwards are an error, equal arrivals are not.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TextIO

import numpy as np

from sim.core.inputs import JSONInputError, loads, not_text, open_text
from traces import schema
from traces.generators import gamma_gaps
from traces.rows import (
    CLASS_COLUMN,
    TARGET_COLUMN,
    Format,
    Reading,
    Record,
    class_columns,
    open_csv,
    optional_column,
    parse_class,
    parse_count,
    parse_seconds,
    parse_timestamp,
)
from traces.trace import Request, TraceError, json_objects

MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake hash_ids block (the FAST'25 release)
PROMPT_COLUMNS = ("num_prefill_tokens", "ContextTokens", "prompt_len", "prompt_tokens", "input_length",
                  "input_tokens", "Request tokens")
OUTPUT_COLUMNS = ("num_decode_tokens", "GeneratedTokens", "output_len", "output_tokens", "output_length",
                  "Response tokens")
TIME_COLUMNS = ("TIMESTAMP", "arrived_at", "arrival", "arrival_time", "time")


# ---------------------------------------------------------------------------------------------
# Field parsers: fast on good input, one clear line on bad input.


# ---------------------------------------------------------------------------------------------
# CSV plumbing shared by the CSV formats.


# ---------------------------------------------------------------------------------------------
# One reader per format.

def read_azure(f: TextIO, r: Reading) -> Iterator[Record]:
    """Azure LLM inference 2023/2024: `TIMESTAMP,ContextTokens,GeneratedTokens`, ISO date-times."""
    t0: datetime | None = None
    names, (it, ip, io), rows = open_csv(f, FORMATS["azure"], r)
    cc = class_columns(names)
    for line, index, row in rows:
        text = row[it]
        try:
            ts = parse_timestamp(text)
        except ValueError:
            raise r.error(line, f"timestamp {text.strip()!r} is not an ISO date-time") from None
        if t0 is None:
            t0 = ts
            r.meta["first_timestamp"] = text.strip()
        try:
            t = (ts - t0).total_seconds()
        except TypeError:
            raise r.error(line, f"timestamp {text.strip()!r} mixes a UTC offset and none "
                                f"(the first row is {r.meta['first_timestamp']!r})") from None
        yield (line, index, t, parse_count(row[ip], "ContextTokens", r, line),
               parse_count(row[io], "GeneratedTokens", r, line), None, *parse_class(row, cc, r, line))


def read_burstgpt(f: TextIO, r: Reading) -> Iterator[Record]:
    """BurstGPT: seconds from the trace start; optional model and log-type selection.

    Rows with 0 response tokens are requests that failed; they are dropped, not clamped, since
    replaying them would invent work the service never did.
    """
    model = r.options.get("model")
    log_type = r.options.get("log_type")
    want_log = _log_key(log_type) if log_type else None
    names, (it, ip, io), rows = open_csv(f, FORMATS["burstgpt"], r)
    im, il = optional_column(names, "Model"), optional_column(names, "Log Type")
    cc = class_columns(names)
    if model and im is None:
        raise r.error(1, "no 'Model' column to select a model from")
    if log_type and il is None:
        raise r.error(1, "no 'Log Type' column to select a log type from")
    for line, index, row in rows:
        if model and row[im].strip().lower() != model.lower():
            r.drop("other model")
            continue
        if want_log and _log_key(row[il]) != want_log:
            r.drop("other log type")
            continue
        out = parse_count(row[io], "Response tokens", r, line)
        if out == 0:
            r.drop("failed")
            continue
        yield (line, index, parse_seconds(row[it], "Timestamp", r, line),
               parse_count(row[ip], "Request tokens", r, line), out, None, *parse_class(row, cc, r, line))


def _log_key(text: str) -> str:
    """`Conversation log`, `conversation` and `CONVERSATION LOG` name the same log type."""
    key = text.strip().lower()
    return key[:-4].rstrip() if key.endswith(" log") else key


def read_vidur(f: TextIO, r: Reading) -> Iterator[Record]:
    """Vidur / Splitwise processed traces: `arrived_at,num_prefill_tokens,num_decode_tokens`."""
    names, (it, ip, io), rows = open_csv(f, FORMATS["vidur"], r)
    cc = class_columns(names)
    for line, index, row in rows:
        yield (line, index, parse_seconds(row[it], "arrived_at", r, line),
               parse_count(row[ip], "num_prefill_tokens", r, line),
               parse_count(row[io], "num_decode_tokens", r, line), None, *parse_class(row, cc, r, line))


def read_lengths(f: TextIO, r: Reading) -> Iterator[Record]:
    """Length-only CSVs (e.g. Vidur's arxiv summarization stats): arrivals drawn from a process.

    The lengths are read first (they are small), then `arrival_times` draws one gap per row, so
    the same file, process, rate and seed always give the same trace.
    """
    process, rate, burstiness, seed = arrival_options(r.options)
    lines, prompts, outputs, classes = [], [], [], []
    names, (ip, io), rows = open_csv(f, FORMATS["lengths"], r)
    cc = class_columns(names)
    for line, _index, row in rows:
        lines.append(line)
        prompts.append(parse_count(row[ip], "prompt length", r, line))
        outputs.append(parse_count(row[io], "output length", r, line))
        classes.append(parse_class(row, cc, r, line))
    arrivals = arrival_times(len(lines), rate, burstiness, seed)
    r.meta["arrivals"] = {"process": process, "rate": rate, "burstiness": burstiness, "seed": seed}
    for i, line in enumerate(lines):
        yield line, i, float(arrivals[i]), prompts[i], outputs[i], None, *classes[i]


def arrival_options(options: dict) -> tuple[str, float, float, int]:
    """Validate (process, rate, burstiness, seed) for generated arrivals; Poisson unless told."""
    process = options.get("arrivals") or "poisson"
    rate = options.get("rate", 1.0)
    burstiness = options.get("burstiness")
    seed = int(options.get("seed", 0))
    if process not in ("poisson", "gamma"):
        raise TraceError(f"arrival process must be poisson or gamma, got {process!r}")
    if process == "poisson" and burstiness not in (None, 1, 1.0):
        raise TraceError(f"burstiness {burstiness} needs gamma arrivals (Poisson has burstiness 1)")
    burstiness = 1.0 if burstiness is None else float(burstiness)
    if not float(rate) > 0:
        raise TraceError(f"arrival rate must be > 0 requests/s, got {rate}")
    if not burstiness > 0:
        raise TraceError(f"burstiness must be > 0, got {burstiness}")
    return process, float(rate), burstiness, seed


def arrival_times(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Arrival times of `traces.generators.gamma_gaps` (vLLM's convention), first at 0: a length-only
    file and a generated trace with the same count, rate, burstiness and seed arrive at the same times."""
    return np.cumsum(gamma_gaps(np.random.default_rng(seed), n, rate, burstiness))


def read_mooncake(f: TextIO, r: Reading) -> Iterator[Record]:
    """Mooncake JSON lines: `timestamp` in ms, lengths, and `hash_ids` (512-token prefix blocks).

    The hash ids are kept on each request, so a later prefix-cache study can see which prompts
    share blocks; `meta["block_tokens"]` says how many tokens a block covers.
    """
    r.meta["block_tokens"] = MOONCAKE_BLOCK_TOKENS
    index = 0
    for line, obj in json_objects(f, r.path):
        try:
            ts, n_in, n_out = obj["timestamp"], obj["input_length"], obj["output_length"]
        except KeyError as e:
            raise r.error(line, f"missing field {e.args[0]!r}") from None
        hashes, cls, target = obj.get("hash_ids"), obj.get(CLASS_COLUMN), obj.get(TARGET_COLUMN)
        try:
            if hashes is not None:
                hashes = schema.whole_numbers(hashes, "hash_ids", -(1 << 63))
            record = (line, index, schema.seconds(ts, "timestamp", scale=1e-3), schema.count(n_in, "input_length"),
                      schema.count(n_out, "output_length"), hashes,
                      None if cls is None else schema.class_name(cls),
                      None if target is None else schema.target_ms(target, TARGET_COLUMN))
        except schema.FieldError as e:
            raise r.error(line, str(e)) from None
        yield record
        index += 1


FORMATS: dict[str, Format] = {
    "azure": Format("azure", (("TIMESTAMP",), ("ContextTokens",), ("GeneratedTokens",)), read_azure,
                    about="Azure LLM inference 2023/2024 CSV: TIMESTAMP,ContextTokens,GeneratedTokens"),
    "burstgpt": Format("burstgpt", (("Timestamp",), ("Request tokens",), ("Response tokens",)), read_burstgpt,
                       options=("model", "log_type"),
                       about="BurstGPT CSV: Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"),
    "vidur": Format("vidur", (("arrived_at",), ("num_prefill_tokens",), ("num_decode_tokens",)), read_vidur,
                    about="Vidur/Splitwise processed CSV: arrived_at,num_prefill_tokens,num_decode_tokens"),
    "lengths": Format("lengths", (PROMPT_COLUMNS, OUTPUT_COLUMNS), read_lengths,
                      options=("arrivals", "rate", "burstiness"),
                      about="length-only CSV (e.g. num_prefill_tokens,num_decode_tokens); arrivals generated"),
    "mooncake": Format("mooncake", (), read_mooncake,
                       about="Mooncake JSON lines: timestamp (ms), input_length, output_length, hash_ids"),
}
CSV_FORMATS = ("azure", "burstgpt", "vidur", "lengths")
PDSIM = "pdsim"  # pdsim's own JSONL (Trace.save_jsonl), read by traces.trace.load_jsonl
FORMAT_NAMES = (*FORMATS, PDSIM)
ALIASES = {"azure2023": "azure", "azure-2023": "azure", "azure2024": "azure", "azure-2024": "azure",
           "splitwise": "vidur", "jsonl": PDSIM}


def format_name(name: str) -> str:
    """The canonical name of a format, or a TraceError listing the known ones."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in FORMAT_NAMES:
        raise TraceError(f"unknown trace format {name!r}; known: {', '.join(FORMAT_NAMES)}")
    return key


# ---------------------------------------------------------------------------------------------
# Detection: from the first non-blank line only.

def detect(path: str | Path) -> str:
    """The format of `path`, told from its first non-blank line (a CSV header or a JSON object)."""
    path = Path(path)
    with open_text(path, "trace", TraceError, newline="") as f:
        try:
            line, first = next(((n, text) for n, text in enumerate(f, 1) if text.strip()), (0, None))
        except UnicodeDecodeError as e:
            raise not_text(path, "trace", e, TraceError) from None
    if first is None:
        raise TraceError(f"{path}: empty file")
    if first.lstrip().startswith(("{", "[")) or path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return _detect_json(first, path, line)  # JSON lines, and what a JSON-lines file should have been
    try:
        header = next(csv.reader([first]))
    except csv.Error as e:
        raise TraceError(f"{path} line {line}: not a CSV header ({e})") from None
    return _detect_csv(header, path, line)


def _detect_json(first: str, path: Path, line: int) -> str:
    try:
        obj = loads(first)
    except JSONInputError as e:
        raise TraceError(f"{path} line {line}: {e}") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{path} line {line}: expected a JSON object")
    if "meta" in obj or "arrival" in obj or "prompt_len" in obj:
        return PDSIM
    if {"input_length", "output_length", "hash_ids"} & obj.keys():
        return "mooncake"
    raise TraceError(f"{path} line {line}: a JSON object with neither pdsim fields (arrival, prompt_len, "
                     f"output_len) nor Mooncake fields (timestamp, input_length, output_length)")


def _detect_csv(header: list[str], path: Path, line: int) -> str:
    names = {h.strip().lower() for h in header}
    has = lambda accepted: any(a.lower() in names for a in accepted)
    timed = any(t.lower() in names for t in TIME_COLUMNS)
    for name in CSV_FORMATS:
        if all(has(c) for c in FORMATS[name].columns) and (name != "lengths" or not timed):
            return name
    text = ",".join(h.strip() for h in header)
    scores = {n: sum(has(c) for c in FORMATS[n].columns) for n in ("azure", "burstgpt", "vidur")}
    best = max(scores.values())
    closest = [n for n, s in scores.items() if s == best]
    if best > 0 and len(closest) == 1:
        fmt = FORMATS[closest[0]]
        missing = [c[0] for c in fmt.columns if not has(c)]
        raise TraceError(f"{path} line {line}: missing column {', '.join(map(repr, missing))} for the {fmt.name} "
                         f"format (header: {text})")
    raise TraceError(f"{path} line {line}: cannot tell the trace format from the header {text!r}; known: "
                     + "; ".join(f.about for f in FORMATS.values()) + "; or name the format (--format NAME)")


# ---------------------------------------------------------------------------------------------
# The collector every format goes through.

def read(path: str | Path, fmt: str, start: float = 0.0, end: float | None = None, limit: int | None = None,
         **options) -> tuple[list[Request], dict]:
    """Requests and metadata of a public-format file.

    `start`, `end` and `limit` only say what may be skipped or left unread: records before `start`
    seconds are skipped, reading stops at the first record at or after `end`, or once `limit`
    records in the window are kept. Times stay relative to the file's first kept request; the
    caller (`traces.load.load_file`) applies the shaping that records the window in the metadata.
    """
    path = Path(path)
    fmt = format_name(fmt)
    spec = FORMATS[fmt]
    options = {k: v for k, v in options.items() if v is not None}
    extra = sorted(set(options) - set(spec.options) - {"seed"})
    if extra:
        hint = (" (that file has its own arrival times: scale them with speed, or read it as format "
                "lengths to draw new ones)" if set(extra) & {"arrivals", "rate", "burstiness"} else "")
        raise TraceError(f"{path}: option(s) {', '.join(extra)} do not apply to the {fmt} format{hint}")
    r = Reading(path, options)
    reqs: list[Request] = []
    t0: float | None = None
    last = -math.inf
    last_line = 0
    zero_prompt = zero_output = 0
    rows = 0
    to_end = True
    with open_text(path, "trace", TraceError, newline="") as f:
        for line, index, t, p, o, hashes, cls, target in _guarded(spec.reader(f, r), r):
            rows += 1
            if t0 is None:
                t0 = t
            a = t - t0
            if a < last:
                raise r.error(line, f"arrivals not sorted: {a:.6f} s after {last:.6f} s (line {last_line})")
            last, last_line = a, line
            if a < start:
                continue
            if end is not None and a >= end:
                to_end = False
                break
            if p == 0:
                p, zero_prompt = 1, zero_prompt + 1
            if o == 0:
                o, zero_output = 1, zero_output + 1
            reqs.append(Request(str(index), a, p, o, hash_ids=hashes, cls=cls, ttft_slo_ms=target))
            if limit is not None and len(reqs) >= limit:
                to_end = False
                break
    if not reqs:
        if rows:
            window = f"{start:g}:{'' if end is None else f'{end:g}'}"
            tail = f" (the last request arrives at {last:g} s)" if to_end else ""
            raise TraceError(f"{path}: the window {window} s holds no requests{tail}")
        if r.dropped:
            raise TraceError(f"{path}: no requests left after dropping rows ({_dropped_text(r.dropped)})")
        raise TraceError(f"{path}: no data rows, only a header")
    meta = {"source": str(path), "format": fmt, "rows_read": rows + sum(r.dropped.values()),
            "read_to_end": to_end}
    meta.update(r.meta)
    if fmt == "burstgpt":
        meta["model"] = options.get("model")
        meta["log_type"] = options.get("log_type")
    if r.dropped:
        meta["dropped"] = dict(r.dropped)
    if zero_prompt or zero_output:
        meta["clamped_zero"] = {"prompt": zero_prompt, "output": zero_output}
    return reqs, meta


def _guarded(records: Iterator[Record], r: Reading) -> Iterator[Record]:
    """A reader's records; a row the csv module cannot read (a field over its 128 KiB limit, a NUL
    byte) or bytes that are not UTF-8 become one line naming the file and where."""
    line = 1  # the header
    try:
        for rec in records:
            line = rec[0]
            yield rec
    except csv.Error as e:  # the row after the last one read
        raise TraceError(f"{r.path} line {line + 1}: not a readable CSV row ({e})") from None
    except UnicodeDecodeError as e:
        raise not_text(r.path, "trace", e, TraceError, line + 1) from None


def _dropped_text(dropped: dict) -> str:
    return ", ".join(f"{n} {why}" for why, n in dropped.items())

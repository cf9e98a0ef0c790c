"""The `Trace`: an ordered list of requests with a canonical SHA-256, saved as JSONL.

The hash is the one the measurement protocol names: `sha256(json.dumps(requests, sort_keys=True,
separators=(",", ":")))` over the list of request dicts, so two runs can prove they replayed the
same work.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from sim.core.errors import InputError
from sim.core.files import atomic_write_text
from sim.core.inputs import JSONInputError, loads, not_text, open_text
from traces import schema


class TraceError(InputError):
    """Bad trace input; the message names the file, the row and the problem."""


@dataclass(frozen=True, slots=True)
class Request:
    id: str
    arrival: float  # seconds from the trace start
    prompt_len: int
    output_len: int  # output budget in tokens; EOS is ignored, so this is exactly what is generated
    prompt_ids: tuple[int, ...] | None = None
    hash_ids: tuple[int, ...] | None = None  # prefix blocks (Mooncake), kept for prefix-cache studies
    # Prefill done and first token out before the clock starts (the meTile A/B setup: A is already
    # decoding when B arrives). Its prefill and first token are not timed; its first gap is.
    prefilled: bool = False
    # Priority classes (`queue=priority`): the request's class, and its own TTFT target in ms (a
    # class's target, `--class-slo CLASS:ttft=MS`, given to each of its requests). Its deadline is
    # arrival + target; a request with no target has none. Both are kept out of the dict (and the
    # hash) when absent, so a trace without classes hashes as before.
    cls: str | None = None
    ttft_slo_ms: float | None = None

    def to_dict(self) -> dict:
        d = {"id": self.id, "arrival": self.arrival, "prompt_len": self.prompt_len,
             "output_len": self.output_len}
        if self.prompt_ids is not None:
            d["prompt_ids"] = list(self.prompt_ids)
        if self.hash_ids is not None:
            d["hash_ids"] = list(self.hash_ids)
        if self.prefilled:
            d["prefilled"] = True
        if self.cls is not None:
            d["class"] = self.cls
        if self.ttft_slo_ms is not None:
            d["ttft_slo_ms"] = self.ttft_slo_ms
        return d


def check_request(r: Request, where: str) -> None:
    """Raise TraceError naming `where` if the request cannot be replayed."""
    if not (r.arrival >= 0 and math.isfinite(r.arrival)):
        raise TraceError(f"{where}: arrival must be a finite number of seconds >= 0, got {r.arrival}")
    if not 1 <= r.prompt_len <= schema.MAX_TOKENS:
        raise TraceError(f"{where}: prompt length must be 1 to {schema.MAX_TOKENS:,} tokens, got {r.prompt_len}")
    if not 1 <= r.output_len <= schema.MAX_TOKENS:
        raise TraceError(f"{where}: output length must be 1 to {schema.MAX_TOKENS:,} tokens, got {r.output_len}")
    if r.prefilled and r.output_len < 2:
        raise TraceError(f"{where}: a prefilled request needs an output length >= 2")
    if r.prompt_ids is not None and len(r.prompt_ids) != r.prompt_len:
        raise TraceError(f"{where}: {len(r.prompt_ids)} prompt ids for prompt length {r.prompt_len}")
    if r.ttft_slo_ms is not None and not (math.isfinite(r.ttft_slo_ms) and r.ttft_slo_ms > 0):
        raise TraceError(f"{where}: ttft_slo_ms must be a finite number of milliseconds > 0, got {r.ttft_slo_ms}")


@dataclass
class Trace:
    requests: list[Request]
    meta: dict = field(default_factory=dict)  # where it came from and how it was shaped

    def __post_init__(self) -> None:
        ids = set()
        last = 0.0
        for i, r in enumerate(self.requests):
            where = f"trace {self.meta.get('source', '')} request {i} (id {r.id})".replace("  ", " ")
            check_request(r, where)
            if r.arrival < last:
                raise TraceError(f"{where}: arrivals not sorted ({r.arrival} after {last})")
            if r.id in ids:
                raise TraceError(f"{where}: duplicate request id")
            ids.add(r.id)
            last = r.arrival

    def __len__(self) -> int:
        return len(self.requests)

    def sha256(self) -> str:
        """The protocol's hash of the request list, fed in pieces: the same digest as hashing
        `json.dumps(requests, sort_keys=True, separators=(",", ":"))` whole, without ever holding
        that text (hundreds of megabytes for a week-long trace)."""
        h = hashlib.sha256(b"[")
        dump = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
        reqs = self.requests
        for i in range(0, len(reqs), 4096):
            piece = ",".join(dump(r.to_dict()) for r in reqs[i:i + 4096])
            h.update(((","  if i else "") + piece).encode())
        h.update(b"]")
        return h.hexdigest()

    def to_dict(self) -> dict:
        return {"meta": self.meta, "sha256": self.sha256(), "requests": [r.to_dict() for r in self.requests]}

    def save_jsonl(self, path: str | Path, overwrite: bool = False) -> None:
        """One header line (`{"meta": ..., "sha256": ...}`), then one request per line."""
        lines = [json.dumps({"meta": self.meta, "sha256": self.sha256()})]
        lines += [json.dumps(r.to_dict()) for r in self.requests]
        atomic_write_text(path, "\n".join(lines) + "\n", overwrite=overwrite)

    @staticmethod
    def from_dicts(rows: list[dict], meta: dict | None = None, source: str = "trace") -> "Trace":
        reqs = [request_from_dict(row, f"{source} row {i + 1}") for i, row in enumerate(rows)]
        return Trace(reqs, dict(meta or {}))


def request_from_dict(row: dict, where: str) -> Request:
    """A request from one row of pdsim's JSONL (or a report's trace), through `traces.schema`."""
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object")
    try:
        missing = next((k for k in ("id", "arrival", "prompt_len", "output_len") if k not in row), None)
        if missing:
            raise TraceError(f"{where}: missing field {missing!r}")
        ids, hashes = row.get("prompt_ids"), row.get("hash_ids")
        r = Request(id=schema.request_id(row["id"]), arrival=schema.seconds(row["arrival"], "arrival"),
                    prompt_len=schema.count(row["prompt_len"], "prompt_len"),
                    output_len=schema.count(row["output_len"], "output_len"),
                    prompt_ids=None if ids is None else schema.whole_numbers(ids, "prompt_ids", 0, (1 << 31) - 1),
                    hash_ids=None if hashes is None else schema.whole_numbers(hashes, "hash_ids", -(1 << 63)),
                    prefilled=schema.flag(row.get("prefilled", False), "prefilled"),
                    cls=None if row.get("class") is None else schema.class_name(row["class"]),
                    ttft_slo_ms=None if row.get("ttft_slo_ms") is None else schema.target_ms(row["ttft_slo_ms"],
                                                                                              "ttft_slo_ms"))
    except schema.FieldError as e:
        raise TraceError(f"{where}: {e}") from None
    check_request(r, where)
    return r


def json_objects(lines: Iterable[str], path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; a TraceError naming the line otherwise
    (strict JSON: no NaN or Infinity, bounded nesting; text that is not UTF-8 named as such)."""
    n = 0
    try:
        for n, text in enumerate(lines, 1):
            if not text.strip():
                continue
            try:
                obj = loads(text)
            except JSONInputError as e:
                raise TraceError(f"{path} line {n}: {e}") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path} line {n}: expected a JSON object")
            yield n, obj
    except UnicodeDecodeError as e:
        raise not_text(path, "trace", e, TraceError, n + 1) from None


def load_jsonl(path: str | Path) -> Trace:
    """Read a trace saved by `Trace.save_jsonl`. Every error names this file and its line, even
    where the header's `source` names the file the trace was converted from."""
    path = Path(path)
    meta: dict = {}
    rows: list[Request] = []
    seen: set[str] = set()
    last = 0.0
    with open_text(path, "trace", TraceError) as f:
        for n, obj in json_objects(f, path):
            if "meta" in obj and not rows and not seen:
                if not isinstance(obj["meta"], dict):
                    raise TraceError(f"{path} line {n}: the header's meta must be a JSON object")
                meta = dict(obj["meta"])
                continue
            where = f"{path} line {n}"
            r = request_from_dict(obj, where)
            if r.arrival < last:
                raise TraceError(f"{where}: arrivals not sorted ({r.arrival} after {last})")
            if r.id in seen:
                raise TraceError(f"{where}: duplicate request id {r.id!r}")
            seen.add(r.id)
            last = r.arrival
            rows.append(r)
    if not rows:
        raise TraceError(f"{path}: no requests")
    meta.setdefault("source", str(path))
    return Trace(rows, meta)

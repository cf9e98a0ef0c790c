"""The `Trace`: an ordered list of requests with a canonical SHA-256, saved as JSONL.

The hash is the one the measurement protocol names: `sha256(json.dumps(requests, sort_keys=True,
separators=(",", ":")))` over the list of request dicts, so two runs can prove they replayed the
same work.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from sim.files import atomic_write_text


class TraceError(ValueError):
    """Bad trace input; the message names the file, the row and the problem."""


@dataclass(frozen=True)
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

    def to_dict(self) -> dict:
        d = {"id": self.id, "arrival": self.arrival, "prompt_len": self.prompt_len,
             "output_len": self.output_len}
        if self.prompt_ids is not None:
            d["prompt_ids"] = list(self.prompt_ids)
        if self.hash_ids is not None:
            d["hash_ids"] = list(self.hash_ids)
        if self.prefilled:
            d["prefilled"] = True
        return d


def check_request(r: Request, where: str) -> None:
    """Raise TraceError naming `where` if the request cannot be replayed."""
    if not r.arrival >= 0:
        raise TraceError(f"{where}: arrival must be >= 0 seconds, got {r.arrival}")
    if r.prompt_len < 1:
        raise TraceError(f"{where}: prompt length must be >= 1, got {r.prompt_len}")
    if r.output_len < 1:
        raise TraceError(f"{where}: output length must be >= 1, got {r.output_len}")
    if r.prefilled and r.output_len < 2:
        raise TraceError(f"{where}: a prefilled request needs an output length >= 2")
    if r.prompt_ids is not None and len(r.prompt_ids) != r.prompt_len:
        raise TraceError(f"{where}: {len(r.prompt_ids)} prompt ids for prompt length {r.prompt_len}")


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
        text = json.dumps([r.to_dict() for r in self.requests], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

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
    try:
        ids = row.get("prompt_ids")
        hashes = row.get("hash_ids")
        r = Request(id=str(row["id"]), arrival=float(row["arrival"]), prompt_len=int(row["prompt_len"]),
                    output_len=int(row["output_len"]),
                    prompt_ids=None if ids is None else tuple(int(t) for t in ids),
                    hash_ids=None if hashes is None else tuple(int(h) for h in hashes),
                    prefilled=bool(row.get("prefilled", False)))
    except KeyError as e:
        raise TraceError(f"{where}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise TraceError(f"{where}: bad value ({e})") from None
    check_request(r, where)
    return r


def json_objects(lines: Iterable[str], path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; a TraceError naming the line otherwise."""
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path} line {n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path} line {n}: expected a JSON object")
        yield n, obj


def load_jsonl(path: str | Path) -> Trace:
    """Read a trace saved by `Trace.save_jsonl`."""
    path = Path(path)
    meta: dict = {}
    rows: list[dict] = []
    with open(path) as f:
        for n, obj in json_objects(f, path):
            if "meta" in obj and n == 1:
                meta = dict(obj["meta"])
                continue
            rows.append(request_from_dict(obj, f"{path} line {n}"))
    if not rows:
        raise TraceError(f"{path}: no requests")
    meta.setdefault("source", str(path))
    return Trace(rows, meta)

"""Reading the rows of a public trace file: the field parsers and column lookups every format's
reader (`traces.formats`) shares, each error naming the file and the line."""
from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

from traces import schema
from traces.trace import TraceError

# One parsed row: (file line, data-row index, time in seconds from the format's own origin,
# prompt length, output length, prefix-block hashes or None, priority class or None, TTFT target
# in ms or None).
Record = tuple[int, int, float, int, int, "tuple[int, ...] | None", "str | None", "float | None"]
# Optional in every format: a request's priority class and its own TTFT target (`queue=priority`)
CLASS_COLUMN, TARGET_COLUMN = "class", "ttft_slo_ms"


@dataclass
class Reading:
    """One pass over one file: where errors point, and what was dropped or changed on the way."""
    path: Path
    options: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # format-specific facts for the trace's metadata
    dropped: dict = field(default_factory=dict)  # reason -> rows dropped

    def error(self, line: int, problem: str) -> TraceError:
        return TraceError(f"{self.path} line {line}: {problem}")

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


@dataclass(frozen=True)
class Format:
    """A file format: the columns that identify it and the reader that turns rows into records."""
    name: str
    columns: tuple[tuple[str, ...], ...]  # each required column as its accepted names, first = canonical
    reader: Callable[[TextIO, Reading], Iterator[Record]]
    options: tuple[str, ...] = ()  # loader options it takes (besides `seed`, which any format accepts)
    about: str = ""


def parse_count(text: str, what: str, r: Reading, line: int) -> int:
    """A token count written as text: a whole number in [0, MAX_TOKENS] (`12.0` accepted; `traces.schema`)."""
    try:
        return schema.text_count(text, what)
    except schema.FieldError as e:
        raise r.error(line, str(e)) from None


def parse_seconds(text: str, what: str, r: Reading, line: int, scale: float = 1.0) -> float:
    """A numeric time stamp written as text, finite, in seconds after multiplying by `scale`."""
    try:
        return schema.text_seconds(text, what, scale)
    except schema.FieldError as e:
        raise r.error(line, str(e)) from None


def parse_timestamp(text: str) -> datetime:
    """ISO date-time as the Azure traces write it; fractional seconds beyond 6 digits are cut.

    Azure 2023 writes 7 fractional digits (`2023-11-16 18:17:03.9799600`), which `fromisoformat`
    rejects before Python 3.11; Azure 2024 writes `+00:00` and 6 or 0 digits. A trailing `Z` means
    UTC. Cutting the 7th digit loses 100 ns, far below any scheduling time.
    """
    s = text.strip()
    dot = s.find(".")
    if dot != -1 and s[dot + 7:dot + 8].isdigit():  # a 7th fractional digit: cut from there on
        end, n = dot + 8, len(s)
        while end < n and s[end].isdigit():
            end += 1
        s = s[:dot + 7] + s[end:]
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    return datetime.fromisoformat(s)


def open_csv(f: TextIO, fmt: Format, r: Reading) -> tuple[list[str], list[int], Iterator[tuple[int, int, list[str]]]]:
    """Read the header now; return its lowercased names, the format's column indexes, and the rows.

    The rows come as (line, data-row index, fields), blank lines skipped, one at a time.
    """
    reader = csv.reader(f)
    header = next((row for row in reader if any(c.strip() for c in row)), None)
    if header is None:
        raise TraceError(f"{r.path}: empty file")
    cols = column_indexes(header, fmt, r, reader.line_num)
    need = max(cols) + 1

    def rows() -> Iterator[tuple[int, int, list[str]]]:
        index = 0
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) < need:
                raise r.error(reader.line_num, f"expected {len(header)} fields, got {len(row)}")
            yield reader.line_num, index, row
            index += 1

    return [h.strip().lower() for h in header], cols, rows()


def column_indexes(header: list[str], fmt: Format, r: Reading, line: int = 1) -> list[int]:
    """The index of each of the format's required columns, matched by name, case-insensitively."""
    names = [h.strip().lower() for h in header]
    out = []
    for accepted in fmt.columns:
        found = next((names.index(a.lower()) for a in accepted if a.lower() in names), None)
        if found is None:
            raise r.error(line, f"missing column {accepted[0]!r} for the {fmt.name} format "
                             f"(header: {','.join(h.strip() for h in header)})")
        out.append(found)
    return out


def optional_column(header_names: list[str], name: str) -> int | None:
    low = name.lower()
    return header_names.index(low) if low in header_names else None


def class_columns(header_names: list[str]) -> tuple[int | None, int | None]:
    """Where the optional `class` and `ttft_slo_ms` columns are (None: absent)."""
    return optional_column(header_names, CLASS_COLUMN), optional_column(header_names, TARGET_COLUMN)


def parse_class(row: list[str], cols: tuple[int | None, int | None], r: Reading, line: int
                ) -> tuple[str | None, float | None]:
    """A CSV row's class and TTFT target (an empty field: none), through `traces.schema`."""
    ic, it = cols
    if max(i for i in (ic, it, -1) if i is not None) >= len(row):
        raise r.error(line, f"expected a {CLASS_COLUMN}/{TARGET_COLUMN} field, got {len(row)} fields")
    try:
        return (None if ic is None else schema.text_class(row[ic]),
                None if it is None else schema.text_target_ms(row[it], TARGET_COLUMN))
    except schema.FieldError as e:
        raise r.error(line, str(e)) from None

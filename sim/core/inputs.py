"""Reading input files: every way a path can fail to be readable text is one line naming the file.

Why one place: traces, profiles, reports and partial results are all read by path, and each of
them used to say something different (or show a traceback) for a directory, a FIFO, a file it
may not read, a binary file or a JSON document nested a thousand deep. Here:

- `check_file` stats the path before opening it: a directory, a FIFO (opening one would block
  until some writer comes), a device such as /dev/zero, a missing or unreadable file each get
  their own words;
- text is UTF-8, with or without a byte-order mark, for every input alike;
- JSON is strict: `NaN`, `Infinity` and `-Infinity` are refused (they are not JSON, and a NaN
  coefficient would make every metric undefined without a word), nesting is bounded, and an
  integer too long for Python to convert is a bad value, not a crash.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import IO

from sim.core.errors import InputError

ENCODING = "utf-8-sig"  # UTF-8; a leading byte-order mark is accepted and dropped
MAX_DEPTH = 64  # deepest JSON nesting any pdsim input needs is 5; beyond this a file is not ours


class JSONInputError(ValueError):
    """Text that is not strict JSON; the message says where and why (without the file's name)."""


def _error(error: type[Exception] | None) -> type[Exception]:
    return InputError if error is None else error


def check_file(path: str | Path, what: str, error: type[Exception] | None = None) -> Path:
    """`path` as a readable regular file, or `error` with one line: '{what} {path}: {problem}'."""
    error = _error(error)
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} {path}: no such file") from None
    except NotADirectoryError:
        raise error(f"{what} {path}: no such file (a folder in the path is a file)") from None
    except PermissionError:
        raise error(f"{what} {path}: permission denied (cannot look into its folder)") from None
    except OSError as e:
        raise error(f"{what} {path}: cannot read it ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise error(f"{what} {path}: {kind}, not a regular file; pdsim reads files it can read twice")
    if not os.access(path, os.R_OK):
        raise error(f"{what} {path}: permission denied (not readable by this user)")
    return path


def open_text(path: str | Path, what: str, error: type[Exception] | None = None, newline: str | None = None) -> IO[str]:
    """`check_file`, then the file opened as UTF-8 text (a byte-order mark accepted)."""
    path = check_file(path, what, error)
    try:
        return open(path, encoding=ENCODING, newline=newline)
    except OSError as e:
        raise _error(error)(f"{what} {path}: cannot open it ({e.strerror or e})") from None


def not_text(path: str | Path, what: str, e: UnicodeDecodeError, error: type[Exception] | None = None,
             line: int | None = None) -> Exception:
    """The one-line error for a file that is not UTF-8 text (binary, or latin-1 and the like)."""
    where = f" near line {line}" if line else ""
    return _error(error)(f"{what} {path}{where}: not UTF-8 text (byte 0x{e.object[e.start]:02x} "
                         f"cannot be decoded); pdsim reads UTF-8 files")


def read_text(path: str | Path, what: str, error: type[Exception] | None = None) -> str:
    """The whole file as text, or one line naming it."""
    with open_text(path, what, error) as f:
        try:
            return f.read()
        except UnicodeDecodeError as e:
            raise not_text(path, what, e, error) from None
        except OSError as e:
            raise _error(error)(f"{what} {path}: cannot read it ({e.strerror or e})") from None


def _refuse_constant(name: str):
    raise JSONInputError(f"{name} is not a JSON value (write null for an undefined figure)")


def loads(text: str):
    """Strict JSON (`JSONInputError` on anything else): no NaN or Infinity, nesting bounded."""
    try:
        obj = json.loads(text, parse_constant=_refuse_constant)
    except JSONInputError:
        raise
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}" if "\n" in text.rstrip() else f"column {e.colno}"
        raise JSONInputError(f"not JSON ({e.msg} at {where})") from None
    except RecursionError:
        raise JSONInputError(f"JSON nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise JSONInputError(f"not JSON ({e})") from None
    if depth(obj) > MAX_DEPTH:
        raise JSONInputError(f"JSON nested too deeply (more than {MAX_DEPTH} levels)")
    return obj


def depth(obj, limit: int = MAX_DEPTH) -> int:
    """How deeply lists and objects nest in `obj` (stops counting past `limit`)."""
    level, frontier = 0, [obj]
    while frontier and level <= limit:
        nxt = []
        for x in frontier:
            if isinstance(x, dict):
                nxt.extend(x.values())
            elif isinstance(x, list):
                nxt.extend(x)
        if not nxt:
            break
        level += 1
        frontier = nxt
    return level


def read_json(path: str | Path, what: str, error: type[Exception] | None = None):
    """A strict JSON document from a file, or one line naming `what`, the file and the problem."""
    text = read_text(path, what, error)
    try:
        return loads(text)
    except JSONInputError as e:
        raise _error(error)(f"{what} {path}: {e}") from None


def read_json_object(path: str | Path, what: str, error: type[Exception] | None = None) -> dict:
    data = read_json(path, what, error)
    if not isinstance(data, dict):
        raise _error(error)(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data

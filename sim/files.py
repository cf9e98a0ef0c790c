"""Writing results without ever losing data: atomic replace, no silent overwrite, strict JSON.

Strict JSON: an undefined figure (NaN, infinity) is written as null, never as the bare `NaN` that
Python's json module writes by default and that JavaScript's `JSON.parse` (and most tools) reject.
Every JSON pdsim writes goes through `dumps`.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path


class ExistsError(FileExistsError):
    """The output path exists and the user did not ask to overwrite it."""


def atomic_write_text(path: str | Path, text: str, overwrite: bool = False) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ExistsError(f"{path} exists; not overwriting it (pass --overwrite, or choose another path)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_json_object(path: str | Path, what: str, error: type[Exception] | None = None) -> dict:
    """Read a JSON object; raise `error` with one line naming `what`, the file and the problem."""
    if error is None:
        from sim.errors import InputError as error
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path}: no such file")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what} {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{what} {path}: expected a JSON object")
    return data


def jsonable(x):
    """`x` with only JSON values: non-finite floats become None, numpy scalars and arrays Python
    values, tuples lists (dicts and lists are copied, other objects left for `json` to refuse)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalars and arrays
        return jsonable(x.tolist())
    return x


def dumps(obj, **kwargs) -> str:
    """Strict JSON text of `obj` (see `jsonable`); a value JSON cannot hold is an error."""
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)


def atomic_write_json(path: str | Path, obj, overwrite: bool = False) -> None:
    atomic_write_text(path, dumps(obj, indent=1) + "\n", overwrite=overwrite)

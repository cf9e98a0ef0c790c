"""Writing results without ever losing data: atomic replace, and no silent overwrite."""
from __future__ import annotations

import json
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


def read_json_object(path: str | Path, what: str, error: type[Exception] = ValueError) -> dict:
    """Read a JSON object; raise `error` with one line naming `what`, the file and the problem."""
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


def atomic_write_json(path: str | Path, obj, overwrite: bool = False) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=_jsonable) + "\n", overwrite=overwrite)


def _jsonable(x):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")

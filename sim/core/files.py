"""Writing results without ever losing data: atomic replace, no silent overwrite, strict JSON.

- Atomic: a result is written to a temporary file beside its path and renamed onto it, so a
  reader (or a crash) never sees half a file.
- Modes: a new file gets the mode the user's umask gives any new file (0644 under umask 022),
  not the 0600 of a temporary file; a replaced file (`--overwrite`) keeps the mode it had.
- Refusals: an existing file is replaced only with `overwrite`; a path that is an input of the
  same command, a directory, or under a regular file is refused; a folder pdsim may not write is
  one line (`OutputError`), never a traceback. `check_output` says all of this before any work.
- Strict JSON: an undefined figure (NaN, infinity) is written as null, never as the bare `NaN`
  that Python's json module writes by default and that JavaScript's `JSON.parse` (and most
  tools) reject. Every JSON pdsim writes goes through `dumps`.
"""
from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable

from sim.core.errors import UserError


class ExistsError(UserError, FileExistsError):
    """The output path exists and the user did not ask to overwrite it."""


class OutputError(UserError):
    """An output path pdsim cannot or must not write (a folder, an input, a read-only place)."""


def new_file_mode() -> int:
    """The mode a new file gets under the current umask (os.umask can only be read by setting it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output(path: str | Path, overwrite: bool = False, inputs: Iterable[str | Path | None] = (),
                 folder: bool = False, what: str = "output") -> Path:
    """Refuse, in one line and before any work, an output `path` that cannot or must not be written:
    an existing file without `overwrite`, a directory where a file goes (or a file where a
    folder goes), one of the command's `inputs`, a place under a regular file, a folder this user
    may not write. Returns the path."""
    path = Path(path)
    if path.exists():
        if folder and not path.is_dir():
            raise OutputError(f"{what} {path}: is a file, not a folder")
        if not folder and path.is_dir():
            raise OutputError(f"{what} {path}: is a directory; give a file name")
        if not folder and not overwrite:
            raise ExistsError(f"{path} exists; not overwriting it (pass --overwrite, or choose another path)")
        for inp in inputs:
            if inp is not None and Path(inp).exists() and _same(path, Path(inp)):
                raise OutputError(f"{what} {path}: is also an input of this command; write the result elsewhere")
    base = path if folder and path.is_dir() else _nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputError(f"{what} {path}: cannot be created, {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path}: cannot write into {base} (permission denied)")
    return path


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"cannot create folder {folder}: {_nearest_existing(folder)} is a file") from None
    except NotADirectoryError:
        raise OutputError(f"cannot create folder {folder}: {_nearest_existing(folder)} is a file") from None
    except PermissionError:
        raise OutputError(f"cannot create folder {folder}: permission denied") from None
    except OSError as e:
        raise OutputError(f"cannot create folder {folder}: {e.strerror or e}") from None


def atomic_write_bytes(path: str | Path, data: bytes, overwrite: bool = False) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path}: is a directory; not replacing it with a file")
    old = None
    try:
        old = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass
    if old is not None and not overwrite:
        raise ExistsError(f"{path} exists; not overwriting it (pass --overwrite, or choose another path)")
    _mkdir(path.parent)
    mode = stat.S_IMODE(old.st_mode) if old is not None else new_file_mode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except PermissionError:
        raise OutputError(f"cannot write {path}: permission denied in {path.parent}") from None
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, FileExistsError):
            raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        raise


def atomic_write_text(path: str | Path, text: str, overwrite: bool = False) -> None:
    atomic_write_bytes(path, text.encode(), overwrite=overwrite)


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

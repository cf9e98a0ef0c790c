"""A partial-results file: a header saying what work it holds, then one measurement per line.

An interrupted calibration resumes from its `*.partial.jsonl`. What can go wrong, and what this
module does about it:

- a crash mid-write leaves a torn last line: it is cut off before anything is appended, so the
  next measurement starts on a line of its own (it used to be glued to the fragment, and then
  dropped on the following resume as an unreadable line: 10 measured, 9 kept). A line that a
  file from before this fix glued together is recovered: its complete record is the tail;
- an empty file, or one whose header line is torn (interrupted as it was created), holds no
  measurement: it is started afresh, not called "a different calibration";
- a header that is not JSON is named as such; a header of other work is refused in one line
  that says which fields differ;
- two processes appending to one file would interleave their records: the file is locked
  (fcntl.flock) while it is open, and a second writer is refused at once.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from sim.core.errors import UserError
from sim.core.files import new_file_mode


class Journal:
    """`with Journal(path, header, "calibration") as j:` the records already there are `j.records`;
    `j.append(record)` adds one (flushed and synced: it survives a kill the moment it returns)."""

    def __init__(self, path: str | Path, header: dict, what: str = "calibration") -> None:
        self.path, self.what = Path(path), what
        self.header = json.loads(json.dumps(header))  # as it reads back from the file
        self.records: list[dict] = []
        self._fd: int | None = None

    def __enter__(self) -> "Journal":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, new_file_mode())
        except OSError as e:
            raise UserError(f"{self.path}: cannot open the partial results ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{self.path}: another pdsim is measuring into it now; wait for it to finish, "
                            "or write the profile elsewhere with -o") from None
        self._fd = fd
        try:
            self._read()
        except BaseException:
            self.close()
            raise
        return self

    def _read(self) -> None:
        fd = self._fd
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0) if size else b""
        end = data.rfind(b"\n") + 1  # bytes after the last newline: a line torn by a crash
        lines = data[:end].split(b"\n")[:-1]
        if not lines:  # new, empty, or only a torn header: nothing was measured into it
            os.ftruncate(fd, 0)
            self._write(self.header)
            return
        try:
            head = json.loads(lines[0])
        except (ValueError, UnicodeDecodeError):
            raise UserError(f"{self.path}: line 1 is not a partial-results header (not JSON); it is not pdsim's, "
                            "or it is damaged: delete it to start over") from None
        if head != self.header:
            keys = sorted(k for k in set(head) | set(self.header) if head.get(k) != self.header.get(k)) \
                if isinstance(head, dict) else ["the header"]
            raise UserError(f"{self.path}: partial results of a different {self.what} ({', '.join(keys)} differ); "
                            "delete it to start over, or write the profile elsewhere with -o")
        if end < len(data):  # the work is this one's: cut the torn line, so the next record starts a line
            os.ftruncate(fd, end)
        for line in lines[1:]:
            record = _record(line)
            if record is not None:
                self.records.append(record)

    def append(self, record: dict) -> None:
        self._write(record)
        self.records.append(record)

    def _write(self, record: dict) -> None:
        os.write(self._fd, (json.dumps(record) + "\n").encode())
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __exit__(self, *exc) -> None:
        self.close()

    def delete(self) -> None:
        """The work is done and saved elsewhere: remove the file (while still holding it)."""
        self.path.unlink(missing_ok=True)


def _record(line: bytes) -> dict | None:
    """One record; for a line where an older pdsim glued a record to a torn fragment, the record
    at its end; None for a line with none."""
    try:
        text = line.decode()
    except UnicodeDecodeError:
        return None
    try:
        obj = json.loads(text)
        return obj if isinstance(obj, dict) else None
    except ValueError:
        pass
    start = text.find('{"', 1)
    while start != -1:
        try:
            obj = json.loads(text[start:])
            if isinstance(obj, dict):
                return obj
        except ValueError:
            pass
        start = text.find('{"', start + 1)
    return None

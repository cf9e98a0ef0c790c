"""An output folder written by one process at a time, whose files always belong together.

Two `pdsim sweep -o DIR` at once used to both say "wrote", one replacing the other, and left
`results.csv` of one sweep beside `results.json` of the other. Now:

- a lock: the folder's `.pdsim.lock`, held (fcntl.flock) from before the command's first second of
  work to its end; a second writer is refused at once, in one line naming the first one's pid.
  The lock lives inside the folder, so it needs no file beside it, and the kernel releases it when
  the process ends, however it ends;
- staging: the files are written into a fresh hidden sibling folder, then moved in, the
  results document last; the files it replaces (and an older run's logs) are moved out first,
  so no file of the old run stays beside the new ones;
- a record: the results document names the SHA-256 of every other file it belongs with
  (`digests`), so a reader can prove the set is whole even after a crash between two moves.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from sim.core.files import ExistsError, OutputError, check_output

LOCK = ".pdsim.lock"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class OutputFolder:
    """`with OutputFolder(out, names, overwrite) as folder:` write into `folder.staging`, then
    `folder.commit(last=...)`. `names`: the entries this command owns in `out` (files or folders),
    refused if present without `overwrite`, replaced as a set with it."""

    def __init__(self, out: str | Path, names: Iterable[str], overwrite: bool = False, what: str = "output folder"):
        self.out, self.names, self.overwrite, self.what = Path(out), tuple(names), overwrite, what
        self._fd: int | None = None
        self._created = False
        self._staging: Path | None = None

    def __enter__(self) -> "OutputFolder":
        check_output(self.out, self.overwrite, folder=True, what=self.what)
        if not self.overwrite:
            self.refuse_existing(self.names)
        if not self.out.exists():
            try:
                self.out.mkdir(parents=True)
            except FileExistsError:
                pass  # another process made it just now: the lock decides
            except OSError as e:
                raise OutputError(f"{self.what} {self.out}: cannot create it ({e.strerror or e})") from None
            else:
                self._created = True
        self._lock()
        if not self.overwrite:  # again, under the lock: another writer may have finished meanwhile
            self.refuse_existing(self.names)
        return self

    def refuse_existing(self, names: Iterable[str]) -> None:
        for name in names:
            if (self.out / name).exists() or (self.out / name).is_symlink():
                raise ExistsError(f"{self.out / name} exists; not overwriting it (pass --overwrite, or another -o)")

    def _lock(self) -> None:
        path = self.out / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OutputError(f"{self.what} {self.out}: cannot write into it ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputError(f"{self.what} {self.out}: another pdsim (pid {holder}) is writing its results now; "
                              "wait for it to finish, or choose another -o") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @property
    def staging(self) -> Path:
        """A fresh hidden folder beside `out` (same file system: its entries move in by rename)."""
        if self._staging is None:
            try:
                self._staging = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.staging-", dir=self.out.parent))
            except OSError as e:
                raise OutputError(f"{self.what} {self.out}: cannot write beside it ({e.strerror or e})") from None
        return self._staging

    def commit(self, last: str) -> None:
        """Move the staged entries into `out`, `last` (the results document) after all others; the
        entries of `names` a previous run left there are moved out first and deleted."""
        staged = sorted(os.listdir(self.staging), key=lambda n: (n == last, n))
        trash = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.old-", dir=self.out.parent))
        modes = {}
        try:
            for name in [last] + [n for n in self.names if n != last]:  # the old results document first
                old = self.out / name
                if old.exists() or old.is_symlink():
                    if old.is_file():
                        modes[name] = os.stat(old).st_mode & 0o7777  # --overwrite keeps a file's mode
                    os.replace(old, trash / name)
            for name in staged:  # the new results document last
                if name in modes and (self.staging / name).is_file():
                    os.chmod(self.staging / name, modes[name])
                os.replace(self.staging / name, self.out / name)
        except OSError as e:
            raise OutputError(f"{self.what} {self.out}: cannot move the results in ({e.strerror or e})") from None
        finally:
            shutil.rmtree(trash, ignore_errors=True)

    def __exit__(self, kind, exc, tb) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
        if self._fd is not None:
            if kind is not None and self._created:  # nothing was written: leave no empty folder behind
                try:
                    os.unlink(self.out / LOCK)
                    self.out.rmdir()
                except OSError:
                    pass
            os.close(self._fd)
            self._fd = None

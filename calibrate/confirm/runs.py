"""`<report>.runs/`: where a confirm's finished runs wait for an interrupted confirm to resume.

Why a module of its own: a resume must prove it resumes the same work. A confirm interrupted
after two runs on an 8-request trace and resumed with a 4-request one used to report the old
runs as measurements of the new trace (makespan -81%, tok/s +167%, exit 0). The folder records
the work its runs measure (`what.json`: trace SHA-256, settings, model, profile digest,
protocol); a resume of other work is refused in one line naming what differs, and each run file
names its setting and trace, so a file of another run is refused too. The folder is locked while
a confirm uses it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

from sim.core.errors import UserError
from sim.core.files import atomic_write_json, dumps
from traces.trace import Trace


def model_spec(prof: dict) -> dict:
    """The worker's model: what the profile was measured on."""
    m = prof["model"]
    return {"name": m["name"], "dtype": m.get("dtype", "float32"), "quant_bits": m.get("quant_bits"),
            "weights": m.get("weights")}

RUNS_MANIFEST = "what.json"  # in `<report>.runs/`: the work its runs measure


def runs_manifest(prof: dict, trace: Trace, settings: list[dict], repeats: int, warmup: int, cooldown: float,
                  warmup_with: str = "trace") -> dict:
    """What a confirm's runs measure: a resume must be of this same work, or nothing is reused."""
    return {"pdsim_confirm_runs": 1, "trace_sha256": trace.sha256(), "settings": settings, "model": model_spec(prof),
            "profile_sha256": profile_digest(prof),
            "protocol": {"repeats": repeats, "warmup": warmup, "warmup_with": warmup_with, "cooldown_s": cooldown}}


def profile_digest(prof: dict) -> str:
    return hashlib.sha256(dumps({k: v for k, v in prof.items() if k != "_path"}, sort_keys=True).encode()).hexdigest()


class RunsFolder:
    """`<report>.runs/`, where finished runs wait for an interrupted confirm to resume: locked while
    a confirm uses it, and holding the manifest of the work its runs measure. A resume with other
    inputs (another trace, settings, model, profile or protocol) is refused in one line naming
    what differs, before anything runs: its runs would be reported as measurements of the new work."""

    def __init__(self, folder: Path, manifest: dict) -> None:
        self.folder, self.manifest = folder, json.loads(dumps(manifest))
        self._fd: int | None = None

    def __enter__(self) -> "RunsFolder":
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / ".pdsim.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"{self.folder}: cannot keep the runs there ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{self.folder}: another pdsim confirm is running into it now; wait for it, "
                            "or choose another -o") from None
        self._fd = fd
        try:
            self._check()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _check(self) -> None:
        path = self.folder / RUNS_MANIFEST
        runs = sorted(self.folder.glob("r*.json"))
        text = path.read_text() if path.is_file() else ""
        if not text.strip():  # never written, or cut short as it was: only runs of no known work can be here
            if runs:
                raise UserError(f"{self.folder}: holds {len(runs)} run(s) but no record of what they measured "
                                f"(an older pdsim, or a damaged {RUNS_MANIFEST}); delete the folder to measure afresh")
            atomic_write_json(path, self.manifest, overwrite=True)
            return
        try:
            have = json.loads(text)
        except ValueError:
            raise UserError(f"{path}: not JSON (damaged); delete {self.folder} to measure afresh") from None
        if have != self.manifest:
            keys = {"trace_sha256": "trace", "settings": "settings", "model": "model", "profile_sha256": "profile",
                    "protocol": "protocol (repeats, warm-up, cool-down)"}
            differ = [name for k, name in keys.items() if not isinstance(have, dict) or have.get(k) != self.manifest.get(k)]
            raise UserError(f"{self.folder}: holds runs of other work (its {', '.join(differ) or 'record'} "
                            "differ from this confirm's); delete it to measure afresh, or choose another -o")

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def finished_run(path: Path, setting: dict, sha: str, pipelined: bool = False) -> dict | None:
    """The run saved at `path`, or None if there is none to reuse (never written, or empty or cut
    short by an interrupted write: measured again). A run of another setting or trace, or timed
    the other way (`pipelined`: `calibrate.engine.batchgen`), is refused."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        print(f"note: {path} is empty or cut short (an interrupted write); measuring that run again")
        return None
    if not isinstance(data, dict) or "log" not in data:
        print(f"note: {path} holds no run; measuring that run again")
        return None
    if data.get("setting") != json.loads(dumps(setting)) or data.get("trace_sha256", sha) != sha:
        raise UserError(f"{path}: a run of another setting or trace than this confirm's; delete "
                        f"{path.parent} to measure afresh")
    if bool(data["log"].get("pipelined")) != pipelined:
        raise UserError(f"{path}: a run timed {'synchronized' if pipelined else 'pipelined'}, where this confirm's "
                        f"profile times BatchGenerator {'pipelined' if pipelined else 'synchronized'}; delete "
                        f"{path.parent} to measure afresh")
    return data

"""What a report reads: sweep folders, confirm reports, single-run logs; clear errors for bad ones."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sim.core.errors import UserError
from sim.core.inputs import read_json_object
from sim.engine.log import EventLog


class ReportError(UserError, ValueError):
    """An input the report cannot read; the message names the file and the problem."""


@dataclass
class LogSeries:
    """An event log to draw: where it came from, which setting produced it, on which trace."""
    label: str
    policy: str
    source: str  # "simulated" or "measured"
    log: EventLog
    trace: str = ""  # the trace's name, for a reader
    trace_sha256: str = ""  # the trace's identity: runs of different traces are never drawn as one


@dataclass
class Sweep:
    df: pd.DataFrame
    doc: dict
    logs: list[LogSeries] = field(default_factory=list)


def _read_json(path: str | Path, what: str) -> dict:
    return read_json_object(path, what, ReportError)


def log_of(d, where: str) -> EventLog:
    try:
        return EventLog.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{where}: not an event log ({type(e).__name__}: {e})") from None


def load_sweep(directory: str | Path) -> Sweep:
    """results.json of `pdsim sweep` (rows, inputs, picks) and any logs it saved; refused if a file
    it names does not have the SHA-256 it recorded (files of two sweeps, or of an interrupted one)."""
    from sim.core.outdir import file_sha256
    from sim.metrics.logfile import LogFileError, read_log
    directory = Path(directory)
    if not directory.is_dir():
        raise ReportError(f"sweep {directory}: no such directory")
    doc = _read_json(directory / "results.json", "sweep results")
    if not isinstance(doc.get("rows"), list) or not doc["rows"]:
        raise ReportError(f"sweep results {directory / 'results.json'}: no rows")
    digests = doc.get("digests") if isinstance(doc.get("digests"), dict) else {}  # (older sweeps recorded none)
    for name, digest in digests.items():
        path = directory / name
        if path.is_file() and file_sha256(path) != digest:
            raise ReportError(f"sweep {directory}: {name} does not belong to its results.json (it is another "
                              "sweep's, or a sweep was interrupted while writing); run the sweep again")
    logs = []
    for entry in doc.get("logs", []):
        path = directory / entry["file"]
        if not path.is_file():
            continue
        if path.suffix == ".npz":
            try:
                d, log = read_log(path)
            except LogFileError as e:
                raise ReportError(str(e)) from None
        else:  # sweeps before logs were columnar files
            d = _read_json(path, "sweep log")
            log = log_of(d["log"], str(path))
        trace, rate = d.get("trace") or {}, d.get("rate_scale", 1.0)
        scaled = f" x{rate:g}" if rate != 1 else ""  # arrivals scaled: other traffic
        logs.append(LogSeries(d["label"], d["setting"]["policy"], "simulated", log,
                              trace.get("name", entry.get("trace", "")) + scaled, trace.get("sha256", "") + scaled))
    return Sweep(pd.DataFrame(doc["rows"]), doc, logs)


def load_confirm(path: str | Path) -> dict:
    """A `pdsim confirm` report: predicted vs measured per setting, and each run's log."""
    doc = _read_json(path, "confirm report")
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise ReportError(f"confirm report {path}: missing or empty 'results'")
    for i, r in enumerate(results):
        for key in ("label", "predicted", "measured"):
            if key not in r:
                raise ReportError(f"confirm report {path}: results[{i}] has no {key!r}")
    return doc


def load_simulate(path: str | Path) -> dict:
    """What `pdsim simulate` wrote: its `--json-out` (the event log in the `--log-out` file it
    names, or inline as older versions wrote it), or a `--log-out` file itself. `log` is an EventLog."""
    from sim.metrics.logfile import LogFileError, read_log
    path = Path(path)
    try:
        if path.suffix == ".npz":
            meta, log = read_log(path)
            return dict(meta, log=log)
        doc = _read_json(path, "simulate output")
        if "log" in doc:
            return dict(doc, log=log_of(doc["log"], str(path)))
        if isinstance(doc.get("log_file"), str):
            file = Path(doc["log_file"])
            if not file.is_absolute() and not file.exists():
                file = path.parent / file.name
            return dict(doc, log=read_log(file)[1])
    except LogFileError as e:
        raise ReportError(str(e)) from None
    raise ReportError(f"simulate output {path}: no 'log' or 'log_file' (keep the event log with "
                      "`pdsim simulate --log-out FILE.npz`, and give the report that file)")


def confirm_logs(doc: dict) -> list[LogSeries]:
    """The first repeat of each confirmed setting: the measured run to draw."""
    seen, out = set(), []
    trace = doc.get("trace") or {}
    name, sha = trace_name(trace.get("meta") or {}), trace.get("sha256", "")
    for i, run in enumerate(doc.get("runs", [])):
        if run.get("label") in seen or "log" not in run:
            continue
        seen.add(run["label"])
        policy = (run.get("setting") or {}).get("policy") or run["label"].split("/")[0]
        out.append(LogSeries(run["label"], policy, "measured", log_of(run["log"], f"confirm runs[{i}]"), name, sha))
    return out


def trace_name(meta: dict) -> str:
    """A short name for a trace from its metadata: its source's file stem, or its generator."""
    source = str(meta.get("source") or "")
    return Path(source).stem if source else ""


# --- frames: what the charts draw --------------------------------------------------------------



def load_capacity(directory: str | Path) -> tuple[dict, pd.DataFrame]:
    """capacity.json and curve.csv of `pdsim capacity` (or `pdsim tune`'s capacity folder)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ReportError(f"capacity {directory}: no such directory")
    doc = _read_json(directory / "capacity.json", "capacity results")
    if not isinstance(doc.get("settings"), list) or not isinstance(doc.get("slo"), list):
        raise ReportError(f"capacity results {directory / 'capacity.json'}: no settings or SLOs")
    try:
        curve = pd.read_csv(directory / "curve.csv")
    except (OSError, ValueError) as e:
        raise ReportError(f"capacity {directory / 'curve.csv'}: {type(e).__name__}: {e}") from None
    if not {"label", "rate_req_s"} <= set(curve.columns):
        raise ReportError(f"capacity {directory / 'curve.csv'}: not a capacity curve (no label, rate_req_s columns)")
    return doc, curve

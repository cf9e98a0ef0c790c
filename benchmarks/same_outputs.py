"""Every output a user sees, digested: the check that a change which should predict nothing new
predicts nothing new.

Runs a fixed set of commands through the CLI (the interface users have, so it runs on any
revision): simulate and sweep every policy and option over the five generators and two public
traces, on the built-in profile and on a stored CPU profile that prices page faults; confirm
--rescore of a stored report; calibrate --refit of the stored profiles. Each output is read back,
stripped of what differs from run to run (wall times, paths, creation stamps), and hashed: event
logs' columns byte for byte, scored figures (results, metrics) to 12 significant digits, since a
sum taken in another order (a batch of requests tallied at once) moves its last bits; a setting
that does not apply (an empty column, a null) is left out, so a new policy's columns are not a change.

    python benchmarks/same_outputs.py record F.json   # digests of this revision
    python benchmarks/same_outputs.py check [F.json]  # compare with F (default: the committed one)

The stored inputs are in benchmarks/fixtures/; the public traces are read from ../shared/traces.
Takes about four minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "benchmarks" / "fixtures"
SHARED = ROOT.parent / "shared" / "traces"
COMMITTED = ROOT / "benchmarks" / "same_outputs.json"
PROFILES = {"builtin": None, "cpu": FIXTURES / "cpu-qwen3-0.6b.json"}
TRACES = {  # name: arguments of --trace and its options
    "tinyllm": ["--trace", "tinyllm"],
    "poisson": ["--trace", "poisson", "--num-requests", "300", "--rate", "1.5"],
    "gamma": ["--trace", "gamma", "--num-requests", "60", "--rate", "1.5", "--burstiness", "0.333",
              "--min-in", "9", "--max-in", "333", "--min-out", "3", "--max-out", "21", "--seed", "7"],
    "metile": ["--trace", "metile", "--prompt-len", "512", "--output-len", "64"],
    "bursty": ["--trace", "bursty-classes", "--num-requests", "80", "--class-slo", "tight:ttft=500"],
    "azure": ["--trace", str(SHARED / "azure-2023" / "AzureLLMInferenceTrace_conv.csv"), "--first", "150",
              "--max-prompt", "2048", "--max-output", "256"],
    "mooncake": ["--trace", str(SHARED / "mooncake" / "synthetic_trace.jsonl"), "--first", "100",
                 "--max-prompt", "2048", "--max-output", "128", "--speed", "4"],
}
SETTINGS = ["fifo", "fifo:decode=single", "eager", "eager:batch_size=8,order=decode-first",
            "chunked:budget=32", "chunked:budget=128", "chunked:budget=512,batch_size=8",
            "chunked:budget=64,decode=single,order=decode-first", "chunked:budget=64,idle_budget=whole",
            "chunked:budget=auto:40", "chunked:budget=auto:40,idle_budget=whole",
            "chunked:budget=64,queue=sjf", "chunked:budget=64,queue=priority,aging_s=5", "fifo:queue=sjf",
            "chunked:budget=128,kv_limit=2600", "eager:kv_limit=2600,batch_size=8",
            "mlx-lm", "mlx-lm:prefill_step=64,prompt_concurrency=2,decode_concurrency=4"]
NO_METILE = {"mlx-lm", "mlx-lm:prefill_step=64,prompt_concurrency=2,decode_concurrency=4"}  # prefilled requests
# A replay follows buffer sizes and fresh memory only where its profile prices them; the built-in
# profile prices neither, so its logs' KV rows written and fresh per call are not predictions and
# are not compared.
UNPRICED = {"builtin": ("call_fresh", "call_written"), "cpu": ()}
# what differs from run to run; and a results file's digests of its log files (each log file is
# compared itself, less what `UNPRICED` leaves out)
VOLATILE = {"wall_s", "created", "calibrate_s", "build_s", "_path", "elapsed_s", "digests"}


def pdsim(*args: str) -> None:
    p = subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"pdsim {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")


def canonical(doc, tmp: str):
    """A JSON document without what changes from run to run; paths relative to their roots."""
    if isinstance(doc, dict):
        return {k: canonical(v, tmp) for k, v in doc.items() if k not in VOLATILE and v is not None}
    if isinstance(doc, list):
        return [canonical(v, tmp) for v in doc]
    if isinstance(doc, str):
        return doc.replace(tmp, "<out>").replace(str(SHARED), "<shared>").replace(str(ROOT), "<root>")
    if isinstance(doc, float):
        return float(f"{doc:.12g}")
    return doc


def csv_cell(cell: str) -> str:
    """A results table's cell, a number to 12 significant digits (`canonical`)."""
    try:
        return f"{float(cell):.12g}" if any(c in cell for c in ".eE") else cell
    except ValueError:
        return cell


def digest(path: Path, tmp: str, skip: tuple[str, ...] = ()) -> str:
    """`skip`: columns of an event log left out (`UNPRICED`)."""
    h = hashlib.sha256()
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            for k in sorted(k for k in z.files if k not in skip):
                data = np.ascontiguousarray(z[k]).tobytes()
                if k.endswith("_json"):  # a log's own header: the same canonical form as a JSON file's
                    data = json.dumps(canonical(json.loads(data), tmp), sort_keys=True).encode()
                h.update(k.encode() + data)
    elif path.suffix == ".json":
        h.update(json.dumps(canonical(json.loads(path.read_text()), tmp), sort_keys=True).encode())
    elif path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(path.read_text())))
        kept = [j for j in range(len(rows[0])) if any(r[j] for r in rows[1:])] if rows else []
        for row in rows:
            h.update(",".join(csv_cell(row[j]) for j in kept).encode() + b"\n")
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def record() -> dict[str, str]:
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for pname, prof in PROFILES.items():
            pargs = ["--profile", str(prof), "--force"] if prof else []
            for tname, targs in TRACES.items():
                settings = [s for s in SETTINGS if not (tname == "metile" and s in NO_METILE)]
                d = t / f"sweep-{pname}-{tname}"
                pdsim("sweep", *targs, *pargs, "--setting", *settings, "--workers", "2", "--no-progress",
                      "--logs", "100", "-o", str(d))
                for f in sorted(d.rglob("*")):
                    if f.is_file() and f.suffix in (".json", ".csv", ".npz"):
                        out[f"{pname}/{tname}/{f.relative_to(d)}"] = digest(f, tmp, UNPRICED[pname])
            sim = t / f"simulate-{pname}.json"
            pdsim("simulate", *TRACES["gamma"], *pargs, "--policy", "chunked", "--budget", "32",
                  "--slo", "ttft:2000", "tpot:100", "--json-out", str(sim), "--log-out", str(sim.with_suffix(".npz")))
            out[f"{pname}/simulate.json"] = digest(sim, tmp)
            out[f"{pname}/simulate.npz"] = digest(sim.with_suffix(".npz"), tmp, UNPRICED[pname])
        rescored = t / "rescored.json"
        pdsim("confirm", "--rescore", str(FIXTURES / "confirm-tiny.json"), "--profile",
              str(FIXTURES / "cpu-qwen3-tiny.json"), "--force", "-o", str(rescored))
        out["confirm-rescore.json"] = digest(rescored, tmp)
        for name in ("cpu-qwen3-tiny", "cpu-qwen3-0.6b"):
            refit = t / f"refit-{name}.json"
            pdsim("calibrate", "--refit", str(FIXTURES / f"{name}.json"), "-o", str(refit))
            out[f"refit-{name}.json"] = digest(refit, tmp)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["record", "check"])
    p.add_argument("file", nargs="?", type=Path, default=COMMITTED)
    a = p.parse_args()
    now = record()
    if a.action == "record":
        a.file.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(now)} digests to {a.file}")
        return
    before = json.loads(a.file.read_text())
    differ = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    for k in differ:
        print(f"differs: {k} ({'missing now' if k not in now else 'new' if k not in before else 'changed'})")
    print(f"{len(now) - len([k for k in differ if k in now])} of {len(now)} outputs identical to {a.file.name}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

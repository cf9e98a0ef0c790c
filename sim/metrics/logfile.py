"""Event logs on disk: one columnar file per run, written as the run goes, read back as an EventLog.

Why columnar, and why .npz: a log is millions of rows of a dozen numbers; one JSON document of it
(what `simulate --json-out` used to write) is 60 bytes a call in text, is built whole in memory
before the first byte is written (2.2 GB for the Azure conversation trace), and is slow to read.
Parquet or Arrow would be the usual columnar choice, but pyarrow is not a dependency of pdsim (it
is not installed here); numpy's .npz is: a zip of one .npy array per column, which
`numpy.load(path)` reads column by column and `pandas.DataFrame(...)` takes as it is
(`calls_frame`). Columns are appended to temporary files as the run goes and packed (deflated) at
the end, so writing a log costs no memory that grows with it.

Columns (index i of the `request_*` columns is the i-th request of the trace):
- `call_kind` (0 prefill, 1 decode, 2 sync; mlx-lm's 3 prompt, 4 first, 5 generate; 6 preempt; vLLM's 7
  mixed), `call_start`, `call_end`, `call_tokens`,
  `call_prefix`, `call_joined`, `call_left`, `call_iteration`, `call_written`, `call_fresh`,
  `call_batched`; each call's requests as `call_nrids` counts into `call_rids` (request
  indexes), its contexts as `call_ncontexts` into `call_contexts`, a prompt call's rows' chunks
  (and a mixed call's rows' tokens) as `call_nchunks` into `call_chunks` (absent in files from before mlx-lm's calls);
- `token_request`, `token_time`: every emission, grouped by request;
- `request_id` (text), `request_arrival`, `request_prompt_len`, `request_output_len`,
  `request_prefilled`, and per-request figures in seconds when the run kept them
  (`request_generated`, `request_ttft_s`, `request_tpot_s`, `request_e2el_s`,
  `request_gap_max_s`, `request_gap_p95_s`; NaN where undefined);
- `meta_json`: UTF-8 JSON of what the run was (setting, trace, profile, metrics).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from sim.core.errors import InputError
from sim.core.files import ExistsError, OutputError, dumps, new_file_mode
from sim.engine.log import Call, EventLog, RequestInfo
from sim.metrics.tally import RequestFigures, RequestTable

KINDS = ("prefill", "decode", "sync", "prompt", "first", "generate", "preempt", "mixed")  # 3-5: mlx-lm's, 7 vLLM's (`sim.engine.log.Call`)
_KIND = {k: i for i, k in enumerate(KINDS)}
CALL_COLUMNS = {"call_kind": np.int8, "call_start": np.float64, "call_end": np.float64, "call_tokens": np.int64,
                "call_prefix": np.int64, "call_joined": np.int32, "call_left": np.int32,
                "call_iteration": np.int64, "call_written": np.int64, "call_fresh": np.int64,
                "call_batched": np.bool_, "call_nrids": np.int32, "call_ncontexts": np.int32,
                "call_nchunks": np.int32}
LIST_COLUMNS = {"call_rids": np.int32, "call_contexts": np.int64, "call_chunks": np.int64, "token_request": np.int32,
                "token_time": np.float64}
FLUSH = 1 << 16


class LogWriter:
    """Streams one run's calls and emissions into `path` (.npz), written when `close` is called."""

    def __init__(self, path: str | Path, table: RequestTable, overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise ExistsError(f"{self.path} exists; not overwriting it (pass --overwrite, or choose another path)")
        self.overwrite = overwrite
        self.table = table
        self.index = {rid: i for i, rid in enumerate(table.ids)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._dir = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {e.strerror or e}") from None
        self._bufs: dict[str, list] = {name: [] for name in (*CALL_COLUMNS, *LIST_COLUMNS)}
        self._files = {name: open(self._dir / f"{name}.bin", "wb") for name in self._bufs}
        self._counts = dict.fromkeys(self._bufs, 0)
        self.calls = 0

    def call(self, c: Call) -> None:
        b = self._bufs
        b["call_kind"].append(_KIND[c.kind])
        b["call_start"].append(c.start)
        b["call_end"].append(c.end)
        b["call_tokens"].append(c.tokens)
        b["call_prefix"].append(c.prefix)
        b["call_joined"].append(c.joined)
        b["call_left"].append(c.left)
        b["call_iteration"].append(c.iteration)
        b["call_written"].append(c.written)
        b["call_fresh"].append(c.fresh)
        b["call_batched"].append(c.batched)
        b["call_nrids"].append(len(c.rids))
        b["call_rids"].extend(self.index[r] for r in c.rids)
        b["call_ncontexts"].append(len(c.contexts))
        b["call_contexts"].extend(c.contexts)
        b["call_nchunks"].append(len(c.chunks))
        b["call_chunks"].extend(c.chunks)
        self.calls += 1
        if len(b["call_kind"]) >= FLUSH:
            self._flush()

    def tokens(self, i: int, times) -> None:
        self._bufs["token_request"].extend([i] * len(times))
        self._bufs["token_time"].extend(times)
        if len(self._bufs["token_time"]) >= FLUSH:
            self._flush()

    def _flush(self) -> None:
        for name, buf in self._bufs.items():
            if buf:
                dtype = CALL_COLUMNS.get(name) or LIST_COLUMNS[name]
                np.asarray(buf, dtype).tofile(self._files[name])
                self._counts[name] += len(buf)
                buf.clear()

    def close(self, meta: dict, rows: RequestFigures | None = None) -> None:
        """Pack the columns, the request table, `rows` and `meta` into the .npz (atomically)."""
        self._flush()
        for f in self._files.values():
            f.close()
        t = self.table
        arrays = {"request_id": np.array(t.ids, dtype=str) if len(t) else np.zeros(0, "<U1"),
                  "request_arrival": t.arrival, "request_prompt_len": t.prompt_len,
                  "request_output_len": t.output_len, "request_prefilled": t.prefilled,
                  "meta_json": np.frombuffer(dumps(meta).encode(), np.uint8)}
        if rows is not None:
            arrays |= {"request_generated": rows.generated, "request_ttft_s": rows.ttft,
                       "request_tpot_s": rows.tpot, "request_e2el_s": rows.e2el,
                       "request_gap_max_s": rows.gap_max, "request_gap_p95_s": rows.gap_p95}
        tmp = self._dir / "log.npz"
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True) as z:
                for name in self._bufs:
                    dtype = np.dtype(CALL_COLUMNS.get(name) or LIST_COLUMNS[name])
                    with z.open(f"{name}.npy", "w", force_zip64=True) as out, \
                            open(self._dir / f"{name}.bin", "rb") as src:
                        np.lib.format.write_array_header_2_0(
                            out, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                                  "shape": (self._counts[name],)})
                        shutil.copyfileobj(src, out, 1 << 20)
                for name, a in arrays.items():
                    with z.open(f"{name}.npy", "w", force_zip64=True) as out:
                        np.lib.format.write_array(out, np.ascontiguousarray(a), allow_pickle=False)
            mode = os.stat(self.path).st_mode & 0o7777 if self.path.exists() else new_file_mode()
            os.chmod(tmp, mode)
            if self.path.exists() and not self.overwrite:
                raise ExistsError(f"{self.path} exists; not overwriting it (pass --overwrite, or choose another path)")
            os.replace(tmp, self.path)
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {e.strerror or e}") from None
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def abort(self) -> None:
        for f in self._files.values():
            f.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def write_log(path: str | Path, log: EventLog, meta: dict, overwrite: bool = False) -> None:
    """An in-memory `EventLog` (a measured run's, or one a Dask worker sent back) as a log file."""
    infos = list(log.requests.values())
    w = LogWriter(path, RequestTable.of(infos), overwrite)
    try:
        for c in log.calls:
            w.call(c)
        for i, info in enumerate(infos):
            times = log.tokens.get(info.rid, [])
            if times:
                w.tokens(i, times)
        w.close(meta)
    except BaseException:
        w.abort()
        raise


class LogFileError(InputError):
    """A file that is not a pdsim log file; the message names it."""


def read_log(path: str | Path) -> tuple[dict, EventLog]:
    """(meta, EventLog) of a log file written by `LogWriter`."""
    from sim.core.inputs import check_file
    path = check_file(path, "log file", LogFileError)
    try:
        with np.load(path, allow_pickle=False) as z:
            cols = {name: z[name] for name in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as e:
        raise LogFileError(f"log file {path}: not a pdsim log file ({type(e).__name__}: {e})") from None
    need = (set(CALL_COLUMNS) | set(LIST_COLUMNS)) - {"call_nchunks", "call_chunks"} | {"request_id", "request_arrival", "request_prompt_len",
                                                      "request_output_len", "request_prefilled", "meta_json"}
    if missing := sorted(need - set(cols)):
        raise LogFileError(f"log file {path}: not a pdsim log file (no {', '.join(missing[:3])})")
    try:
        meta = json.loads(cols["meta_json"].tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise LogFileError(f"log file {path}: its meta_json is not JSON") from None
    ids = [str(x) for x in cols["request_id"].tolist()]
    log = EventLog()
    for i, rid in enumerate(ids):
        log.requests[rid] = RequestInfo(rid, float(cols["request_arrival"][i]), int(cols["request_prompt_len"][i]),
                                        int(cols["request_output_len"][i]), bool(cols["request_prefilled"][i]))
        log.tokens[rid] = []
    order = np.argsort(cols["token_request"], kind="stable")
    for i, t in zip(cols["token_request"][order].tolist(), cols["token_time"][order].tolist()):
        log.tokens[ids[i]].append(t)
    rid_end = np.cumsum(cols["call_nrids"]).tolist()
    ctx_end = np.cumsum(cols["call_ncontexts"]).tolist()
    rids, ctxs = cols["call_rids"].tolist(), cols["call_contexts"].tolist()
    nchunks = cols["call_nchunks"].tolist() if "call_nchunks" in cols else [0] * len(rid_end)
    chunks, k0 = (cols["call_chunks"].tolist() if "call_chunks" in cols else []), 0
    r0 = c0 = 0
    fields = [cols[n].tolist() for n in ("call_kind", "call_start", "call_end", "call_tokens", "call_prefix",
                                          "call_joined", "call_left", "call_iteration", "call_written",
                                          "call_batched", "call_fresh")]
    for j, (k, s, e, n, pre, jn, lf, it, wr, bt, fr) in enumerate(zip(*fields)):
        log.add(Call(KINDS[k], s, e, tuple(ids[x] for x in rids[r0:rid_end[j]]), n, pre,
                     tuple(ctxs[c0:ctx_end[j]]), jn, lf, it, wr, bool(bt), fr, tuple(chunks[k0:k0 + nchunks[j]])))
        r0, c0, k0 = rid_end[j], ctx_end[j], k0 + nchunks[j]
    return meta, log


def calls_frame(path: str | Path):
    """The calls of a log file as a pandas DataFrame (one row per call, requests as counts)."""
    import pandas as pd
    with np.load(path, allow_pickle=False) as z:
        df = pd.DataFrame({name[5:]: z[name] for name in CALL_COLUMNS})
    df["kind"] = pd.Categorical.from_codes(df["kind"], KINDS)
    return df

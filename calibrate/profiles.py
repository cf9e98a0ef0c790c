"""A calibration's profile on disk, for both engines' calibrations: where it goes by default,
its creation stamp, and its atomic write (never over an existing profile unless asked)."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from calibrate.engine.model import LoadedModel
from calibrate.host.machine import speed_rules
from sim.core.errors import UserError
from sim.core.files import atomic_write_json


def write_profile(out: Path, lm: LoadedModel, quant_bits: int | None, host: dict, grid, timing: dict, fitted: dict,
                  samples: list[dict], runs: list[dict], partial: Path, overwrite: bool, **extra) -> dict:
    """A calibration's profile (pdsim's or mlx-lm's, `extra` its own fields; `quant_bits` as asked
    for, None for weights quantized already), written atomically;
    the partial file it was measured into goes only once the profile is safe."""
    prof = {
        "pdsim_profile": 1,
        "illustrative": False,
        **extra,
        "created": stamp(),
        "model": {"name": lm.name, "shapes": lm.config, "dtype": lm.dtype, "quant_bits": quant_bits,
                  "weights": lm.source, "max_context": lm.max_context},
        "device": host,
        "speed_rules": speed_rules(host),
        "grid": grid.to_dict(),
        **timing,
        **fitted,
        "samples": samples,
        "engine_runs": runs,
    }
    atomic_write_json(out, prof, overwrite=overwrite)
    partial.unlink(missing_ok=True)
    prof["_path"] = str(out)
    return prof


def refuse_existing(out: Path, overwrite: bool) -> None:
    """Before any measuring: an existing profile is replaced only when the user asks."""
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; not overwriting it (pass --overwrite, or choose another path)")


def default_profile_path(model: str, device_kind: str, engine: str = "pdsim", precision: str = "") -> Path:
    """`profiles/MODEL-KIND.json` (`MODEL-KIND-mlx-lm.json` for mlx-lm's BatchGenerator): the cached
    profile `pdsim tune` reuses for this model, device kind and engine; `precision` ("bfloat16",
    "float32-q4") names a dtype or quantization other than the device's default."""
    name = "-".join(p for p in (model, device_kind, precision, "" if engine == "pdsim" else engine) if p)
    return Path("profiles") / f"{name}.json"


def stamp() -> str:
    """The current UTC time, to the second, as profiles record it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

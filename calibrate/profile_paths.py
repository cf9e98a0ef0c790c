"""Where profiles are written by default, and how their creation time is stamped."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path


def default_profile_path(model: str, device_kind: str, engine: str = "pdsim") -> Path:
    """`profiles/MODEL-KIND.json` (`MODEL-KIND-mlx-lm.json` for mlx-lm's BatchGenerator): the cached
    profile `pdsim tune` reuses for this model, device kind and engine."""
    return Path("profiles") / (f"{model}-{device_kind}.json" if engine == "pdsim" else
                               f"{model}-{device_kind}-{engine}.json")


def stamp() -> str:
    """The current UTC time, to the second, as profiles record it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

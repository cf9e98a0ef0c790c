"""Memory a run needs: the bytes of one token of KV cache, and the KV-cache limit a setting gives.

A KV limit is given in tokens (`4096`, `4096tok`) or in bytes of cache (`2GB`, `0.5GB`, `1.5GiB`):
GB are 10^9 bytes, GiB 2^30. A limit in bytes becomes tokens through the model's bytes per KV token
(`kv_bytes_per_token`), from the model the profile names (the simulator) or the model it built
(the real executor), so both executors enforce the same number of tokens.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

from sim.errors import InputError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
UNITS = {"GB": 1e9, "GiB": float(1 << 30), "MB": 1e6, "MiB": float(1 << 20)}
MAX_TOKENS = 1 << 40  # beyond any device's memory: a typo


def kv_bytes_per_token(config: Mapping, dtype: str) -> int:
    """Bytes one token of context takes in the KV cache: layers x KV heads x head dim x 2 (keys and
    values) x the activations' bytes (mlx-lm's `KVCache` stores them in the model's dtype, quantized
    weights or not). Qwen3-0.6B: 28 x 8 x 128 x 2 x 4 = 229,376 bytes in float32."""
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if dtype not in DTYPE_BYTES:
        raise InputError(f"model dtype {dtype!r}: no KV bytes known for it (known: {', '.join(DTYPE_BYTES)})")
    return int(config["num_hidden_layers"]) * int(heads) * int(head_dim) * 2 * DTYPE_BYTES[dtype]


def profile_kv_bytes(prof: Mapping) -> int | None:
    """Bytes per KV token of the model a profile names (its `model.shapes` and `model.dtype`); None
    when the profile does not record the model's shapes."""
    model = prof.get("model", {})
    shapes, dtype = model.get("shapes"), model.get("dtype") or "float32"
    if not isinstance(shapes, Mapping) or dtype not in DTYPE_BYTES:
        return None
    whole = lambda k: isinstance(shapes.get(k), int) and not isinstance(shapes.get(k), bool) and shapes[k] > 0
    if not all(whole(k) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size")) or \
            any(shapes.get(k) is not None and not whole(k) for k in ("num_key_value_heads", "head_dim")):
        return None  # not a model's shapes pdsim can read
    return kv_bytes_per_token(shapes, dtype)


@dataclass(frozen=True)
class KVLimit:
    """A KV-cache limit as given: `tokens`, or `amount` of `unit` (GB, GiB, MB, MiB) of cache."""
    tokens: int | None = None
    amount: float | None = None
    unit: str = "GB"

    def __str__(self) -> str:
        return f"{self.tokens}" if self.tokens is not None else f"{self.amount:g}{self.unit}"

    def resolve(self, bytes_per_token: int | None) -> int:
        """The limit in tokens (a byte limit needs the model's bytes per KV token)."""
        if self.tokens is not None:
            return self.tokens
        if not bytes_per_token:
            raise InputError(f"--kv-limit {self}: the model's bytes per KV token are unknown (the profile "
                             "records no model.shapes); give the limit in tokens")
        return int(self.amount * UNITS[self.unit] // bytes_per_token)


_LIMIT = re.compile(r"^\s*(?P<num>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>tok|tokens|GB|GiB|MB|MiB)?\s*$")


def parse_kv_limit(text) -> KVLimit | None:
    """`4096`, `4096tok`, `2GB`, `0.5GB`, `512MiB` -> a KVLimit; None, "" or "none" -> no limit.
    InputError naming the text for anything else (zero, negative, fractional tokens, other units)."""
    if text is None or isinstance(text, KVLimit):
        return text
    if hasattr(text, "item") and not isinstance(text, str):  # a numpy number, from a table row
        text = text.item()
    if isinstance(text, bool):
        raise InputError(f"kv limit {text!r}: expected tokens (4096, 4096tok) or an amount of memory (2GB, 0.5GB)")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and math.isnan(text):
            return None
        text = f"{int(text)}" if float(text).is_integer() else repr(text)
    if text.strip().lower() in ("", "none"):
        return None
    m = _LIMIT.match(text)
    if not m and text.strip().startswith("-"):
        raise InputError(f"kv limit {text!r}: must be > 0")
    if not m:
        raise InputError(f"kv limit {text!r}: expected tokens (4096, 4096tok) or an amount of memory "
                         f"({', '.join('2' + u for u in UNITS)})")
    num, unit = m["num"], m["unit"] or "tok"
    if unit in ("tok", "tokens"):
        if not re.fullmatch(r"[0-9]+", num):
            raise InputError(f"kv limit {text!r}: tokens must be a whole number")
        tokens = int(num)
        if not 1 <= tokens <= MAX_TOKENS:
            raise InputError(f"kv limit {text!r}: must be between 1 and {MAX_TOKENS:,} tokens")
        return KVLimit(tokens=tokens)
    amount = float(num)
    if not (math.isfinite(amount) and amount > 0):
        raise InputError(f"kv limit {text!r}: must be a finite amount > 0")
    return KVLimit(amount=amount, unit=unit)

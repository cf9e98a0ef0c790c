"""Settings: one policy configuration, made complete where it is made.

Every caller (the CLI's grid, `--setting` strings, the Python API, confirm) builds its settings
here, so a setting always has every field, and a label names it the same way everywhere.
Options a policy's loop does not read (`policies.POLICIES[name].uses`) take one fixed value:
fifo decodes one request at a time, so fifo at batch size 4 and at 8 is the same setting, run once.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

import policies
from policies import PolicyError
from policies.budget import check_idle_budget, is_adaptive, parse_budget
from policies.mlxlm import DEFAULTS as MLX_LM_DEFAULTS
from policies.options import DEFAULTS
from policies.vllm import DEFAULTS as VLLM_DEFAULTS
from sim.core.errors import InputError
from sim.engine.memory import parse_kv_limit

DEFAULT_AGING_S = DEFAULTS["aging_s"]
# the value an option takes in a policy that does not read it
UNUSED = {"budget": None, "batch_size": 1, "decode": "batched", "order": "chunk-first", "idle_budget": "budget",
          "queue": "fcfs", "aging_s": DEFAULT_AGING_S,
          **{k: None for k in MLX_LM_DEFAULTS}, **{k: None for k in VLLM_DEFAULTS}}  # (a KV limit is never dropped)
# keys a setting's dict holds only when they differ from the default, so the dicts (and confirm
# manifests, results files) of settings that do not use them are what they were before them
SPARSE = {"idle_budget": "budget", "kv_limit": None}
KEYS = ("policy", *DEFAULTS, *MLX_LM_DEFAULTS, *VLLM_DEFAULTS)
OWN_DEFAULTS = {**MLX_LM_DEFAULTS, **VLLM_DEFAULTS}  # options of one policy each (mlx_lm.server's, vLLM's flags)
PDSIM_KEYS = ("budget", "batch_size", "decode", "order")  # in every pdsim setting's dict; the queue's when not fcfs


@dataclass(frozen=True)
class Setting:
    """A policy and its options; unread options normalized, the whole checked by `policies.make`."""
    policy: str
    budget: int | str | None = DEFAULTS["budget"]  # tokens, None (whole prompts) or "auto:MS" (`policies.budget`)
    batch_size: int = DEFAULTS["batch_size"]
    decode: str = DEFAULTS["decode"]
    order: str = DEFAULTS["order"]
    kv_limit: int | str | None = DEFAULTS["kv_limit"]  # tokens, or an amount of memory ("2GB"): `parse_kv_limit`
    queue: str = DEFAULTS["queue"]
    aging_s: float = DEFAULT_AGING_S  # read by sjf and priority only: fcfs takes the default
    prefill_step: int | None = None  # mlx-lm's three: None takes `MLX_LM_DEFAULTS`
    prompt_concurrency: int | None = None
    decode_concurrency: int | None = None
    idle_budget: str = DEFAULTS["idle_budget"]
    max_num_batched_tokens: int | None = None  # vLLM's three: None takes `VLLM_DEFAULTS`
    max_num_seqs: int | None = None
    long_prefill_token_threshold: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.budget, str):  # "auto:40.0" is auto:40; "32" (a table cell) is 32
            object.__setattr__(self, "budget", parse_budget(self.budget))
        if not isinstance(self.idle_budget, str):  # a table cell with no value
            object.__setattr__(self, "idle_budget", check_idle_budget(None))
        for key in ("budget", "batch_size", *OWN_DEFAULTS):  # from a table row: 32.0 is 32, NaN is no value
            v = getattr(self, key)
            if isinstance(v, float) or hasattr(v, "item"):
                v = float(v)
                object.__setattr__(self, key, None if math.isnan(v) else int(v) if v.is_integer() else v)
        if self.policy not in policies.POLICIES:
            raise PolicyError(f"unknown policy {self.policy!r}; known: {', '.join(policies.POLICIES)}")
        try:  # one spelling per limit: 4096 and "4096tok" are one setting, "0.50GB" is "0.5GB"
            limit = parse_kv_limit(self.kv_limit)
        except InputError as e:
            raise PolicyError(str(e)) from None
        object.__setattr__(self, "kv_limit", None if limit is None else limit.tokens or str(limit))
        uses = policies.POLICIES[self.policy].uses
        for key, value in UNUSED.items():
            if key not in uses:
                object.__setattr__(self, key, value)
            elif getattr(self, key) is None and key in OWN_DEFAULTS:
                object.__setattr__(self, key, OWN_DEFAULTS[key])
        if self.queue is None or (not isinstance(self.queue, str) and self.queue != self.queue):  # a row before queues
            object.__setattr__(self, "queue", "fcfs")
        a = self.aging_s  # seconds, a float (60 and 60.0 are one setting); NaN or None from a table row: the default
        if a is None:
            object.__setattr__(self, "aging_s", DEFAULT_AGING_S)
        elif hasattr(a, "item") or (isinstance(a, (int, float)) and not isinstance(a, bool)):
            a = float(a)
            object.__setattr__(self, "aging_s", DEFAULT_AGING_S if math.isnan(a) else a)
        if self.queue == "fcfs":  # no order to age out of: fcfs at any aging bound is one setting
            object.__setattr__(self, "aging_s", DEFAULT_AGING_S)
        policies.make(**asdict(self))  # one error, naming the bad option, before anything runs

    @classmethod
    def of(cls, s: "Setting | Mapping") -> "Setting":
        """A setting from a dict with any subset of the fields (the rest take their defaults)."""
        if isinstance(s, Setting):
            return s
        extra = sorted(set(s) - set(KEYS))
        if extra:
            raise PolicyError(f"setting {dict(s)}: unknown key(s) {', '.join(extra)}; known: {', '.join(KEYS)}")
        if "policy" not in s:
            raise PolicyError(f"setting {dict(s)}: no policy (one of {', '.join(policies.POLICIES)})")
        return cls(**s)

    def to_dict(self) -> dict:
        """The policy's family of keys: mlx-lm's own three, or pdsim's four, with the queue order and
        its aging bound only when it is not fcfs, and the idle budget and KV limit only when given
        (so a setting from before them is the same dict as before: its reports, runs folders and
        resumes unchanged)."""
        if self.policy == "mlx-lm":
            keys = ("policy", *MLX_LM_DEFAULTS)
        elif self.policy == "vllm":
            keys = ("policy", *VLLM_DEFAULTS, "kv_limit")
        else:
            keys = ("policy", *PDSIM_KEYS, *(("queue", "aging_s") if self.queue != "fcfs" else ()), *SPARSE)
        return {k: getattr(self, k) for k in keys if k not in SPARSE or getattr(self, k) != SPARSE[k]}

    @property
    def label(self) -> str:
        """`chunked/b128/bs4`, `chunked/auto:40/bs4/idle-whole`, `eager/bs4/decode-first`, `fifo/single`,
        `chunked/b64/bs4/priority`, `fifo/sjf/age60s`, `mlx-lm/s512/p4/d32`, `vllm/t512/s8/thr256`:
        the options the policy reads, those at their defaults left out."""
        budget = [] if self.budget is None else [self.budget] if isinstance(self.budget, str) else [f"b{self.budget}"]
        return "/".join([self.policy, *budget, *self.variant_parts()])

    def variant_parts(self) -> list[str]:
        """The label's parts after the policy and budget: batch size, decode mode, order, queue order
        and aging bound; for mlx-lm its step, prompt and decode concurrency (mlx_lm.server's flags)."""
        if self.policy == "mlx-lm":
            return [f"s{self.prefill_step}", f"p{self.prompt_concurrency}", f"d{self.decode_concurrency}"]
        if self.policy == "vllm":
            parts = [f"t{self.max_num_batched_tokens}", f"s{self.max_num_seqs}"]
            parts += [f"thr{self.long_prefill_token_threshold}"] if self.long_prefill_token_threshold else []
            return parts + ([f"kv{self.kv_limit}"] if self.kv_limit is not None else [])
        parts = [f"bs{self.batch_size}"] if "batch_size" in policies.POLICIES[self.policy].uses else []
        if self.decode != "batched":
            parts.append(self.decode)
        if self.order != "chunk-first":
            parts.append(self.order)
        if self.queue != "fcfs":
            parts.append(self.queue)
            if self.aging_s != DEFAULT_AGING_S:
                parts.append(f"age{self.aging_s:g}s")
        if self.idle_budget != "budget":
            parts.append(f"idle-{self.idle_budget}")
        if self.kv_limit is not None:
            parts.append(f"kv{self.kv_limit}")
        return parts


def variant_label(s: "Setting | Mapping") -> str:
    """The label without the policy and budget (`bs4`, `bs8/single`, `` for fifo): what tells apart
    settings a budget chart draws at the same budget."""
    return "/".join(Setting.of(s).variant_parts())


def setting(s: "Setting | Mapping") -> dict:
    """The complete setting dict (every key, unread options normalized)."""
    return Setting.of(s).to_dict()


def setting_label(s: "Setting | Mapping") -> str:
    return Setting.of(s).label


def grid_settings(policy_names: Iterable[str], budgets: Iterable[int | None] = (128,),
                  batch_sizes: Iterable[int] = (4,), decodes: Iterable[str] = ("batched",),
                  orders: Iterable[str] = ("chunk-first",), queues: Iterable[str] = ("fcfs",),
                  agings: Iterable[float] = (DEFAULT_AGING_S,), prefill_steps: Iterable[int | None] = (None,),
                  prompt_concurrencies: Iterable[int | None] = (None,),
                  decode_concurrencies: Iterable[int | None] = (None,),
                  idle_budgets: Iterable[str] = ("budget",),
                  kv_limits: Iterable[int | str | None] = (None,),
                  max_num_batched_tokens: Iterable[int | None] = (None,), max_num_seqs: Iterable[int | None] = (None,),
                  long_prefill_token_thresholds: Iterable[int | None] = (None,)) -> list[dict]:
    """Every combination of the options, each distinct setting once (`unique`): mlx-lm's options do
    not multiply the other policies, nor theirs mlx-lm; aging bounds do not multiply fcfs. An
    adaptive budget (`auto:MS`, idle_budget whole) in a grid where no policy reads a budget is
    refused: mlx-lm's step is fixed by its --prefill-step, and fifo and eager prefill whole prompts."""
    policy_names, budgets, idle_budgets = list(policy_names), list(budgets), list(idle_budgets)
    adaptive = [str(b) for b in budgets if is_adaptive(parse_budget(b), None)] + \
        [f"idle_budget {i}" for i in idle_budgets if is_adaptive(None, i)]
    if adaptive and not any("budget" in policies.POLICIES[p].uses for p in policy_names if p in policies.POLICIES):
        step = " (its prefill step is fixed by --prefill-step, mlx_lm.server's --prefill-step-size)" \
            if "mlx-lm" in policy_names else ""
        raise PolicyError(f"{adaptive[0]}: policy {', '.join(policy_names)} reads no chunk budget{step}; "
                          "budgets apply to chunked")
    return unique({"policy": p, "budget": b, "batch_size": bs, "decode": d, "order": o, "queue": q, "aging_s": a,
                   "prefill_step": st, "prompt_concurrency": pc, "decode_concurrency": dc, "idle_budget": ib,
                   "kv_limit": kv, "max_num_batched_tokens": t, "max_num_seqs": ns, "long_prefill_token_threshold": th}
                  for p, b, bs, d, o, q, a, st, pc, dc, ib, kv, t, ns, th in itertools.product(
                      policy_names, budgets, batch_sizes, decodes, orders, queues, agings, prefill_steps,
                      prompt_concurrencies, decode_concurrencies, idle_budgets, kv_limits, max_num_batched_tokens,
                      max_num_seqs, long_prefill_token_thresholds))


def unique(settings: Iterable["Setting | Mapping"]) -> list[dict]:
    """Complete setting dicts, each once, in first-seen order: two settings that run the same work
    (fifo at two batch sizes, eager at two budgets) are one."""
    out: dict[Setting, dict] = {}
    for s in settings:
        full = Setting.of(s)
        out.setdefault(full, full.to_dict())
    return list(out.values())

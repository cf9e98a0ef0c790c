"""Scheduling policies, by name. `make(name, **options)` builds one; `POLICIES` lists them.

A policy is a small object behind a name (`policies.base.Policy`); `POLICIES` says what each
does, which engine runs its calls, how it is built from its options, and which options its loop
reads (`policies.settings` gives the others one fixed value, so fifo at batch size 4 and at 8
is one setting, swept once).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from policies.base import Policy, PolicyError
from policies.budget import is_adaptive
from policies.chunked import Chunked, eager
from policies.fifo import Fifo
from policies.mlxlm import DEFAULTS as MLX_LM_DEFAULTS
from policies.mlxlm import MODELLED, MlxLm
from policies.options import NAMES as PDSIM_OPTIONS
from policies.options import Options
from policies.queue import DEFAULT_AGING_S, QUEUES
from policies.vllm import DEFAULTS as VLLM_DEFAULTS, Vllm


class PolicyInfo(NamedTuple):
    """A policy's one-line description, whose calls it asks for (pdsim's prefills and decodes,
    mlx-lm's BatchGenerator's, vLLM's mixed forwards), its factory (from its given options and the
    run's cost model), and the options its loop reads."""
    doc: str
    engine: str
    build: Callable[[dict, object], Policy]
    uses: tuple[str, ...]


def _chunked(o: dict, cost) -> Chunked:
    if o.get("budget") is None:
        raise PolicyError("policy 'chunked' needs a budget (--budget N)")
    return Chunked(Options(**o), cost=cost)


def _mlx_lm(o: dict, cost) -> MlxLm:
    """BatchGenerator as it is: no KV limit, no adaptive budget, arrival order (mlx_lm.server has
    no flag for any of them); pdsim's other options are not read."""
    if o.get("kv_limit") is not None:
        raise PolicyError(f"policy 'mlx-lm' takes no kv_limit ({o['kv_limit']}): mlx-lm {'/'.join(MODELLED)}'s "
                          "BatchGenerator has no KV-cache limit, admission or preemption (pdsim models it as it is)")
    if is_adaptive(Options(budget=o.get("budget")).budget, o.get("idle_budget")):
        raise PolicyError("policy 'mlx-lm' takes no budget auto:MS or idle_budget whole: its prefill step is fixed "
                          "by --prefill-step (mlx_lm.server --prefill-step-size)")
    if o.get("queue", "fcfs") != "fcfs":
        raise PolicyError(f"mlx-lm: queue must be fcfs, got {o['queue']!r} (mlx-lm's BatchGenerator admits waiting "
                          "prompts in arrival order; sjf and priority run on pdsim's fifo, eager and chunked)")
    return MlxLm(**{k: v for k, v in o.items() if k in MLX_LM_DEFAULTS})


def _vllm(o: dict, cost) -> Vllm:
    """vLLM's scheduler: its own three options and a KV limit; FCFS, fixed budgets."""
    if is_adaptive(Options(budget=o.get("budget")).budget, o.get("idle_budget")):
        raise PolicyError("policy 'vllm' takes no budget auto:MS or idle_budget whole: its token budget is "
                          "--max-num-batched-tokens")
    if o.get("queue", "fcfs") != "fcfs":
        raise PolicyError(f"vllm: queue must be fcfs, got {o['queue']!r} (pdsim models vLLM's FCFS scheduler)")
    return Vllm(**{k: v for k, v in o.items() if k in VLLM_DEFAULTS or k == "kv_limit"})


POLICIES = {
    "fifo": PolicyInfo("one request at a time: its whole prefill, then all its decodes (the meTile FIFO reference)",
                       "pdsim", lambda o, cost: Fifo(Options(**o)), ("decode", "kv_limit", "queue", "aging_s")),
    "eager": PolicyInfo("a request's whole prompt in one prefill call, then one decode for every active request",
                        "pdsim", lambda o, cost: eager(Options(**o)),
                        ("batch_size", "decode", "order", "kv_limit", "queue", "aging_s")),
    "chunked": PolicyInfo("the pending request prefills at most `budget` tokens per iteration (auto:MS: as many as "
                          "keep the predicted iteration within MS ms), then one decode for every active request",
                          "pdsim", _chunked,
                          ("budget", "batch_size", "decode", "order", "idle_budget", "kv_limit", "queue", "aging_s")),
    "mlx-lm": PolicyInfo("mlx-lm's BatchGenerator (mlx_lm.server): one step of the generation batch, then up to "
                         "`prompt_concurrency` prompts prefilled together, `prefill_step` tokens each per call",
                         "mlx-lm", _mlx_lm, tuple(MLX_LM_DEFAULTS)),
    "vllm": PolicyInfo("vLLM v1's scheduler (vLLM, vllm-metal): one forward per iteration over every running "
                       "decode and the prompt tokens `max_num_batched_tokens` leaves, running requests first",
                       "vllm", _vllm, (*VLLM_DEFAULTS, "kv_limit")),
}
MLX_LM_OPTIONS = tuple(MLX_LM_DEFAULTS)  # mlx-lm's own; no other policy's
VLLM_OPTIONS = tuple(VLLM_DEFAULTS)  # vLLM's own

OPTION_HELP = {
    "budget": "prompt tokens per iteration (chunked; fifo and eager prefill whole prompts), or auto:MS: each "
              "iteration the longest chunk whose predicted iteration time (chunk + decodes, from the profile's "
              "cost model) is <= MS milliseconds, at least 1 token",
    "idle_budget": "budget (default) | whole: the whole prompt in one call when no request is decoding "
                   "(chunked; with a fixed or an auto budget)",
    "batch_size": "maximum requests decoding at once (eager, chunked; fifo decodes one request at a time)",
    "decode": "batched (one call for all) | single (one call per request)",
    "order": "chunk-first (tiny-llm) | decode-first (meTile) (eager, chunked)",
    "kv_limit": "KV-cache limit, tokens (4096, 4096tok) or memory (2GB, 0.5GB, 1GiB; via the model's bytes per KV "
                "token); a request is admitted when its cache fits, the newest is preempted and recomputed when "
                "decodes outgrow it (vLLM's default; a preempted request resumes before new prompts in every queue "
                "order); default: what the device holds beside the weights (a calibrated profile's record; no limit "
                "with the built-in profile) (fifo, eager, chunked; not mlx-lm)",
    "queue": "which waiting prompt starts next: fcfs (arrival order) | sjf (shortest prompt first) | priority "
             "(earliest deadline first: arrival + the request's class TTFT target, --class-slo CLASS:ttft=MS) "
             "(fifo, eager, chunked; mlx-lm's BatchGenerator is FIFO only)",
    "aging_s": f"sjf, priority: a request that has waited this many seconds or longer is served first, oldest first "
               f"(default {DEFAULT_AGING_S:g}; no starvation)",
    "prefill_step": f"mlx-lm only: prompt tokens per row per call (mlx_lm.server --prefill-step-size, default "
                    f"{MLX_LM_DEFAULTS['prefill_step']})",
    "prompt_concurrency": f"mlx-lm only: prompts prefilled together (--prompt-concurrency, default "
                          f"{MLX_LM_DEFAULTS['prompt_concurrency']})",
    "decode_concurrency": f"mlx-lm only: requests generating at once; raised to at least prompt_concurrency "
                          f"(--decode-concurrency, default {MLX_LM_DEFAULTS['decode_concurrency']})",
    "max_num_batched_tokens": f"vllm only: tokens one forward may run, decodes and prompt chunks together "
                              f"(vLLM's --max-num-batched-tokens, default {VLLM_DEFAULTS['max_num_batched_tokens']})",
    "max_num_seqs": f"vllm only: requests running at once (--max-num-seqs, default {VLLM_DEFAULTS['max_num_seqs']})",
    "long_prefill_token_threshold": "vllm only: a prompt row takes at most this many tokens per forward; 0: no cap "
                                    "(--long-prefill-token-threshold, default 0)",
}


def make(policy: str, budget=None, batch_size=None, decode=None, order=None, *, cost=None, **options) -> Policy:
    """Build a policy from a setting's fields: the policy's name and its options (`Options` for
    fifo, eager and chunked, the first four also by position; `MLX_LM_OPTIONS` for mlx-lm); an
    option given as None takes its default. `cost`: the cost model of the run (the simulator's, or the profile a confirm runs
    against), which an `auto:MS` budget prices its chunks with; policies that do not need it
    ignore it."""
    if policy not in POLICIES:
        raise PolicyError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    known = PDSIM_OPTIONS + MLX_LM_OPTIONS + VLLM_OPTIONS
    unknown = [k for k in options if k not in known]
    if unknown:
        raise PolicyError(f"unknown policy option {unknown[0]!r}; known: {', '.join(known)}")
    options |= {"budget": budget, "batch_size": batch_size, "decode": decode, "order": order}
    given = {k: v for k, v in options.items() if v is not None}
    info = POLICIES[policy]
    for owner, own in (("mlx-lm", MLX_LM_OPTIONS), ("vllm", VLLM_OPTIONS)):
        foreign = [k for k in given if k in own] if policy != owner else []
        if foreign:
            raise PolicyError(f"policy {policy!r} takes no {', '.join(foreign)} (options of {owner})")
    return info.build(given, cost)


__all__ = ["DEFAULT_AGING_S", "MLX_LM_OPTIONS", "VLLM_OPTIONS", "OPTION_HELP", "POLICIES", "QUEUES", "Options", "Policy", "PolicyError",
           "PolicyInfo", "make"]

"""Scheduling policies, by name. `make(name, **options)` builds one; `POLICIES` lists them."""
from __future__ import annotations

from typing import Callable, NamedTuple

from policies.base import Options, Policy, PolicyError
from policies.budget import check_idle_budget, is_adaptive, parse_budget
from policies.chunked import Chunked, eager
from policies.fifo import Fifo
from policies.mlxlm import MODELLED, MlxLm
from policies.queue import DEFAULT_AGING_S, QUEUES
from sim.core.errors import InputError
from sim.engine.memory import parse_kv_limit


class PolicyInfo(NamedTuple):
    """A policy's one-line description, its factory (from the options and the run's cost model), and
    the options its loop reads: the others
    do not change what it runs (`policies.settings` gives them one fixed value, so fifo at batch size 4
    and at 8 is one setting, swept once)."""
    doc: str
    build: Callable[[Options, object], Policy] | None
    uses: tuple[str, ...]


POLICIES = {
    "fifo": PolicyInfo("one request at a time: its whole prefill, then all its decodes (the meTile FIFO reference)",
                       lambda o, cost: Fifo(o), ("decode", "kv_limit", "queue", "aging_s")),
    "eager": PolicyInfo("a request's whole prompt in one prefill call, then one decode for every active request",
                        lambda o, cost: eager(o), ("batch_size", "decode", "order", "kv_limit", "queue", "aging_s")),
    "chunked": PolicyInfo("the pending request prefills at most `budget` tokens per iteration (auto:MS: as many as "
                          "keep the predicted iteration within MS ms), then one decode for every active request",
                          lambda o, cost: Chunked(o, cost=cost),
                          ("budget", "batch_size", "decode", "order", "idle_budget", "kv_limit", "queue", "aging_s")),
    # built by `make` from its own options (MLX_LM_OPTIONS), not from `Options`
    "mlx-lm": PolicyInfo("mlx-lm's BatchGenerator (mlx_lm.server): one step of the generation batch, then up to "
                         "`prompt_concurrency` prompts prefilled together, `prefill_step` tokens each per call",
                         None, ("prefill_step", "prompt_concurrency", "decode_concurrency")),
}
MLX_LM_OPTIONS = ("prefill_step", "prompt_concurrency", "decode_concurrency")  # mlx-lm's own; no other policy's

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
    "prefill_step": "mlx-lm only: prompt tokens per row per call (mlx_lm.server --prefill-step-size, default 2048)",
    "prompt_concurrency": "mlx-lm only: prompts prefilled together (--prompt-concurrency, default 8)",
    "decode_concurrency": "mlx-lm only: requests generating at once; raised to at least prompt_concurrency "
                          "(--decode-concurrency, default 32)",
}


def make(policy: str, budget: int | str | None = None, batch_size: int = 4, decode: str = "batched",
         order: str = "chunk-first", idle_budget: str | None = None, kv_limit=None, queue: str = "fcfs",
         aging_s: float = DEFAULT_AGING_S, *, cost=None, **mlx_lm: int) -> Policy:
    """Build a policy from a setting dict's fields (policy name, budget, batch size, decode, order,
    idle budget, KV limit, queue order and aging bound; for mlx-lm, its `MLX_LM_OPTIONS`). `cost`:
    the cost model of the run (the simulator's, or the profile a confirm runs against), which an
    `auto:MS` budget prices its chunks with; policies that do not need it ignore it."""
    if policy not in POLICIES:
        raise PolicyError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    try:
        kv_limit = parse_kv_limit(kv_limit)
    except InputError as e:
        raise PolicyError(str(e)) from None
    if kv_limit is not None and policy == "mlx-lm":
        raise PolicyError(f"policy 'mlx-lm' takes no kv_limit ({kv_limit}): mlx-lm {'/'.join(MODELLED)}'s "
                          "BatchGenerator has no KV-cache limit, admission or preemption (pdsim models it as it is)")
    unknown = [k for k in mlx_lm if k not in MLX_LM_OPTIONS]
    if unknown:
        raise PolicyError(f"unknown policy option {unknown[0]!r}; known: budget, batch_size, decode, order, "
                          "idle_budget, kv_limit, queue, aging_s, "
                          + ", ".join(MLX_LM_OPTIONS))
    if policy == "mlx-lm":
        if is_adaptive(parse_budget(budget), idle_budget):
            raise PolicyError("policy 'mlx-lm' takes no budget auto:MS or idle_budget whole: its prefill step is fixed "
                              "by --prefill-step (mlx_lm.server --prefill-step-size)")
        if queue != "fcfs":  # BatchGenerator takes waiting prompts in arrival order, and mlx_lm.server has no flag
            raise PolicyError(f"mlx-lm: queue must be fcfs, got {queue!r} (mlx-lm's BatchGenerator admits waiting "
                              "prompts in arrival order; sjf and priority run on pdsim's fifo, eager and chunked)")
        return MlxLm(**{k: v for k, v in mlx_lm.items() if v is not None})
    if any(v is not None for v in mlx_lm.values()):
        raise PolicyError(f"policy {policy!r} takes no {', '.join(k for k, v in mlx_lm.items() if v is not None)} "
                          "(options of mlx-lm)")
    if policy == "chunked" and budget is None:
        raise PolicyError("policy 'chunked' needs a budget (--budget N)")
    return POLICIES[policy].build(Options(budget, batch_size, decode, order, check_idle_budget(idle_budget),
                                          kv_limit, queue, aging_s), cost)


__all__ = ["DEFAULT_AGING_S", "MLX_LM_OPTIONS", "OPTION_HELP", "POLICIES", "QUEUES", "Options", "Policy", "PolicyError",
           "PolicyInfo", "make"]

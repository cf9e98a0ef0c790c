"""mlx-lm: the decisions of mlx-lm's `BatchGenerator.next()`, which `mlx_lm.server` runs.

Read from `mlx_lm/generate.py` of mlx-lm 0.32.2 (`BatchGenerator._next`), and checked call by call
against the installed class by `tests/test_mlxlm_policy.py`. Each iteration (one `next()`):

1. if the generation batch has rows, one step of it (`Generate`): every row gets the token its
   previous forward sampled; rows that get their last token leave it;
2. if the generation batch still holds `decode_concurrency` rows or more, nothing else this
   iteration: waiting prompts are not admitted and the prompt batch does not advance;
3. otherwise the oldest waiting requests join the prompt batch (`JoinPrompt`, FIFO), as many as
   `prompt_concurrency` minus the prompt batch's rows (counted before step 4 frees any) allows,
   and `decode_concurrency` minus the generation batch's rows (so the generation batch can end up
   above `decode_concurrency`, by up to `prompt_concurrency - 1`);
4. the prompt-batch rows whose only token left is the prompt's last (held back when a request is
   inserted) run it in one call and move to the generation batch (`FirstForward`);
5. every other prompt-batch row prefills min(`prefill_step`, its tokens left but the last), all in
   one call, right-padded to the longest (`BatchPrefill`).

`decode_concurrency` is raised to at least `prompt_concurrency`, as BatchGenerator does with its
`completion_batch_size`. The options are `mlx_lm.server`'s `--prefill-step-size`,
`--prompt-concurrency` and `--decode-concurrency` (defaults 2048, 8 and 32, as there).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import ClassVar

from policies.base import PolicyError
from sim.engine.state import EngineState
from sim.engine.work import BatchPrefill, FirstForward, Generate, JoinPrompt, Work

MODELLED = ("0.32.2",)  # mlx-lm versions whose BatchGenerator this policy was checked against
SERVER_FLAGS = {"prefill_step": "--prefill-step-size", "prompt_concurrency": "--prompt-concurrency",
                "decode_concurrency": "--decode-concurrency"}
DEFAULTS = {"prefill_step": 2048, "prompt_concurrency": 8, "decode_concurrency": 32}


@dataclass
class MlxLm:
    prefill_step: int = DEFAULTS["prefill_step"]
    prompt_concurrency: int = DEFAULTS["prompt_concurrency"]
    decode_concurrency: int = DEFAULTS["decode_concurrency"]
    name: str = "mlx-lm"
    # an iteration that is only a step of an unchanged generation batch repeats until a request
    # arrives or finishes (`sim.steady` prices such stretches at once); the others run one by one
    steady: ClassVar[bool] = True
    queues_arrivals: ClassVar[bool] = False  # its stretches need an empty queue (`sim.steady`)
    engine: ClassVar[str] = "mlx-lm"  # its calls are BatchGenerator's (`sim.engine.work`)
    steady_chunks: ClassVar[bool] = True
    queue_order: ClassVar[None] = None  # BatchGenerator admits waiting prompts in arrival order
    kv_limit: ClassVar[None] = None  # and has no KV-cache limit

    def __post_init__(self) -> None:
        for key in DEFAULTS:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PolicyError(f"mlx-lm: {key} must be a whole number >= 1, got {v!r}")

    @property
    def completion_batch_size(self) -> int:
        """The generation batch's limit as BatchGenerator keeps it: at least the prompt batch's."""
        return max(self.decode_concurrency, self.prompt_concurrency)

    def schedule(self, state: EngineState) -> list[Work]:
        work: list[Work] = []
        gen = tuple(state.ready)
        staying = 0
        for s in state.ready.values():
            if not s.pipelined:
                raise PolicyError(f"mlx-lm: request {s.rid!r} was prefilled before the clock; BatchGenerator "
                                  "would need its cache inserted, which this policy does not model")
            staying += s.output_left > 1
        if gen:
            work.append(Generate(gen))
        if staying >= self.completion_batch_size:
            return work
        rows = state.prompt_rows
        room = min(self.prompt_concurrency - len(rows), self.completion_batch_size - staying)
        if room > 0:
            # FIFO: the prompt batch holds the oldest arrivals, so the waiting ones follow them in `queued`
            joining = tuple(islice((r for r in islice(state.queued, len(rows), None) if r not in rows), room))
            if joining:
                work.append(JoinPrompt(joining))
                rows += joining
        queued = state.queued
        last = tuple(r for r in rows if queued[r].prefill_left == 1)
        if last:
            work.append(FirstForward(last))
        chunks = tuple((r, min(self.prefill_step, queued[r].prefill_left - 1)) for r in rows
                       if queued[r].prefill_left > 1)
        if chunks:
            work.append(BatchPrefill(chunks))
        return work


def check_version(version: str, allow: bool = False) -> list[str]:
    """Refuse an mlx-lm this policy was not checked against (PolicyError, one line); with `allow`,
    return the warning instead."""
    if version in MODELLED:
        return []
    msg = (f"mlx-lm {version} is installed; the mlx-lm policy models BatchGenerator of mlx-lm "
           f"{', '.join(MODELLED)} only (pass --any-mlx-lm to run anyway)")
    if not allow:
        raise PolicyError(msg)
    return [msg]


def server_command(setting: dict, model: str = "MODEL") -> str:
    """The `mlx_lm.server` command line that runs this setting."""
    flags = " ".join(f"{SERVER_FLAGS[k]} {setting.get(k, DEFAULTS[k])}" for k in SERVER_FLAGS)
    return f"mlx_lm.server --model {model} {flags}"

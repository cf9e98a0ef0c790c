"""The `vllm` policy's decisions, step by step, against vLLM v1's scheduler (0.27.1,
`vllm/v1/core/sched/scheduler.py`, synchronous scheduling, FCFS, no prefix caching). Each case
was also run through vLLM's own `Scheduler` built on a CPU (`benchmarks/vllm_differential.py`);
the expected steps are its output."""
import subprocess
import sys

import pytest

import policies
from policies.base import PolicyError
from sim.cost.model import LinearCostModel
from sim.replay import simulate
from traces.generators import fixed

# every forward takes one second, whatever it holds: steps are seconds
SECOND = LinearCostModel((1.0, 0.0, 0.0), (1.0, 0.0, 0.0), mixed_coef=(1.0, 0.0, 0.0, 0.0, 0.0))


def steps(trace, **options) -> list[dict[str, int]]:
    log = simulate(trace, policies.make("vllm", **options), SECOND)
    assert all(c.kind in ("mixed", "preempt") for c in log.calls)
    return [dict(zip(c.rids, c.chunks)) for c in log.calls if c.kind == "mixed"]


def test_a_prompt_takes_the_budget_and_the_next_waits():
    """Budget 8, 2 sequences, prompts 10 and 5 at once, 3 outputs. Step 0: the waiting A takes
    min(10, 8) (L879, L913) and the budget is spent, so B waits (L687). Step 1: running A first
    (L484-523) for its 2 left, then B's 5 fit the 6 left; both complete their prompts (token 1)."""
    trace = fixed([0.0, 0.0], [10, 5], [3, 3])
    assert steps(trace, max_num_batched_tokens=8, max_num_seqs=2) == [
        {"0": 8}, {"0": 2, "1": 5}, {"0": 1, "1": 1}, {"0": 1, "1": 1}]


def test_running_decodes_go_first_and_a_long_prompt_takes_what_is_left():
    """Budget 8, 4 sequences; A (prompt 4, 5 outputs) at 0, B (prompt 20, 2 outputs) arrives during
    step 1. From step 2 A's decode is scheduled first (running loop, L484) and B takes the 7 tokens
    left (L913, then as a running request L523), until its prompt completes in step 4."""
    trace = fixed([0.0, 1.5], [4, 20], [5, 2])
    assert steps(trace, max_num_batched_tokens=8, max_num_seqs=4) == [
        {"0": 4}, {"0": 1}, {"0": 1, "1": 7}, {"0": 1, "1": 7}, {"0": 1, "1": 6}, {"1": 1}]


def test_long_prefill_token_threshold_caps_every_prompt_row():
    """Threshold 4, budget 8, 2 sequences, prompts 10 and 5, 3 outputs: every prompt row with more
    than 4 tokens left takes 4 (L521-522, L899-901), running or waiting; the budget left unused."""
    trace = fixed([0.0, 0.0], [10, 5], [3, 3])
    assert steps(trace, max_num_batched_tokens=8, max_num_seqs=2, long_prefill_token_threshold=4) == [
        {"0": 4, "1": 4}, {"0": 4, "1": 1}, {"0": 2, "1": 1}, {"0": 1, "1": 1}, {"0": 1}]


def test_max_num_seqs_holds_a_waiting_request_until_a_slot_frees():
    """2 sequences, budget 32: C waits while A and B run (L690-692) and is admitted in the step
    after A's last token (synchronous scheduling: a finished request frees its slot at once)."""
    trace = fixed([0.0, 0.0, 0.0], [3, 3, 3], [2, 5, 2])
    assert steps(trace, max_num_batched_tokens=32, max_num_seqs=2) == [
        {"0": 3, "1": 3}, {"0": 1, "1": 1}, {"1": 1, "2": 3}, {"1": 1, "2": 1}, {"1": 1}]


def test_the_kv_limit_preempts_the_newest_and_it_recomputes_before_new_prompts():
    """A KV limit of 17 tokens: both prompts are admitted (their caches fit, L973-985), the second
    decode step needs 19 and the newest running request is preempted by recompute (L576-629,
    `_preempt_request` L1274-1315), goes back to the front of the waiting queue, and recomputes
    its prompt and output once the other finishes. (vLLM counts 16-token blocks, pdsim tokens.)"""
    trace = fixed([0.0, 0.0], [8, 7], [4, 4])
    log = simulate(trace, policies.make("vllm", max_num_batched_tokens=16, max_num_seqs=2, kv_limit=17), SECOND)
    kinds = [(c.kind, dict(zip(c.rids, c.chunks)) if c.kind == "mixed" else c.rids) for c in log.calls]
    assert kinds[:3] == [("mixed", {"0": 8, "1": 7}), ("mixed", {"0": 1, "1": 1}), ("preempt", ("1",))]
    assert {rid: len(t) for rid, t in log.tokens.items()} == {"0": 4, "1": 4}
    recompute = next(c for c in log.calls if c.kind == "mixed" and c.rids == ("1",) and c.chunks[0] > 1)
    assert recompute.chunks == (7 + 2 - 1,)  # the prompt and the outputs but the last


@pytest.mark.parametrize("options,says", [
    ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, "greater than or equal to max_num_seqs"),
    ({"max_num_seqs": 0}, "max_num_seqs must be a whole number >= 1"),
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold must be a whole number >= 0"),
    ({"budget": "auto:40"}, "takes no budget auto:MS"),
    ({"queue": "sjf"}, "queue must be fcfs"),
    ({"prefill_step": 64}, "takes no prefill_step"),
])
def test_what_vllm_refuses_is_refused(options, says):
    with pytest.raises(PolicyError, match=says):
        policies.make("vllm", **options)


def test_an_option_vllm_does_not_read_is_one_line_and_exit_2():
    p = subprocess.run([sys.executable, "-m", "sim.cli", "sweep", "--setting", "vllm:budget=64"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "policy vllm does not read budget" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "sim.cli", "simulate", "--policy", "vllm", "--max-num-seqs", "0"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "max-num-seqs" in p.stderr and "Traceback" not in p.stderr

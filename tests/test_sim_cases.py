"""Hand-checked runs: two requests, a linear cost model, every time written down in advance.

Cost: prefill(L) = 1 + L seconds, decode = 1 second per call, no overheads. Both requests arrive
at t=0 with 4 prompt tokens and 3 outputs.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import policies
from sim.cost.model import LinearCostModel
from sim.metrics.registry import NAMES
from sim.metrics.scoring import Slo, decode_gaps, nearest_rank, score
from sim.replay import simulate
from traces.generators import fixed

COST = LinearCostModel((1.0, 1.0, 0.0), (1.0, 0.0, 0.0))
TRACE = fixed([0.0, 0.0], [4, 4], [3, 3])


def run(**setting):
    return simulate(TRACE, policies.make(**setting), COST)


def test_fifo_serves_one_request_at_a_time():
    log = run(policy="fifo", batch_size=2)
    assert log.tokens == {"0": [5, 6, 7], "1": [12, 13, 14]}
    m = score(log)
    assert list(decode_gaps(log)) == [1, 1]  # 7 -> 13 is idle for decodes: no request was active
    assert m["p50_ttft_ms"] == pytest.approx((5 + 12) / 2 * 1e3)
    assert m["makespan_s"] == 14
    assert m["output_throughput"] == pytest.approx(6 / 14)


def test_eager_prefills_whole_prompt_and_batches_decodes():
    log = run(policy="eager", batch_size=2)
    assert log.tokens == {"0": [5, 6, 12], "1": [11, 12, 13]}
    assert [c.rids for c in log.calls if c.kind == "decode"] == [("0",), ("0", "1"), ("1",)]
    assert list(decode_gaps(log)) == [6, 1]
    m = score(log)
    assert m["decode_gap_max_ms"] == 6000
    assert m["makespan_s"] == 13


def test_chunked_bounds_the_gap_and_delays_first_token():
    log = run(policy="chunked", budget=2, batch_size=2)
    assert [(c.kind, c.rids, c.tokens, c.prefix) for c in log.calls if c.kind != "sync"] == [
        ("prefill", ("0",), 2, 0), ("prefill", ("0",), 2, 2), ("decode", ("0",), 1, 0),
        ("prefill", ("1",), 2, 0), ("decode", ("0",), 1, 0), ("prefill", ("1",), 2, 2),
        ("decode", ("1",), 1, 0), ("decode", ("1",), 1, 0)]
    # the batch cache is rebuilt when 0 joins it, and when 1 takes the finished 0's row
    assert [(c.rids, c.joined, c.left) for c in log.calls if c.kind == "sync"] == [(("0",), 1, 0), (("1",), 1, 1)]
    assert log.tokens == {"0": [6, 7, 11], "1": [14, 15, 16]}
    assert list(decode_gaps(log)) == [4, 4, 1]  # 11 -> 15: 1 joins and decodes in the next iteration
    m = score(log)
    assert m["decode_gap_max_ms"] == 4000  # eager's was 6000
    assert m["p50_ttft_ms"] == pytest.approx((6 + 14) / 2 * 1e3)
    assert m["makespan_s"] == 16


def test_decode_first_order_and_single_decodes_follow_metile():
    trace = fixed([0.0, 0.0], [4, 4], [3, 3], ids=["A", "B"], prefilled=["A"])
    log = simulate(trace, policies.make("chunked", 2, 2, "single", "decode-first"), COST)
    # A decodes before each of B's chunks; A's first token (t=0) was produced before the clock
    assert [(c.kind, c.rids) for c in log.calls[:4]] == [
        ("decode", ("A",)), ("prefill", ("B",)), ("decode", ("A",)), ("prefill", ("B",))]
    m = score(log)
    assert m["resume_gap_max_ms"] == 1000  # A resumes one decode call after B arrives
    assert m["total_output_tokens"] == 5  # A's pre-clock token is not counted
    assert m["total_input_tokens"] == 4  # nor its prompt, prefilled before the clock
    assert m["p50_ttft_ms"] == pytest.approx(8000)  # B alone: 1 + 3 + 1 + 3


def test_iteration_overhead_and_batch_membership_costs_are_charged():
    cost = LinearCostModel((1.0, 1.0, 0.0), (1.0, 0.0, 0.0), iteration=0.5, join=(0.25, 0, 0), leave=(0.125, 0, 0))
    log = simulate(TRACE, policies.make("eager", None, 2), cost)
    calls = [(c.kind, c.start, c.end, c.joined, c.left) for c in log.calls]
    # the batch cache's rebuild is a call of its own (sync), then the step; the iteration's host
    # overhead comes before its first call
    assert calls == [("prefill", 0.5, 5.5, 0, 0), ("sync", 5.5, 5.75, 1, 0), ("decode", 5.75, 6.75, 0, 0),
                     ("prefill", 7.25, 12.25, 0, 0), ("sync", 12.25, 12.5, 1, 0), ("decode", 12.5, 13.5, 0, 0),
                     ("sync", 14.0, 14.125, 0, 1), ("decode", 14.125, 15.125, 0, 0)]
    # a batch copy costs more for more and longer rows: a + b*batch + c*batch*max(context)
    by_context = LinearCostModel((1.0, 1.0, 0.0), (1.0, 0.0, 0.0), join=(0.25, 0.5, 0.01))
    log = simulate(TRACE, policies.make("eager", None, 2), by_context)
    sync = [c for c in log.calls if c.kind == "sync"][1]  # contexts 4+2 and 4+1 when request 1 joins
    assert sync.end - sync.start == pytest.approx(0.25 + 0.5 * 2 + 0.01 * 2 * 6)


def test_idle_engine_waits_for_the_next_arrival():
    trace = fixed([0.0, 100.0], [4, 4], [2, 2])
    log = simulate(trace, policies.make("chunked", 8, 2), COST)
    assert log.tokens == {"0": [5, 6], "1": [105, 106]}
    assert list(decode_gaps(log)) == []  # the only gap spans idle time
    # busy 12 of the 106 seconds: prefill 5 + decode 1, twice
    assert score(log)["busy_frac"] == pytest.approx(12 / 106)


def test_nearest_rank_percentile():
    assert nearest_rank([5, 1, 4, 2, 3], 0.95) == 5
    assert nearest_rank([5, 1, 4, 2, 3], 0.5) == 3
    assert nearest_rank(list(range(1, 101)), 0.95) == 95


def test_stalls_and_goodput():
    from sim.metrics.scoring import Slo
    log = run(policy="eager", batch_size=2)
    m = score(log, Slo(ttft=6000), stall_ms=2000)
    # per-request gaps: 0: 1, 6; 1: 1, 1 -> one stall of 6 s, 4 s above the threshold
    assert (m["stall_count"], m["stall_excess_s"]) == (1, 4.0)
    assert m["request_goodput"] == pytest.approx(1 / 13)  # request 0 meets ttft<=6 s, request 1 (11 s) not


def test_chunked_is_tiny_llms_loop_when_a_waiting_request_takes_the_freed_slot():
    """tiny-llm's `run_batch_requests_serving` (prefill 1 s, decode 10 s, budget 1, batch 1): r1's
    prefill ends while r0 holds the only slot; in the iteration where r1 takes it, only decodes
    run, and r2 is taken as pending the iteration after."""
    cost = LinearCostModel((1.0, 0.0, 0.0), (10.0, 0.0, 0.0))
    log = simulate(fixed([0.0] * 3, [1, 1, 1], [3, 2, 2]), policies.make("chunked", 1, 1), cost)
    assert log.tokens == {"0": [1, 11, 22], "1": [12, 32], "2": [33, 43]}


def test_decode_gaps_reset_only_after_an_iteration_without_a_decode():
    """tiny-llm counts the gap when the batch empties and the next request is prefilled, joins and
    decodes in the very next iteration; a prefill-only iteration, or idle time, resets it."""
    cost = LinearCostModel((1.0, 0.0, 0.0), (10.0, 0.0, 0.0))
    log = simulate(fixed([0.0, 0.0], [1, 1], [2, 2]), policies.make("chunked", 1, 1), cost)
    assert log.tokens == {"0": [1, 11], "1": [12, 22]} and list(decode_gaps(log)) == [11]
    log = simulate(fixed([0.0, 0.0], [1, 2], [2, 2]), policies.make("chunked", 1, 1), cost)
    assert list(decode_gaps(log)) == []  # request 1's first chunk ran in an iteration with no decode
    m = score(run(policy="eager", batch_size=2))
    assert m["decode_gap_p50_ms"] == 1000 and m["decode_gap_median_ms"] == 3500  # gaps [6, 1]: lower middle, mean


def test_vllm_metrics_line_up_with_vllm_bench_serve():
    """The names and definitions of `vllm bench serve`'s result: median and population std of
    each latency, request/output/total-token throughput over the run's duration."""
    m = score(run(policy="fifo"))  # TTFTs 5 s and 12 s, E2E 7 s and 14 s, 8 prompt + 6 output tokens in 14 s
    assert m["median_ttft_ms"] == pytest.approx(8500) and m["std_ttft_ms"] == pytest.approx(3500)
    assert m["mean_e2el_ms"] == pytest.approx(10500) and m["median_e2el_ms"] == pytest.approx(10500)
    assert m["median_itl_ms"] == pytest.approx(1000) and m["std_itl_ms"] == 0
    assert (m["total_input_tokens"], m["total_output_tokens"], m["completed"]) == (8, 6, 2)
    assert m["request_throughput"] == pytest.approx(2 / 14) and m["output_throughput"] == pytest.approx(6 / 14)
    assert m["total_token_throughput"] == pytest.approx(14 / 14)
    vllm_result_keys = ["completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                        "request_goodput", "output_throughput", "total_token_throughput"]
    vllm_result_keys += [f"{s}_{k}_ms" for k in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")]
    assert set(vllm_result_keys) <= set(m)


@pytest.mark.parametrize("with_slo", [False, True])
@pytest.mark.parametrize("trace", [TRACE, fixed([0.0], [4], [1])], ids=["two", "one"])
def test_every_run_has_every_registry_metric_in_order(trace, with_slo):
    """Whatever the run, the same keys in the same order: undefined ones are NaN, not missing."""
    m = score(simulate(trace, policies.make("eager"), COST), Slo(ttft=1000) if with_slo else None)
    assert tuple(m) == NAMES
    assert math.isnan(m["request_goodput"]) != with_slo


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
       st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.01, 1.0]))
@settings(max_examples=300, deadline=None)
def test_nearest_rank_is_the_seed_definition(values, q):
    """numpy's inverted_cdf is tiny-llm's `sorted[ceil(q*n)-1]`."""
    ref = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
    assert nearest_rank(values, q) == ref
    assert nearest_rank(np.array([]), q) != nearest_rank(np.array([]), q)  # NaN for no values

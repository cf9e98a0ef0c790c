"""Every metric pdsim reports, once: its name, unit, definition and which direction is better.

`sim.metrics.scoring.score` produces exactly these names, in this order, for every run (a metric a run
cannot measure is NaN, written as null), so a sweep's columns never depend on the trace. The
names follow the seeds where the metric is theirs (tiny-llm's decode-completion gap, meTile's
inter-token gaps and stalls) and vLLM's serving benchmark (`vllm bench serve`) where the metric is
vLLM's, so a vLLM result and a pdsim result line up column for column; pdsim's earlier names for
vLLM's metrics are kept as aliases, accepted wherever a metric is named (`--slo`, `--objective`,
`--latency`). The sweep, the pick, the report, confirm and `pdsim simulate` read the lists they show
from here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # ms, s, tok/s, req/s, tokens, requests, calls, count, fraction
    better: str | None  # "lower", "higher", or None: it describes the run, neither better nor worse
    definition: str
    source: str = "pdsim"  # whose definition: tiny-llm, meTile, vLLM, pdsim
    aliases: tuple[str, ...] = ()
    needs_slo: bool = False  # defined only with a per-request target (`--slo ttft:MS ...`)
    family: str = ""  # what is measured, for charts: "decode-completion gap", "inter-token gap", "TTFT", ...
    statistic: str = ""  # p50, median, p95, p99, max, mean, std


_STAT_TEXT = {"mean": "mean", "median": "median (numpy's; the mean of the two middles of an even count)",
              "std": "standard deviation (population, as numpy's and vLLM's)",
              "p50": "p50 (linear interpolation, numpy's default)", "p95": "p95 (linear interpolation)",
              "p99": "p99 (linear interpolation)", "max": "maximum"}


def _latency(key: str, family: str, what: str, source: str, stats: tuple[str, ...]) -> list[Metric]:
    return [Metric(f"{s}_{key}_ms", "ms", "lower", f"{what}: {_STAT_TEXT[s]}", source, family=family, statistic=s)
            for s in stats]


_VLLM_STATS = ("mean", "median", "std", "p50", "p95", "p99")

_METRICS: list[Metric] = [
    Metric("decode_gap_p50_ms", "ms", "lower",
           "decode-completion gap (time between consecutive completed decode calls; an iteration with no decode, "
           "or idle time, resets it): nearest-rank p50, sorted[ceil(0.5 n) - 1], the lower middle of an even "
           "count", "tiny-llm", family="decode-completion gap", statistic="p50"),
    Metric("decode_gap_median_ms", "ms", "lower",
           "decode-completion gap: median, the mean of the two middles of an even count (tiny-llm's "
           "statistics.median, which its benchmark prints as p50)", "tiny-llm",
           family="decode-completion gap", statistic="median"),
    Metric("decode_gap_p95_ms", "ms", "lower", "decode-completion gap: nearest-rank p95, sorted[ceil(0.95 n) - 1]",
           "tiny-llm", family="decode-completion gap", statistic="p95"),
    Metric("decode_gap_max_ms", "ms", "lower", "decode-completion gap: maximum", "tiny-llm",
           family="decode-completion gap", statistic="max"),
    *_latency("itl", "inter-token gap", "inter-token gap (successive differences of each request's token times, "
              "pooled over requests; vLLM's ITL)", "meTile, vLLM", _VLLM_STATS),
    Metric("max_itl_ms", "ms", "lower", "inter-token gap: maximum", "meTile", family="inter-token gap",
           statistic="max"),
    Metric("stall_count", "count", "lower", "inter-token gaps above the stall threshold (--stall-ms, default 100)",
           "meTile"),
    Metric("stall_excess_s", "s", "lower", "sum over stalls of (gap - threshold)", "meTile"),
    Metric("resume_gap_max_ms", "ms", "lower",
           "initial resumption gap (the gap of an already-decoding request that spans another request's arrival): "
           "maximum", "meTile", family="resumption gap", statistic="max"),
    Metric("resume_gap_mean_ms", "ms", "lower", "initial resumption gap: mean", "meTile",
           family="resumption gap", statistic="mean"),
    *_latency("ttft", "TTFT", "time to first token (first token time minus arrival), completed requests",
              "vLLM", _VLLM_STATS),
    *_latency("tpot", "TPOT", "time per output token, (latency - TTFT) / (output tokens - 1), completed requests "
              "with two or more tokens", "vLLM", _VLLM_STATS),
    *_latency("e2el", "E2E latency", "end-to-end latency (last token time minus arrival), completed requests",
              "vLLM", _VLLM_STATS),
    Metric("makespan_s", "s", "lower", "last token time minus the first arrival (vLLM's benchmark duration)",
           "meTile, vLLM", aliases=("duration",)),
    Metric("completed", "requests", None, "requests that generated their whole output budget", "vLLM"),
    Metric("total_input_tokens", "tokens", None, "prompt tokens of the completed requests prefilled in the run",
           "vLLM"),
    Metric("total_output_tokens", "tokens", None,
           "tokens generated in the run, the first included (a request prefilled before the clock started does "
           "not count its first token)", "vLLM", aliases=("output_tokens",)),
    Metric("request_throughput", "req/s", "higher", "completed requests / makespan", "vLLM", aliases=("request_s",)),
    Metric("output_throughput", "tok/s", "higher", "total output tokens / makespan", "vLLM",
           aliases=("output_tok_s",)),
    Metric("total_token_throughput", "tok/s", "higher", "(total input tokens + total output tokens) / makespan",
           "vLLM"),
    Metric("request_goodput", "req/s", "higher",
           "completed requests meeting every per-request target (ttft, tpot, e2el in ms) / makespan", "vLLM",
           aliases=("goodput_req_s",), needs_slo=True),
    Metric("slo_attained", "fraction", "higher", "share of all requests meeting every per-request target",
           needs_slo=True),
    Metric("engine_calls", "calls", None, "engine calls the run made (prefill chunks, decodes, batch-cache syncs)"),
    Metric("preemptions", "count", "lower",
           "requests preempted by the KV-cache limit (--kv-limit): the newest request holding a cache is freed "
           "and later recomputed; 0 without a limit (and under mlx-lm, which has none)", "vLLM"),
    Metric("recomputed_tokens", "tokens", "lower",
           "tokens whose KV cache a preemption freed and a later prefill computed again (prompt and outputs but "
           "the last); 0 without preemptions", "vLLM"),
    Metric("busy_frac", "fraction", None,
           "time in engine calls / makespan (near 1: arrivals outpace the engine and queues grow)"),
    Metric("peak_memory_gb", "GB", "lower",
           "memory in use at the run's peak (weights, the KV buffers held by capacity, the largest call's "
           "KV copies and activations): predicted by the profile's memory model, measured with "
           "mx.get_peak_memory on the real engine; null with a profile calibrated before memory was measured"),
]

METRICS: dict[str, Metric] = {m.name: m for m in _METRICS}
NAMES: tuple[str, ...] = tuple(METRICS)
ALIASES: dict[str, str] = {a: m.name for m in _METRICS for a in m.aliases}

# What each view shows, in its order: the one place these lists are written.
SUMMARY = ("decode_gap_p50_ms", "decode_gap_p95_ms", "decode_gap_max_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms",
           "resume_gap_max_ms", "stall_count", "stall_excess_s", "p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
           "mean_tpot_ms", "p50_e2el_ms", "makespan_s", "output_throughput", "request_throughput",
           "request_goodput", "engine_calls", "preemptions", "recomputed_tokens", "peak_memory_gb")  # `pdsim simulate`
CONFIRMED = ("decode_gap_p50_ms", "decode_gap_p95_ms", "decode_gap_max_ms", "p95_itl_ms", "p99_itl_ms",
             "max_itl_ms", "resume_gap_max_ms", "p50_ttft_ms", "p95_ttft_ms", "output_throughput",
             "makespan_s", "peak_memory_gb")  # `pdsim confirm`: predicted against measured
CONFIRMED_KV = ("preemptions", "recomputed_tokens")  # `pdsim confirm`, also, for settings with a KV limit
CONFIRM_CHART = ("decode_gap_p95_ms", "decode_gap_max_ms", "p95_itl_ms", "max_itl_ms", "p50_ttft_ms",
                 "p95_ttft_ms", "mean_tpot_ms", "output_throughput", "makespan_s")  # the report's confirm chart
SWEEP_SHOWN = ("output_throughput", "decode_gap_p95_ms", "p99_ttft_ms", "peak_memory_gb")  # `pdsim sweep`, beside the pick's own
GAP_CHART = {"inter-token gap": ("p50", "p95", "p99", "max"),
             "decode-completion gap": ("p50", "p95", "max")}  # the report's gap percentiles
DEFAULT_OBJECTIVE = "output_throughput"
DEFAULT_LATENCY = "decode_gap_p95_ms"


def canonical(name: str) -> str:
    """The registry name of `name` (itself, or the metric it is an alias of); unknown names unchanged."""
    return ALIASES.get(name, name)


def get(name: str) -> Metric | None:
    return METRICS.get(canonical(name))


def names(goodput: bool = True) -> list[str]:
    """Every metric name; without a per-request target, those that need one are left out."""
    return [m.name for m in _METRICS if goodput or not m.needs_slo]


def describe(name: str) -> str:
    """`decode_gap_p95_ms (ms, lower is better): ...`, for help texts and reports."""
    m = get(name)
    if m is None:
        return name
    better = f", {m.better} is better" if m.better else ""
    return f"{m.name} ({m.unit}{better}): {m.definition}"


def gap_chart_metrics() -> list[Metric]:
    """The metrics the report's gap-percentile chart draws, family by family."""
    return [m for fam, stats in GAP_CHART.items() for s in stats for m in _METRICS
            if m.family == fam and m.statistic == s]

"""The `vllm` policy against vLLM's own scheduler, case by case: random traces and settings, each
run through vLLM v1's `Scheduler` (built on a CPU, no weights: a Python with vLLM installed) and
through pdsim's replay with the `vllm` policy, every forward taking one second; the schedules
(each step's rows and tokens) must be equal.

    python benchmarks/vllm_differential.py --vllm-python /path/to/venv/bin/python [--cases 200]

A Python with vLLM on a CPU-only Linux: a venv with torch's CPU wheel, `pip install --no-deps
vllm==0.27.1` and the light packages its scheduler imports (docs/engines.md). Synchronous
scheduling, FCFS, no prefix caching, no KV pressure (pdsim's KV limit counts tokens, vLLM blocks).
Prints the cases that differ and a count; exit 1 if any differ.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import policies  # noqa: E402
from sim.cost.model import LinearCostModel  # noqa: E402
from sim.replay import simulate  # noqa: E402
from traces.generators import fixed  # noqa: E402

SECOND = LinearCostModel((1.0, 0.0, 0.0), (1.0, 0.0, 0.0), mixed_coef=(1.0, 0.0, 0.0, 0.0, 0.0))

CHILD = r'''
import json, os, sys, tempfile
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
import inspect

model = tempfile.mkdtemp()
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "torch_dtype": "float16"},
          open(os.path.join(model, "config.json"), "w"))

def scheduler(case):
    mc = ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16", seed=0, max_model_len=8192)
    sc = SchedulerConfig(max_num_seqs=case["max_num_seqs"], max_num_batched_tokens=case["max_num_batched_tokens"],
                         max_model_len=8192, is_encoder_decoder=False,
                         long_prefill_token_threshold=case["long_prefill_token_threshold"],
                         enable_chunked_prefill=True, policy="fcfs", async_scheduling=False)
    cc = CacheConfig(block_size=16, enable_prefix_caching=False)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, device_config=DeviceConfig(device="cpu"))
    kvc = KVCacheConfig(num_blocks=100000, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"],
        FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    cc.num_gpu_blocks = 100000
    return Scheduler(vllm_config=vc, kv_cache_config=kvc, block_size=16, log_stats=False,
                     structured_output_manager=StructuredOutputManager(vc))

def output(s, so):
    ids = list(so.num_scheduled_tokens)
    sampled = [[5] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in ids]
    kw = dict(req_ids=ids, sampled_token_ids=sampled)
    if "req_id_to_index" in inspect.signature(ModelRunnerOutput).parameters:
        kw["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
    return ModelRunnerOutput(**kw)

out = []
for case in json.load(sys.stdin):
    s, t, steps = scheduler(case), 0.0, []
    pending = sorted(case["requests"], key=lambda r: r["arrival"])
    while pending or s.has_requests():
        while pending and pending[0]["arrival"] <= t:
            r = pending.pop(0)
            s.add_request(Request(request_id=r["id"], prompt_token_ids=[7] * r["prompt"], pooling_params=None,
                                  sampling_params=SamplingParams(max_tokens=r["output"], ignore_eos=True),
                                  arrival_time=r["arrival"]))
        if not s.has_requests():
            t = pending[0]["arrival"]
            continue
        so = s.schedule()
        if so.num_scheduled_tokens:
            steps.append(dict(so.num_scheduled_tokens))
            t += 1.0
        s.update_from_output(so, output(s, so))
    out.append(steps)
print(json.dumps(out))
'''


def cases(n: int, seed: int) -> list[dict]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        seqs = rng.choice([1, 2, 3, 4, 8])
        reqs, t = [], 0.0
        for i in range(rng.randint(1, 8)):
            t += rng.choice([0, 0, 1, 2, 5])
            reqs.append({"id": str(i), "arrival": t + 0.5 if t else 0.0, "prompt": rng.randint(1, 90),
                         "output": rng.randint(1, 6)})
        out.append({"max_num_seqs": seqs, "max_num_batched_tokens": rng.choice([seqs, 8, 16, 32, 64, 256]) if seqs <= 8
                    else 256, "long_prefill_token_threshold": rng.choice([0, 0, 4, 16]), "requests": reqs})
    for c in out:
        c["max_num_batched_tokens"] = max(c["max_num_batched_tokens"], c["max_num_seqs"])
    return out


def pdsim_steps(case: dict) -> list[dict]:
    reqs = case["requests"]
    trace = fixed([r["arrival"] for r in reqs], [r["prompt"] for r in reqs], [r["output"] for r in reqs])
    options = {k: case[k] for k in ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold")}
    log = simulate(trace, policies.make("vllm", **options), SECOND)
    return [dict(zip(c.rids, c.chunks)) for c in log.calls if c.kind == "mixed"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-python", required=True, help="a Python with vLLM installed")
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    todo = cases(a.cases, a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        child = Path(tmp) / "vllm_child.py"
        child.write_text(CHILD)
        done = subprocess.run([a.vllm_python, str(child)], input=json.dumps(todo), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"vLLM's scheduler did not run: {done.stderr.strip()[-1500:]}")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    differ = 0
    for i, (case, want) in enumerate(zip(todo, theirs)):
        got = pdsim_steps(case)
        if got != want:
            differ += 1
            first = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            print(f"case {i} differs at step {first}: vLLM {want[first:first + 2]}, pdsim {got[first:first + 2]} "
                  f"({ {k: case[k] for k in case if k != 'requests'} }, {len(case['requests'])} requests)")
    print(f"{len(todo) - differ} of {len(todo)} cases: the same schedule, step by step")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

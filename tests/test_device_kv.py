"""The device's KV capacity as the default limit: what MLX may allocate there (recorded by the
calibration), less the weights, over the bytes per KV token; a setting's --kv-limit only lowers it."""
import json

import pytest

import policies
from cli_checks import refused
from sim.cost.profile import BUILTIN, cost_model
from sim.engine.kvlimit import kv_limit_of
from sim.engine.memory import DEVICE_SHARE, device_kv_tokens, profile_kv_bytes
from sim.metrics.scoring import score
from sim.replay import simulate
from traces.trace import Request, Trace

WEIGHTS = 1.2e9


def profile(tokens: int | None) -> dict:
    """The built-in profile with a memory model and a device whose memory holds `tokens` of KV cache."""
    prof = json.loads(BUILTIN.read_text())
    per = profile_kv_bytes(prof)
    prof["memory"] = {"weights_bytes": WEIGHTS, "kv_bytes_per_token": per, "prefill": [0, 0, 0, 0], "decode": [0, 0, 0]}
    if tokens is not None:
        prof["device"]["memory_limit_bytes"] = int((WEIGHTS + (tokens + 0.5) * per) / DEVICE_SHARE)
    return prof


def busy() -> Trace:
    """Six requests at t=0 with long outputs: together they outgrow a 400-token cache."""
    return Trace([Request(str(i), 0.0, 40, 60) for i in range(6)])


def test_capacity_is_the_devices_memory_less_the_weights():
    assert device_kv_tokens(profile(400)) == 400
    assert device_kv_tokens(profile(None)) is None  # no recorded memory limit: no device limit
    assert device_kv_tokens(json.loads(BUILTIN.read_text())) is None  # no memory model either
    assert cost_model(profile(400)).kv_capacity == 400


def test_the_device_limits_a_run_that_asks_for_none_and_a_setting_only_lowers_it():
    cost = cost_model(profile(400))
    free = score(simulate(busy(), policies.make("chunked", 32, 6), cost_model(profile(None))))
    held = score(simulate(busy(), policies.make("chunked", 32, 6), cost))
    assert free["preemptions"] == 0 and held["preemptions"] > 0 and held["completed"] == 6
    assert kv_limit_of(policies.make("chunked", 32, 6, kv_limit=300), None, 400) == 300
    assert kv_limit_of(policies.make("chunked", 32, 6, kv_limit=5000), None, 400) == 400
    assert kv_limit_of(policies.make("chunked", 32, 6), None, None) is None
    same = simulate(busy(), policies.make("chunked", 32, 6, kv_limit=400), cost_model(profile(None)))
    assert [(c.kind, c.rids, c.start) for c in same.calls] == \
        [(c.kind, c.rids, c.start) for c in simulate(busy(), policies.make("chunked", 32, 6), cost).calls]


def test_mlx_lm_runs_as_it_is_without_a_limit():
    assert kv_limit_of(policies.make("mlx-lm"), None, 400) is None


def test_a_request_the_device_cannot_hold_is_refused_before_the_run(tmp_path, capsys):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(profile(100)))
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"id": "a", "arrival": 0, "prompt_len": 90, "output_len": 20}) + "\n")
    refused(["simulate", "--profile", str(path), "--trace", str(trace)], capsys, "the device's 100 tokens",
            "could never finish")
    bad = profile(100)
    bad["device"]["memory_limit_bytes"] = "lots"
    path.write_text(json.dumps(bad))
    refused(["simulate", "--profile", str(path)], capsys, "device.memory_limit_bytes", "whole number")


@pytest.mark.parametrize("tokens", [0, 10, 10_000])
def test_capacity_never_goes_below_zero(tokens):
    prof = profile(tokens)
    prof["memory"]["weights_bytes"] = 1e15  # weights larger than the device
    assert device_kv_tokens(prof) == 0


def test_the_device_memory_is_metals_recommended_working_set_where_reported(monkeypatch):
    """MLX lets a Mac's process allocate 1.5x the GPU's recommended working set, where the GPU
    pages: a profile records the working set there, and MLX's limit where none is reported."""
    import mlx.core as mx

    from calibrate.host.machine import device_memory
    limit = mx.get_memory_limit()
    monkeypatch.setattr(mx, "device_info", lambda: {"device_name": "x"})
    assert device_memory() == limit
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": limit // 3})
    assert device_memory() == limit // 3

"""The host side of a step (ftprof/plan/host.py): a micro-batch takes the longer of its GPU time and its host
floor, calibrated from runs whose GPU waited on the host."""

from __future__ import annotations

import pytest

from ftprof.plan import calibration, host
from ftprof.plan.calibration import ClassKey

H200 = "NVIDIA H200"
QLORA = ClassKey("qlora", "full", "liger", True)


def _run(micro_tokens, tokens_per_s, busy, key=QLORA, layers=32, device=H200):
    return {"device_name": device, "method": key.method, "policy": key.policy, "kernels": key.kernels,
            "compile": key.compile, "knobs": {}, "layers": layers, "micro_batch_tokens": micro_tokens,
            "tokens_per_s": tokens_per_s, "world_size": 1, "gpu_busy": busy}


def test_a_host_bound_run_sets_the_floor_and_a_busy_gpu_does_not():
    """Issue 38's cell: 1 x 2048 tokens per micro-batch at 7,531 tokens/s with the GPU mostly idle."""
    records = [_run(2048, 7_531, 0.55), _run(8192, 16_500, 0.97)]
    floor = host.host_floor(H200, QLORA, 32, records)
    assert floor.seconds == pytest.approx(2048 / 7_531) and floor.runs == 1
    assert host.host_floor(H200, QLORA, 16, records).seconds == pytest.approx(floor.seconds / 2)  # per layer
    assert host.host_floor(H200, ClassKey("qlora", "none", "liger", True), 32, records) is None  # another class
    assert host.host_floor("NVIDIA A100-SXM4-80GB", QLORA, 32, records) is None  # another GPU


def test_a_micro_batch_takes_the_longer_of_gpu_time_and_floor():
    floor = host.Floor(0.272, 0.0085, "", 1)
    # GPU-bound at 8,192 tokens: the GPU model answers
    assert host.tokens_per_s(16_500, floor, 8192, 1) == pytest.approx(16_500)
    # 2,048 tokens: the GPU alone would take 0.12 s; the host takes 0.272 s
    assert host.tokens_per_s(16_500, floor, 2048, 1) == pytest.approx(2048 / 0.272)
    assert host.tokens_per_s(16_500, None, 2048, 1) == 16_500


def test_runs_record_how_busy_their_gpu_was(tmp_path):
    import json

    run = tmp_path / "r"
    run.mkdir()
    result = {"status": "ok", "tokens_per_s": 7531.0, "flops_per_token": 3.3e10, "finished_at": "t", "model": "x",
              "method": "qlora", "batch_size": 1, "seq_len": 2048, "nvml": {"gpu0_util_mean": 55.0}}
    (run / "result.json").write_text(json.dumps(result))
    (run / "config.json").write_text(json.dumps({"method": {"method": "qlora"}}))
    assert calibration.run_record(run)["gpu_busy"] == pytest.approx(0.55)

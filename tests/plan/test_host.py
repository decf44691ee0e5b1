"""The host side of a step (ftprof/plan/host.py): a micro-batch takes the longer of its GPU time and its host
floor, calibrated from runs whose GPU waited on the host."""

from __future__ import annotations

import pytest

from ftprof.plan import calibration, host
from ftprof.plan.calibration import ClassKey

H200 = "A Test GPU"  # no shipped host row names it: the local records alone answer
QLORA = ClassKey("qlora", "full", "liger", True)


def _run(micro_tokens, tokens_per_s, busy, key=QLORA, layers=32, device=H200, checkpointed=None, mode="default"):
    return {"device_name": device, "method": key.method, "policy": key.policy, "kernels": key.kernels,
            "compile": key.compile, "knobs": {"compile_mode": mode}, "layers": layers,
            "micro_batch_tokens": micro_tokens, "tokens_per_s": tokens_per_s, "world_size": 1, "gpu_busy": busy,
            "checkpointed_layers": checkpointed}


NONE = ClassKey("qlora", "none", "liger", True)


def test_the_floor_is_a_layer_s_cost_times_layers_plus_the_recomputed_layers_cost():
    """H200, llama-1b (16 layers), 128 tokens per micro-batch, GPU 13-17% busy: 0.115 s without checkpointing,
    0.178 s with every layer recomputed; a 4 x 1 run with the GPU 98% busy says nothing of the host."""
    records = [_run(128, 128 / 0.115, 0.17, key=NONE, layers=16), _run(128, 128 / 0.178, 0.13, layers=16),
               _run(8192, 16_000, 0.98)]
    per_layer, recompute = 0.115 / 16, (0.178 - 0.115) / 16
    assert host.host_floor(H200, NONE, 32, records).seconds == pytest.approx(32 * per_layer)
    assert host.host_floor(H200, QLORA, 32, records).seconds == pytest.approx(32 * (per_layer + recompute))
    one = host.host_floor(H200, QLORA, 32, records, checkpointed=1)  # full on 1 of 32 layers
    assert one.seconds == pytest.approx(32 * per_layer + recompute)
    assert host.host_floor(H200, NONE, 32, records, compile_mode="reduce-overhead") is None  # CUDA graphs: another
    assert host.host_floor("NVIDIA A100-SXM4-80GB", QLORA, 32, records) is None  # another GPU
    assert host.host_floor(H200, ClassKey("qlora", "selective", "liger", True), 32, records) is None


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


def test_the_shipped_host_rows_answer_for_the_h200():
    """The H200's shipped floors (docs/measurements/2026-12-03-h200-host-floor-raw_summary.csv): CUDA graphs cut the
    host's cost of a QLoRA layer about fourfold."""
    graphs = host.host_floor("NVIDIA H200", NONE, 32, [], compile_mode="reduce-overhead")
    plain = host.host_floor("NVIDIA H200", NONE, 32, [])
    assert graphs and plain and 0 < graphs.seconds < plain.seconds / 3 and "shipped" in plain.source

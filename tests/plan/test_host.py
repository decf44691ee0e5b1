"""The host side of a step (ftprof/plan/host.py): a micro-batch takes the longer of its GPU time and its host
floor, calibrated from runs whose GPU waited on the host."""

from __future__ import annotations

import dataclasses

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
    # another GPU, with no host-bound run of its own: the shipped GPU's host rows (the host's work, not the GPU's)
    other = host.host_floor("NVIDIA A100-SXM4-80GB", QLORA, 32, records)
    assert other.source.endswith("on NVIDIA H200, no host-bound run on NVIDIA A100-SXM4-80GB)")
    assert host.host_floor("cpu", QLORA, 32, records) is None  # a CPU run's host is its device: no floor
    # selective, never measured host-bound: at least none's floor (it launches every kernel none does)
    selective = host.host_floor(H200, ClassKey("qlora", "selective", "liger", True), 32, records)
    assert selective.seconds == pytest.approx(32 * per_layer) and "selective's at least: none's" in selective.source


def test_a_family_measured_under_full_checkpointing_only_has_a_floor_without_it():
    """Uncompiled runs were measured host-bound under full checkpointing only: a layer without recomputation costs
    NONE_OF_FULL of one with it (the least ratio of the families measured both ways), so it still has a floor (a
    tiny model's uncompiled plan predicted 47 million tokens/s without one)."""
    eager_full = ClassKey("lora", "full", "eager", False)
    records = [_run(128, 128 / 0.16, 0.1, key=eager_full, layers=16, mode=None)]
    full = host.host_floor(H200, eager_full, 16, records)
    none = host.host_floor(H200, dataclasses.replace(eager_full, policy="none"), 16, records)
    assert full.seconds == pytest.approx(0.16) and none.seconds == pytest.approx(0.16 * host.NONE_OF_FULL)
    assert "without recomputation x0.55 of one with it" in none.source


def test_a_micro_batch_takes_about_the_longer_of_gpu_time_and_floor():
    floor = host.Floor(0.272, 0.0085, "", 1)
    # GPU-bound at 8,192 tokens (0.50 s against the floor's 0.272): within 2.5% of the GPU model alone
    assert 0.975 * 16_500 < host.tokens_per_s(16_500, floor, 8192, 1) < 16_500
    # 2,048 tokens: the GPU alone would take 0.12 s; the host takes 0.272 s
    assert host.tokens_per_s(16_500, floor, 2048, 1) == pytest.approx(2048 / 0.272, rel=0.015)
    assert host.tokens_per_s(16_500, None, 2048, 1) == 16_500


def test_near_the_edge_a_micro_batch_is_slower_than_either():
    """Where the GPU time and the floor are close, neither hides the other (H200, llama-8b FP8 QLoRA, 2 x 2048,
    full on 2 of 32 layers: 250 ms a micro-batch where the GPU model said 210 and the floor 194)."""
    floor = host.Floor(0.194, 0.194 / 32, "", 1)
    edge = 4096 / host.tokens_per_s(4096 / 0.210, floor, 4096, 1)
    assert 0.240 < edge < 0.250  # the longer of the two, 0.210, was 16% fast
    # a rate measured at this very micro-batch (its time held the same loss) is predicted at its measurement
    assert host.tokens_per_s(16_000, floor, 4096, 1, measured_at=4096) == pytest.approx(16_000)
    # measured at twice the tokens, where the floor hid behind the GPU time: less loss there than here
    moved = host.tokens_per_s(4096 / 0.210, floor, 4096, 1, measured_at=8192)
    assert 4096 / 0.250 < moved < 4096 / 0.210
    # a floor lowered to a run of the candidate's own family is that run's whole time
    measured = host.Floor(0.194, 0.194 / 32, "", 1, measured=True)
    assert host.tokens_per_s(4096 / 0.150, measured, 4096, 1) == pytest.approx(4096 / 0.194)


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
    graphs_key = dataclasses.replace(NONE, options=(("compile_mode", "reduce-overhead"),))  # a class of its own
    graphs = host.host_floor("NVIDIA H200", graphs_key, 32, [], compile_mode="reduce-overhead")
    plain = host.host_floor("NVIDIA H200", NONE, 32, [])
    assert graphs and plain and 0 < graphs.seconds < plain.seconds / 3 and "shipped" in plain.source


def _with(options: dict, **kw) -> dict:
    run = _run(**kw)
    run["knobs"] = {**run["knobs"], **options}
    return run


def test_a_family_measured_only_under_full_checkpointing_borrows_its_nearest_relative_s_shape():
    """--fp8-base measured host-bound only with every layer recomputed (15.7 ms a layer against 16 bits' 11.1):
    its floor with 16 of 32 layers recomputed is 16 bits' costs scaled by that ratio, and an option never measured
    host-bound (the offload beside it) takes the same floor, saying where it came from."""
    fp8, both = {"fp8_base": True}, {"fp8_base": True, "offload_checkpoints": True}
    records = [_run(128, 128 / 0.115, 0.17, key=NONE, layers=16), _run(128, 128 / 0.178, 0.13, layers=16),
               _with(fp8, micro_tokens=128, tokens_per_s=128 / 0.251, busy=0.11, layers=16)]
    plain, recompute = 0.115 / 16, (0.178 - 0.115) / 16
    ratio = (0.251 / 16) / (plain + recompute)
    key = ClassKey("qlora", "full", "liger", True, calibration.speed_class_options({**fp8, "method": "qlora"}))
    half = host.host_floor(H200, key, 32, records, checkpointed=16)
    assert half.seconds == pytest.approx((32 * plain + 16 * recompute) * ratio)
    assert "scaled" in half.source
    assert host.host_floor(H200, key, 32, records).seconds == pytest.approx(32 * 0.251 / 16)  # its own row
    key_both = ClassKey("qlora", "full", "liger", True,
                        calibration.speed_class_options({**both, "method": "qlora"}))
    assert host.host_floor(H200, key_both, 32, records, checkpointed=16).seconds == pytest.approx(half.seconds)


def test_a_family_measured_only_under_partial_checkpointing_scales_its_relative_by_its_own_rows():
    """FP8 measured host-bound only with 4 and 8 of 32 layers recomputed (H200, mistral-7b, eager, 2026-12-04: the
    plan had taken 16 bits' floor as it was and over-predicted by 10-12%): each such row against 16 bits' floor
    for its policy gives the ratio, and the floor at another policy is 16 bits' times that ratio."""
    fp8 = {"fp8_base": True}
    plain, recompute = 0.115 / 16, (0.178 - 0.115) / 16
    partial = [_with(fp8, micro_tokens=128, tokens_per_s=128 / (ratio * (32 * plain + n * recompute)), busy=0.8,
                     checkpointed=n) for n, ratio in ((4, 1.30), (8, 1.40))]
    records = [_run(128, 128 / 0.115, 0.17, key=NONE, layers=16), _run(128, 128 / 0.178, 0.13, layers=16), *partial]
    key = ClassKey("qlora", "full", "liger", True, calibration.speed_class_options({**fp8, "method": "qlora"}))
    floor = host.host_floor(H200, key, 32, records, checkpointed=16)
    assert floor.seconds == pytest.approx((32 * plain + 16 * recompute) * 1.35)  # the median of 1.30 and 1.40
    assert "scaled x1.35" in floor.source


def test_a_run_gathering_its_embedding_rows_on_the_host_sets_only_its_own_floor():
    """--offload-embeddings gathers each micro-batch's rows on the host: host work the same run without it does not
    have (llama-8b QLoRA, CUDA graphs, FP8, 1 x 8 x 1,024 tokens on an H200: 12,118 tokens/s with it, 13,405
    without), so its floor is its own, not its family's without the gather."""
    gather = _with({"offload_embeddings": True}, micro_tokens=128, tokens_per_s=128 / 0.2, busy=0.3, key=NONE,
                   layers=16)
    records = [_run(128, 128 / 0.115, 0.17, key=NONE, layers=16), gather]
    assert host.host_floor(H200, NONE, 32, records).seconds == pytest.approx(32 * 0.115 / 16)
    embedded = host.host_floor(H200, NONE, 32, records, options={"offload_embeddings": True})
    assert embedded.seconds == pytest.approx(32 * 0.2 / 16)


def test_a_host_bound_row_is_less_certain(tmp_path, monkeypatch):
    """Where the host floor sets a row's speed its band widens by BAND_HOST_BOUND (FP8 under full checkpointing at
    1,024 tokens per sequence on an H200 ran p90/p50 1.11-1.28 and 10-30% from its prediction), so the ranking puts
    it below confident rows its uncertainty overlaps."""
    from ftprof.plan import speed
    from tests.data_files import save_checkpoint
    from tests.plan.planners import planner_for

    deep = save_checkpoint(tmp_path / "ckpt", layers=8)
    planner, cand = planner_for(deep, "lora", seq_len=512, batch_size=4, checkpointing="full")
    bound = planner.predict(cand)
    assert "host-bound" in bound.speed_source  # a small model's layers: the host sets the pace
    with monkeypatch.context() as patch:  # a run of its own family measured less than the floor: it comes down
        patch.setattr(host, "measured_ceiling", lambda *a, **k: 2048 / bound.tokens_per_s / 1.5)
        lowered = planner.predict(cand)
    assert "as a run of it measured" in lowered.speed_source
    monkeypatch.setattr(host, "host_floor", lambda *a, **k: None)
    free = planner.predict(cand)
    assert bound.tokens_per_s < free.tokens_per_s
    assert lowered.tokens_per_s == pytest.approx(min(1.5 * bound.tokens_per_s, free.tokens_per_s))
    assert bound.tokens_per_s_error == pytest.approx(free.tokens_per_s_error + speed.BAND_HOST_BOUND, abs=1e-3)
    assert bound.tokens_per_s_spread == pytest.approx(free.tokens_per_s_spread + speed.BAND_HOST_BOUND, abs=1e-3)


def test_no_floor_exceeds_what_a_run_of_its_own_family_measured():
    """A micro-batch takes the longer of its GPU time and its floor, so a run of the candidate's family, model and
    recomputed layers bounds the floor at any micro-batch size: a floor scaled from runs of a few tokens said 841 ms
    for a configuration measured at 629 (H200, 2026-12-04). Runs of another model, another recomputation or
    without the candidate's host work bound nothing."""
    floor_rows = [_run(128, 128 / 0.115, 0.17, key=NONE, layers=16), _run(128, 128 / 0.300, 0.13, layers=16)]
    measured = {**_run(8192, 8192 / 0.45, 0.9), "model": "llama-8b"}  # 0.45 s per micro-batch, GPU 90% busy
    others = [{**measured, "model": "mistral-7b", "tokens_per_s": 8192 / 0.2},
              {**measured, "checkpointed_layers": 8, "tokens_per_s": 8192 / 0.2},
              _with({"offload_embeddings": True}, micro_tokens=8192, tokens_per_s=8192 / 0.2, busy=0.9)]
    records = floor_rows + [measured] + [{**r, "model": r.get("model", "llama-8b")} for r in others]
    floor = host.host_floor(H200, QLORA, 32, records)
    assert floor.seconds == pytest.approx(32 * 0.300 / 16)  # the few-token runs' floor: 0.6 s, over 0.45
    ceiling = host.measured_ceiling(H200, QLORA, "llama-8b", 32, records)
    assert ceiling == pytest.approx(0.45)
    bounded = host.bounded(floor, ceiling)
    assert bounded.seconds == pytest.approx(0.45) and "at most 450 ms, as a run of it measured" in bounded.source
    assert host.tokens_per_s(30_000, bounded, 8192, 1) == pytest.approx(8192 / 0.45)  # its own measurement
    assert host.bounded(floor, 0.9) is floor and host.bounded(floor, None) is floor
    assert host.measured_ceiling(H200, QLORA, "llama-1b", 32, records) is None

"""GPU behaviour on a real CUDA device: every method on the llama-1b preset, CUDA memory stats, MFU, precision.

Run on the GPU machine with ``pytest -m gpu``; skipped cleanly on CPU. Set FTPROF_GPU_RESULTS=path.jsonl to keep
each run's headline figures.
"""

import json
import os

import pytest
import torch

import ftprof
from ftprof.config import METHODS, RunConfig
from tests.requires import method_params, requires_run

pytestmark = pytest.mark.gpu

_results: dict = {}  # method -> RunResult, shared by the tests of this module


def gpu_config(tmp_path, method, **flat) -> RunConfig:
    values = dict(method=method, model="llama-1b", seq_len=1024, batch_size=4, max_steps=8, measure_warmup_steps=3,
                  device="cuda", output_dir=str(tmp_path), quiet=True)
    if method == "gptq-lora":
        values["gptq_calibration_samples"] = 8
    values.update(flat)
    return RunConfig.from_flat(values)


def _record(result):
    path = os.environ.get("FTPROF_GPU_RESULTS")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(result.to_dict()) + "\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _results


@pytest.mark.parametrize("method", method_params(METHODS))
def test_llama_1b_trains_on_gpu(tmp_path, method, runs):
    result = ftprof.train(gpu_config(tmp_path, method))
    _record(result)
    assert result.status == "ok", result.failure.error_tail
    runs[method] = result
    assert torch.isfinite(torch.tensor(result.throughput.loss_last))
    assert result.run.device_name and "cuda" in result.run.device
    memory = result.memory
    assert memory.torch_peak_allocated > 0 and memory.torch_peak_reserved >= memory.torch_peak_allocated
    assert result.memory.memory_stages["mem_load_delta"] > 0
    assert result.throughput.tokens_per_s > 0 and result.throughput.step_time_p50_s > 0
    if result.flops.peak_flops is not None:
        assert 0.01 < result.flops.mfu < 1.0
    env = json.loads((tmp_path / result.run_dir.split("/")[-1] / "env.json").read_text())
    assert env["gpus"] and env["gpus"][0]["name"]
    assert env["pytorch_alloc_conf"] == "expandable_segments:True"


def test_quantized_bases_hold_less_weight_memory(runs):
    # Weights after loading: 4-bit bases < bf16 base. (Whole-run peaks at this batch are dominated by activations,
    # where the 4-bit kernels' transients currently make QLoRA's peak ~1 GiB above LoRA's on llama-1b: issue 7.)
    if not {"full", "lora", "qlora"} <= set(runs):
        pytest.skip("needs the full, lora and qlora runs of this module")
    load = {m: r.memory.memory_stages["mem_load_delta"] for m, r in runs.items()}
    assert load["qlora"] < 0.5 * load["lora"]
    assert load["lora"] == pytest.approx(load["full"], rel=0.05)
    if "gptq-lora" in load:
        assert load["gptq-lora"] < 0.5 * load["lora"]
    assert runs["lora"].memory.torch_peak_allocated < runs["full"].memory.torch_peak_allocated


@requires_run("qlora")
def test_qlora_bf16_path_has_no_fp32_gemms_on_gpu(tmp_path):
    from tests.engine.test_precision import matmul_dtypes

    dtypes = matmul_dtypes(gpu_config(tmp_path, "qlora", seq_len=256, batch_size=1))
    assert dtypes and torch.float32 not in dtypes


@requires_run("qlora")
def test_textbook_recipe_shows_fp32_gemms_on_gpu(tmp_path):
    from tests.engine.test_precision import matmul_dtypes

    dtypes = matmul_dtypes(gpu_config(tmp_path, "qlora", seq_len=256, batch_size=1, kbit_prepare=True))
    assert torch.float32 in dtypes


def test_oom_is_recorded_as_oom_device(tmp_path):
    # llama-8b full fine-tuning at this size needs far more than one GPU's memory.
    result = ftprof.train(gpu_config(tmp_path, "full", model="llama-8b", batch_size=64, seq_len=4096, max_steps=3,
                                     measure_warmup_steps=1))
    _record(result)
    assert result.status == "oom_device"
    assert result.failure.error_type == "OutOfMemoryError"
    run_dir = tmp_path / result.run_dir.split("/")[-1]
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["status"] == "oom_device"
    assert (run_dir / saved["artifacts"]["oom_snapshot"]).stat().st_size > 0


def test_fsdp_cpu_offload_on_one_gpu(tmp_path):
    """--fsdp-cpu-offload on one GPU: FSDP2 in the one process keeps weights, gradients and optimizer state on the
    host, and the GPU's peak falls by most of them. (The two runs' random weights differ: a preset under FSDP is
    initialised shard by shard, so their losses are not compared step by step.)"""
    base = ftprof.train(gpu_config(tmp_path / "base", "full", gradient_checkpointing=True))
    off = ftprof.train(gpu_config(tmp_path / "off", "full", gradient_checkpointing=True, fsdp_cpu_offload=True))
    for r in (base, off):
        _record(r)
        assert r.status == "ok", r.failure.error_message
        assert r.throughput.loss_last < 0.5 * r.throughput.loss_first
    assert off.run.world_size == 1 and off.run.parallel == "fsdp"
    parts, offloaded = base.memory.memory_breakdown, off.memory.memory_breakdown
    static = parts.weights_trainable + parts.gradients + parts.optimizer_state
    assert offloaded.offloaded == pytest.approx(static, rel=0.01)
    assert offloaded.weights_trainable == offloaded.optimizer_state == 0
    # measured on an H200 (llama-1b, 4 x 1024): 14.12 GB -> 7.23 GB, with 9.9 GB offloaded; the rest of the
    # peak is the logits and their gradients, which stay on the GPU
    assert off.memory.torch_peak_allocated < base.memory.torch_peak_allocated - 0.5 * static

"""Two H200s: every method under torchrun (FSDP2; DDP too), per-rank and aggregate results.

Needs two visible GPUs (skipped otherwise). FTPROF_GPU_RESULTS=path.jsonl keeps each run's result.
"""

import json
import os

import pytest
import torch

import ftprof
from ftprof.config import METHODS, RunConfig
from tests.requires import method_params, requires

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


def _cfg(tmp_path, method, **flat):
    values = dict(method=method, model="llama-1b", seq_len=1024, batch_size=4, max_steps=8, measure_warmup_steps=3,
                  device="cuda", output_dir=str(tmp_path), quiet=True, nproc_per_node=2, run_name="d",
                  memory_logging="all")
    if method == "gptq-lora":
        values["gptq_calibration_samples"] = 8
    values.update(flat)
    return RunConfig.from_flat(values)


def _keep(result, label):
    path = os.environ.get("FTPROF_GPU_RESULTS")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"label": label, **result.to_dict()}) + "\n")


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
@pytest.mark.parametrize("method", method_params(METHODS))
@requires("pynvml")  # the NVML sampler's peak and per-rank summary
def test_two_gpus(tmp_path, method, parallel):
    result = ftprof.train(_cfg(tmp_path, method, parallel=parallel))
    _keep(result, f"{method}-{parallel}-2gpu")
    assert result.status == "ok", result.failure.error_message
    assert result.run.world_size == 2 and set(result.distributed.per_rank) == {"0", "1"}
    assert result.throughput.tokens_per_s == pytest.approx(2 * result.throughput.tokens_per_s_per_gpu)
    ranks = result.distributed.per_rank.values()
    assert all(r["torch_peak_allocated"] > 0 for r in ranks)
    assert result.memory.torch_peak_allocated == max(r["torch_peak_allocated"] for r in ranks)
    assert result.distributed.memory_skew is not None and result.distributed.step_time_skew is not None
    assert result.memory.nvml_device_used_peak and result.nvml.summary["ranks"] == 2
    assert 0 < result.flops.mfu < 1


def test_fsdp_checkpointing_and_cpu_offload(tmp_path):
    """Checkpointing composes with FSDP2, and CPU offload keeps the sharded state off the GPU."""
    base = ftprof.train(_cfg(tmp_path / "a", "full", gradient_checkpointing=True))
    off = ftprof.train(_cfg(tmp_path / "b", "full", gradient_checkpointing=True, fsdp_cpu_offload=True))
    for r, label in ((base, "full-fsdp-ckpt-2gpu"), (off, "full-fsdp-ckpt-offload-2gpu")):
        _keep(r, label)
        assert r.status == "ok", r.failure.error_message
    assert base.flops.recompute_flops_per_token > 0 and base.flops.hfu > base.flops.mfu
    assert off.memory.torch_peak_allocated < base.memory.torch_peak_allocated

"""The bf16 QLoRA path runs its GEMMs in bf16 (no fp32 upcast of lm_head or adapters); the textbook recipe does not."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import build_run, run_one_step, tiny_config

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default}


class MatmulDtypes(TorchDispatchMode):
    """Records the dtype of every matmul as it reaches the kernels (below autocast)."""

    def __init__(self):
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.dtypes.append(args[-1].dtype if func is torch.ops.aten.addmm.default else args[0].dtype)
        return func(*args, **(kwargs or {}))


def matmul_dtypes(cfg) -> list[torch.dtype]:
    plan, built = build_run(cfg)
    with MatmulDtypes() as mode:
        run_one_step(plan, built)
    return mode.dtypes


def _bf16_qlora(tmp_path, **extra):
    return tiny_config(tmp_path, "qlora", dtype="bfloat16", max_steps=2, **extra)


def test_qlora_bf16_has_no_fp32_gemms(tmp_path):
    dtypes = matmul_dtypes(_bf16_qlora(tmp_path))
    assert dtypes and set(dtypes) == {torch.bfloat16}


def test_textbook_recipe_runs_fp32_gemms(tmp_path):
    dtypes = matmul_dtypes(_bf16_qlora(tmp_path, kbit_prepare=True))
    assert torch.float32 in dtypes


@pytest.mark.parametrize("method", ["lora", "full"])
def test_bf16_runs_bf16_gemms(tmp_path, method):
    dtypes = matmul_dtypes(tiny_config(tmp_path, method, dtype="bfloat16", max_steps=2))
    assert set(dtypes) == {torch.bfloat16}


class Conversions(TorchDispatchMode):
    """Records dtype conversions of activation-sized tensors (bf16 -> fp32 and back)."""

    def __init__(self, min_numel: int):
        super().__init__()
        self.min_numel = min_numel
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor):
            if args[0].numel() >= self.min_numel and args[0].dtype != out.dtype:
                self.count += 1
        return out


def _conversions(tmp_path, method) -> int:
    cfg = tiny_config(tmp_path / method, method, dtype="bfloat16", max_steps=2)
    plan, built = build_run(cfg)
    with Conversions(min_numel=cfg.data.batch_size * cfg.data.seq_len * 64) as mode:  # tiny's hidden size: 64
        run_one_step(plan, built)
    return mode.count


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_adapters_do_not_round_trip_activations_through_fp32(tmp_path, method):
    # RMSNorm's internal fp32 upcast and the fp32 loss convert activations in every method; adapters must add none
    # (PEFT would cast each adapter input to fp32, and autocast straight back to bf16).
    assert _conversions(tmp_path, method) <= _conversions(tmp_path, "full")

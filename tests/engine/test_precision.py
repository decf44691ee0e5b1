"""The bf16 QLoRA path runs its GEMMs in bf16 (no fp32 upcast of lm_head or adapters); the textbook recipe does not."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ftprof.engine.trainer import Trainer
from ftprof.preflight import preflight
from tests.conftest import tiny_config

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
    trainer = Trainer(preflight(cfg), log=lambda _: None)
    trainer.setup()
    with MatmulDtypes() as mode:
        trainer.train_step()
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

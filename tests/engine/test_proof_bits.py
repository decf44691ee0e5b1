"""The training proof compares weight samples bit for bit (engine/proof.py): a frozen tensor holding NaN bit
patterns, as QLoRA's packed 4-bit weights in bf16 storage do, is unchanged when its bits are."""

import torch

from ftprof.engine.proof import TrainingCheck


def test_a_frozen_tensor_with_nan_patterns_is_unchanged_and_a_moved_one_is_seen():
    model = torch.nn.Linear(8, 8, bias=False)
    packed = torch.full((256,), float("nan"), dtype=torch.bfloat16)
    model.register_parameter("packed", torch.nn.Parameter(packed, requires_grad=False))
    check = TrainingCheck(model, max_steps=1)
    with torch.no_grad():
        model.weight.add_(1.0)  # the trainable weight moves
    check.compare_weights()
    assert check.frozen_changed == [] and check.trainable_changed == 1
    with torch.no_grad():
        model.packed[0] = 1.0
    check.compare_weights()
    assert check.frozen_changed == ["packed"]

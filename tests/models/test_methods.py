"""Method strategies' helpers that need no model download: casting a loaded model's frozen parts."""

import torch
from torch import nn

from ftprof.models.methods import cast_frozen_parameters


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 8).half()
        self.head = nn.Linear(8, 32, bias=False).half()
        self.head.weight = self.embed.weight  # tied, as Llama-3.2-1B's input embeddings and lm_head
        self.norm = nn.LayerNorm(8).half()
        self.ids = nn.Parameter(torch.arange(4), requires_grad=False)  # not floating point: left alone


def test_tied_parameters_stay_tied_and_everything_floating_is_cast():
    model = Tied()
    cast_frozen_parameters(model, torch.bfloat16)
    assert model.head.weight is model.embed.weight
    assert model.embed.weight.dtype == model.norm.weight.dtype == torch.bfloat16
    assert not model.embed.weight.requires_grad
    assert model.ids.dtype == torch.int64
    assert len({id(p) for p in model.parameters()}) == 4  # embed (shared), norm weight and bias, ids


def test_parameters_already_in_the_dtype_are_kept_as_they_are():
    model = Tied().float()
    before = model.embed.weight
    cast_frozen_parameters(model, torch.float32)
    assert model.embed.weight is before

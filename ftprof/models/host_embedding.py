"""``--offload-embeddings``: the frozen input embedding table in host memory.

Under LoRA, QLoRA and GPTQ-LoRA the input embedding table is frozen and only ever read by a gather: each token's
row, tokens x hidden values per micro-batch out of vocab x hidden. Yet it is the largest single weight a 16-bit or
4-bit model keeps on the device (llama-8b: 128,256 x 4,096 x 2 bytes = 1.0 GiB of its 5.3 GiB QLoRA weights). Here it
stays in host memory; the rows a micro-batch needs are gathered on the host into pinned memory and copied to the
device, 8 KB a token for llama-8b (64 MiB for 4 x 2048 tokens, a few milliseconds over PCIe).

Where the gather happens. The batch feed (engine/feed.py) hands the model ``inputs_embeds`` instead of
``input_ids``: it gathers when it makes the batch, which for a step's first micro-batch is during the previous
step (``prefetch``), so the gather and its copy overlap the GPU's work. Anything else that calls the embedding
with token ids (the compile warm-up, evaluation) goes through ``HostEmbedding.forward``, which brings the ids to
the host first: a sync, outside every measured step.

Not a parameter. The table is a plain attribute, not a registered parameter or buffer: ``model.device`` (the first
parameter's device, which transformers reads), ``.to()`` and DDP's start-up broadcast never see a host tensor.
``metrics.count_params`` still counts it (it reads ``host_weight``). Tied embeddings (the output layer multiplies by the
same table, e.g. Llama 3.2 1B) keep it on the device: there it is a matmul weight, and nothing would be saved.
"""

from __future__ import annotations

import torch
from torch import nn


class HostEmbedding(nn.Module):
    """An input embedding whose table lives in host memory; its output is on ``target``."""

    def __init__(self, table: torch.Tensor, target: torch.device):
        super().__init__()
        self.host_weight = table  # a plain attribute (see the module docstring)
        self.target = target

    @property
    def weight(self) -> torch.Tensor:  # for readers of get_input_embeddings().weight (its shape and dtype)
        return self.host_weight

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of host token ids, in host memory (pinned when the target is a GPU, so that the copy to it is
        queued behind running kernels instead of waiting for them)."""
        table = self.host_weight
        out = torch.empty((*ids.shape, table.shape[1]), dtype=table.dtype, pin_memory=self.target.type == "cuda")
        torch.index_select(table, 0, ids.reshape(-1), out=out.view(-1, table.shape[1]))
        return out

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.rows(input_ids.cpu()).to(self.target, non_blocking=True)  # .cpu(): a sync for device ids


def is_tied(model: nn.Module) -> bool:
    """Whether the output layer multiplies by the input embedding table (tied embeddings)."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    return outputs is not None and getattr(outputs, "weight", None) is getattr(inputs, "weight", None)


def move_to_host(model: nn.Module, target: torch.device) -> HostEmbedding | None:
    """Replace the model's input embedding by a ``HostEmbedding`` of the same table (its device copy is freed),
    whose rows go to ``target`` (the run's device).
    None, with the model untouched, where the embeddings are tied or the embedding does more than a gather."""
    embedding = model.get_input_embeddings()
    # exactly nn.Embedding: a subclass may do more than gather (Gemma 3's scales its rows)
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None or is_tied(model):
        return None
    weight = embedding.weight
    host = HostEmbedding(weight.detach().to("cpu", copy=True), target)
    model.set_input_embeddings(host)
    return host

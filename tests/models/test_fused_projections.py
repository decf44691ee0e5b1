"""One GEMM per group of adapted projections, the adapters' B matmuls inside it (models/fused_projections.py):
PEFT's numbers with fewer matmuls and adds, the LoRA buffer following B through optimizer steps, the row-strided
dequantization, kept weights, and the cases that fall back to each projection's own forward."""

import json
from pathlib import Path

import pytest
import torch

import ftprof
from ftprof import metrics
from ftprof.models import fused_projections
from tests.conftest import build_run, tiny_config
from tests.models.test_lora_addmm import loss_and_grads
from tests.tolerances import GRADIENTS, LOSS_AFTER_STEPS, SAME_OPS


def _count(ops: list[str], *names: str) -> int:
    return sum(ops.count(op) for op in names)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_joined_groups_compute_what_peft_computes(tmp_path, method):
    built, loss, grads, ops = loss_and_grads(tmp_path / "joined", method, nonzero_b=True,
                                             lora_fused_projections=True)
    _, peft_loss, peft_grads, peft_ops = loss_and_grads(tmp_path / "peft", method, nonzero_b=True,
                                                        lora_fused_a=False)
    layers = len(metrics.decoder_layers(built.model))
    groups = [m._ftprof_joined[0] for m in built.model.modules() if hasattr(m, "_ftprof_joined")]
    assert len(set(map(id, groups))) == 2 * layers  # q/k/v and gate/up in every layer
    # Per layer, PEFT's 5 A, 5 B (and, for LoRA, 5 base) matmuls of the grouped projections become 2 A and 2
    # joined ones; its 5 full-size adds are gone.
    matmuls = ("mm", "addmm", "matmul", "linear", "bmm", "joined_linear")
    fewer = (6 if method == "qlora" else 11) * layers
    assert _count(ops, *matmuls) == _count(peft_ops, *matmuls) - fewer, (ops, peft_ops)
    assert _count(ops, "add") <= _count(peft_ops, "add") - 5 * layers
    assert all(m._ftprof_out is None for m in built.model.modules() if hasattr(m, "_ftprof_out"))
    torch.testing.assert_close(loss, peft_loss, **SAME_OPS)
    assert grads.keys() == peft_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, peft_grads[name], **GRADIENTS, msg=name)


def test_lora_bases_share_one_buffer_and_follow_the_adapters(tmp_path):
    """The base weights become views of the joined buffer (no second copy), and a B changed in place (an optimizer
    step, a loaded adapter) is in the joined weight at the next forward."""
    plan, built = build_run(tiny_config(tmp_path, "lora", seq_len=16, lora_fused_projections=True))
    attn = metrics.decoder_layers(built.model)[0].self_attn
    group = attn.q_proj._ftprof_joined[0]
    assert group.kind == "dense" and attn.k_proj.base_layer.weight.untyped_storage().data_ptr() == \
        group.joined.untyped_storage().data_ptr()
    columns = attn.q_proj.base_layer.in_features
    with torch.no_grad():
        attn.k_proj.lora_B["default"].weight.fill_(0.5)
    built.model(**next(built.batches))  # the forward's pre-hook copies the changed B
    first = attn.q_proj.base_layer.out_features
    rows = slice(first, first + attn.k_proj.base_layer.out_features)
    k_block = group.joined[rows, columns + 16:columns + 32]
    assert torch.equal(k_block, torch.full_like(k_block, 0.5))
    assert not group.joined[rows, columns:columns + 16].any()  # the zero blocks stay zero


@pytest.mark.slow  # two training runs: about 3 s
def test_training_with_joined_groups_matches_peft(tmp_path):
    """Several optimizer steps: the joined weights follow B as AdamW moves it (a stale copy would diverge)."""
    joined = ftprof.train(tiny_config(tmp_path / "j", "lora", max_steps=5, lora_fused_projections=True))
    peft = ftprof.train(tiny_config(tmp_path / "p", "lora", max_steps=5, lora_fused_a=False))
    assert joined.status == peft.status == "ok"
    config = json.loads((Path(joined.run_dir) / "config.json").read_text())
    assert config["method"]["lora_fused_projections"] is True
    assert joined.throughput.loss_last == pytest.approx(peft.throughput.loss_last, rel=LOSS_AFTER_STEPS)


def test_qlora_joined_weight_is_the_dequantized_weights_beside_the_adapters(tmp_path):
    """The row-strided dequantization (the Triton kernel on CUDA; its torch-op twin here) gives bitsandbytes'
    weights, stacked, with the B blocks on the right."""
    from ftprof.models import dequant, dequant_kernels

    plan, built = build_run(tiny_config(tmp_path, "qlora", seq_len=16, lora_fused_projections=True))
    group = metrics.decoder_layers(built.model)[0].mlp.gate_proj._ftprof_joined[0]
    bases = [m.base_layer for m in group.members]
    right = torch.randn(sum(group.rows), sum(group.ranks))
    joined = dequant_kernels.dequantize_rows([b.weight for b in bases], *dequant_kernels.quant_args(bases),
                                             group.rows, right)
    expected = torch.cat([torch.cat([dequant.dequantize(b, "bitsandbytes") for b in bases]), right], dim=1)
    torch.testing.assert_close(joined, expected, rtol=0, atol=0)


def test_fused_optimizer_steps_reach_the_joined_weight(tmp_path):
    """Fused AdamW updates B without bumping its version: the step's own hook copies it in."""
    plan, built = build_run(tiny_config(tmp_path, "lora", seq_len=16, lora_fused_projections=True))
    group = metrics.decoder_layers(built.model)[0].self_attn.q_proj._ftprof_joined[0]
    params = [p for p in built.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=True)
    fused_projections.follow(optimizer, [group])
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    b = group.members[0].lora_B["default"].weight
    assert b.abs().min() > 0.05  # moved by the step (B starts at zero)
    torch.testing.assert_close(group.joined[:group.rows[0], group.columns:group.columns + group.ranks[0]], b)


def test_a_member_called_alone_or_with_adapters_off_runs_its_own_forward(tmp_path):
    plan, built = build_run(tiny_config(tmp_path, "lora", seq_len=16, lora_fused_projections=True))
    attn = metrics.decoder_layers(built.model)[0].self_attn
    x, other = torch.randn(2, 8, attn.q_proj.in_features), torch.randn(2, 8, attn.q_proj.in_features)
    with torch.no_grad():
        torch.nn.init.normal_(attn.k_proj.lora_B["default"].weight)
        built.model(**next(built.batches))  # B changed: copied in at the model's next forward
        expected = attn.k_proj.base_layer(other) + attn.k_proj.lora_B["default"](
            attn.k_proj.lora_A["default"](other)) * attn.k_proj.scaling["default"]
        alone = attn.k_proj(other)
        attn.q_proj(x)  # hands k_proj and v_proj their outputs for x
        after = attn.k_proj(other)  # another input: computed on its own, the handed output dropped
        with built.model.disable_adapter():
            disabled = attn.k_proj(other)
    torch.testing.assert_close(alone, expected, **SAME_OPS)
    torch.testing.assert_close(after, expected, **SAME_OPS)
    torch.testing.assert_close(disabled, attn.k_proj.base_layer(other))
    assert attn.k_proj._ftprof_out is None and attn.v_proj._ftprof_out is not None


def test_the_option_is_off_by_default_and_refused_where_it_cannot_run():
    from ftprof.config import RunConfig
    from ftprof.errors import ConfigError

    assert RunConfig.from_flat({"method": "qlora"}).method.resolved("float32").lora_fused_projections is False
    with pytest.raises(ConfigError, match="pick one"):
        RunConfig.from_flat({"method": "lora", "lora_addmm": True, "lora_fused_projections": True})
    with pytest.raises(ConfigError, match="FSDP"):
        RunConfig.from_flat({"method": "lora", "lora_fused_projections": True, "nproc_per_node": 2})
    with pytest.raises(ConfigError, match="a LoRA and QLoRA option and does not apply to method 'gptq-lora'"):
        RunConfig.from_flat({"method": "gptq-lora", "lora_fused_projections": True})
    with pytest.raises(ConfigError, match="--lora-fused-projections is a LoRA and QLoRA option"):
        RunConfig.from_flat({"method": "full", "lora_fused_projections": True})


def test_joined_linears_are_not_counted_as_keeping_weights(tmp_path):
    """Under full checkpointing only the o and down projections keep their dequantized weights: the joined groups
    dequantize again in backward, and the run's count says so."""
    _, plain = build_run(tiny_config(tmp_path / "p", "qlora", checkpointing="full"))
    _, joined = build_run(tiny_config(tmp_path / "j", "qlora", checkpointing="full", lora_fused_projections=True))
    layers = len(metrics.decoder_layers(plain.model))
    assert plain.kept_dequantized == 7 * layers and joined.kept_dequantized == 2 * layers


def _saved_activation_bytes(tmp_path, **flat) -> int:
    """Bytes of the activations one forward saves for backward (storages of tensors shaped by the batch: weights,
    quantization states and the rank-sized B blocks are left out), each storage counted once."""
    plan, built = build_run(tiny_config(tmp_path, "lora", seq_len=128, batch_size=4, **flat))
    batch, tokens, seen = next(built.batches), 4 * 128, {}

    def pack(t):
        if (t.dim() >= 3 and t.shape[0] == 4) or (t.dim() == 2 and t.shape[0] == tokens):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), built.autocast():
        built.model(**batch).loss.backward()
    return sum(seen.values())


def test_joined_groups_save_no_more_activations_than_peft(tmp_path):
    """v is handed out as a copy: as a view of the joined q/k/v output, the copy SDPA saves would keep the whole
    output alive until backward (measured +2.5 GiB on llama-8b before the copy)."""
    joined = _saved_activation_bytes(tmp_path / "j", lora_fused_projections=True)
    assert joined <= _saved_activation_bytes(tmp_path / "p", lora_fused_a=False)

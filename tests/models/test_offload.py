"""--offload-checkpoints (models/offload.py) on the CPU, where the offload is a plain copy through the same hooks:
the same losses and gradients as full checkpointing alone, only the checkpointed layers offloaded, the layer inputs
held by the offloader instead of autograd, and one-line refusals where it does not apply. The CUDA path (side
stream, pinned memory, peak memory) is tests/gpu/test_gpu_offload.py."""

import csv
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import ftprof
from ftprof import metrics
from ftprof.config import declarations
from ftprof.models import offload
from ftprof.profiling.memory import SavedActivations
from tests.conftest import assert_train_refuses, build_run, run_one_step, tiny_config, two_step_grads

METHODS = ["full", "lora", "qlora"]


def _losses(result) -> list[float]:
    with open(Path(result.run_dir) / "steps.csv") as fh:
        return [float(r["loss"]) for r in csv.DictReader(fh)]


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_offloaded_runs_train_the_same_losses_as_full_checkpointing(tmp_path, method):
    runs = {off: ftprof.train(tiny_config(tmp_path / str(off), method, checkpointing="full", max_steps=4,
                                          seq_len=64, lr=3e-3, offload_checkpoints=off))
            for off in (False, True)}
    assert all(r.status == "ok" for r in runs.values()), {k: r.failure for k, r in runs.items()}
    plain, offloaded = _losses(runs[False]), _losses(runs[True])
    assert len(plain) == 4 and offloaded == plain  # the same arithmetic: bitwise
    assert runs[True].checkpointing.checkpointing_policy == "full"
    assert runs[True].memory.memory_breakdown.activations_saved < runs[False].memory.memory_breakdown.activations_saved


@pytest.mark.parametrize("method", METHODS)
def test_offloaded_gradients_equal_full_checkpointing(tmp_path, method):
    _, plain = two_step_grads(tmp_path / "plain", method)
    built, offloaded = two_step_grads(tmp_path / "off", method, offload_checkpoints=True)
    layers = metrics.decoder_layers(built.model)
    assert offload.offloaded_layers(built.model) == layers
    offloader = offload.offloader_of(built.model)
    assert offloader.offloaded == 2 * len(layers) and offloader.pending == []  # each input brought back
    for a, b in zip(plain, offloaded, strict=True):
        assert a.keys() == b.keys() and a
        for name, g in a.items():
            torch.testing.assert_close(b[name], g, rtol=0, atol=1e-6, msg=name)


def test_only_the_checkpointed_layers_offload(tmp_path):
    lines: list[str] = []
    from ftprof.engine.build import build
    from ftprof.preflight import preflight
    from ftprof.profiling.memory import MemoryTracker

    resolved = preflight(tiny_config(tmp_path, "lora", checkpointing="full", checkpoint_layers=1,
                                     offload_checkpoints=True))
    built = build(resolved, MemoryTracker(resolved.device), lines.append)
    first, second = metrics.decoder_layers(built.model)
    assert offload.offloaded_layers(built.model) == [first] and not second.gradient_checkpointing
    assert "--offload-checkpoints: 1 layer inputs kept in pinned host memory" in lines
    run_one_step(resolved, built)
    assert offload.offloader_of(built.model).offloaded == 1


@pytest.mark.parametrize("method", ["full", "lora"])
def test_layer_inputs_are_held_by_the_offloader_not_autograd(tmp_path, method):
    """What autograd keeps for backward (the SavedActivations meter) drops by the layer inputs, and the offloader's
    pending records hold exactly those inputs' copies until backward."""
    saved = {}
    for off in (False, True):
        _, built = build_run(tiny_config(tmp_path / str(off), method, checkpointing="full", seq_len=32,
                                         offload_checkpoints=off))
        batch = next(built.batches)
        inputs = []  # each layer input's storage, weakly: whether anything still holds it after the forward
        hooks = [block.register_forward_pre_hook(lambda _, args, into=inputs: into.append(StorageWeakRef(
            args[0].untyped_storage()))) for block in metrics.decoder_layers(built.model)]
        with SavedActivations(built.model) as meter, built.autocast():
            loss = built.model(**batch).loss
        for hook in hooks:
            hook.remove()
        saved[off] = meter.bytes
        # Freed (on a GPU: device memory) once copied, unless autograd keeps them (full checkpointing alone), the
        # embedding output too (PEFT's input-grad hook, which would make it a leaf held by its gradient, is off)
        assert [ref.expired() for ref in inputs] == [off, off]
        if off:
            held = [ref() for ref in offload.offloader_of(built.model).pending]
            layer_input = batch["input_ids"].numel() * built.model.config.hidden_size * 4  # fp32 on the CPU
            assert len(held) == len(metrics.decoder_layers(built.model)) == 2
            assert all(r.host.nbytes == layer_input and r.host.device.type == "cpu" for r in held)
            loss.backward()
            assert offload.offloader_of(built.model).pending == []
    assert saved[False] - saved[True] == 2 * layer_input, saved


def test_reapplying_the_policy_does_not_wrap_twice(tmp_path):
    from ftprof.models.checkpointing import apply_policy

    _, built = build_run(tiny_config(tmp_path, "lora", checkpointing="full", offload_checkpoints=True))
    apply_policy(built.model, "full", offload=True)
    for block in offload.offloaded_layers(built.model):
        assert not isinstance(block._gradient_checkpointing_func.inner, offload.OffloadedCheckpoint)
    apply_policy(built.model, "full")  # enabling again without offload puts torch's checkpoint back
    assert offload.offloaded_layers(built.model) == []
    with pytest.raises(ValueError, match="needs full checkpointing"):
        apply_policy(built.model, "selective", offload=True)


@pytest.mark.parametrize("argv", [["--offload-checkpoints"],
                                  ["--checkpointing", "selective", "--offload-checkpoints"],
                                  ["--checkpointing", "auto", "--offload-checkpoints"]])
def test_refused_without_full_checkpointing(tmp_path, capsys, argv):
    assert_train_refuses(tmp_path, capsys, "lora", argv, "--offload-checkpoints needs --checkpointing")


def test_refused_under_fsdp_and_cuda_graphs():
    values = {"method": "lora", "checkpointing": "full", "offload_checkpoints": True, "compile": True,
              "compile_mode": "default", declarations.SHARDED: False}
    assert declarations.problems(values) == []
    fsdp = declarations.problems({**values, declarations.SHARDED: True})
    assert len(fsdp) == 1 and fsdp[0].startswith("--offload-checkpoints is not tried under FSDP")
    graphs = declarations.problems({**values, "compile_mode": "reduce-overhead"})
    assert len(graphs) == 1 and "--compile-mode reduce-overhead" in graphs[0], graphs
    assert declarations.problems({**values, "compile_mode": "max-autotune-no-cudagraphs"}) == []

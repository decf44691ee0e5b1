"""Memory levers on a real GPU. --offload-embeddings: the input table leaves the device, the training peak is lower
by its bytes less the prefetched next micro-batch's rows (which wait on the device in place of its token ids), and
the losses are eager's. Run with ``pytest -m gpu``; skipped on CPU."""

import csv
from pathlib import Path

import pytest

import ftprof
from ftprof.config import RunConfig
from tests.data_files import save_checkpoint
from tests.requires import method_params

pytestmark = pytest.mark.gpu

VOCAB, HIDDEN, BATCH, SEQ = 32768, 64, 4, 256  # a 4 MiB table in bf16 against 128 KiB of rows per micro-batch


@pytest.fixture(scope="module")
def wide_vocab(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("vocab") / "ckpt", vocab=VOCAB)


def _run(tmp_path, model: str, method: str, **flat):
    values = dict(method=method, model=model, seq_len=SEQ, batch_size=BATCH, max_steps=8, measure_warmup_steps=2,
                  device="cuda", output_dir=str(tmp_path), quiet=True, memory_logging="all")
    return ftprof.train(RunConfig.from_flat({**values, **flat}))


def _losses(result) -> list[float]:
    with open(Path(result.run_dir) / "steps.csv") as fh:
        return [float(r["loss"]) for r in csv.DictReader(fh)]


@pytest.mark.parametrize("method", method_params(["lora", "qlora"]))
def test_the_table_leaves_the_device_and_the_losses_stay(tmp_path, wide_vocab, method):
    plain = _run(tmp_path / "p", wide_vocab, method)
    moved = _run(tmp_path / "m", wide_vocab, method, offload_embeddings=True)
    assert plain.status == moved.status == "ok", (plain.failure, moved.failure)
    table = VOCAB * HIDDEN * 2
    prefetched = BATCH * SEQ * (HIDDEN * 2 - 8)  # the next micro-batch's bf16 rows instead of its int64 ids
    a, b = plain.memory.memory_breakdown, moved.memory.memory_breakdown
    assert a.weights_frozen - b.weights_frozen == table, (a, b)
    assert a.training_peak - b.training_peak == pytest.approx(table - prefetched, abs=16384), (a, b)
    worst = max(abs(y - x) / abs(x) for x, y in zip(_losses(plain), _losses(moved), strict=True))
    assert worst < 1e-3, (_losses(plain), _losses(moved))


# --lean-activations, --lean-norms (models/lean_mlp.py, lean_norm.py): the MLP keeps gate and up alone, each norm
# its input instead of its output. Beside Liger's MLP one product a layer goes (its norm keeps its input anyway: the
# two outputs go too, but the first layer's first; until 2026-12-06 Liger's norms got no lean op at all); compiled,
# at least the product (a 64-wide model's compiled HF MLP kept silu(gate) too: two, H100, 2026-12-05; llama-8b
# QLoRA's one)
@pytest.mark.parametrize("flat, products, norms", [({"kernels": "liger"}, 1, 2), ({"compile": True}, 1, 0)],
                         ids=["liger", "compile"])
def test_lean_activations_keep_less_a_layer(tmp_path, wide_vocab, flat, products, norms):
    import transformers

    plain = _run(tmp_path / "p", wide_vocab, "lora", **flat)
    lean = _run(tmp_path / "l", wide_vocab, "lora", lean_activations=True, lean_norms=True, **flat)
    assert plain.status == lean.status == "ok", (plain.failure, lean.failure)
    config = transformers.AutoConfig.from_pretrained(wide_vocab)
    layers = config.num_hidden_layers
    # the first layer's input norm gives nothing back: its input (the frozen table's rows) needs no gradient, so
    # only its output was kept, and the op keeps the input instead (the planner counts it so: plan/memory.lean_bytes)
    outputs = norms * layers - (1 if norms else 0)
    least = BATCH * SEQ * (products * layers * config.intermediate_size + outputs * config.hidden_size) * 2
    saved = (plain.memory.memory_breakdown.activations_saved, lean.memory.memory_breakdown.activations_saved)
    assert saved[0] - saved[1] >= least, saved
    worst = max(abs(y - x) / abs(x) for x, y in zip(_losses(plain), _losses(lean), strict=True))
    assert worst < 1e-2, (_losses(plain), _losses(lean))

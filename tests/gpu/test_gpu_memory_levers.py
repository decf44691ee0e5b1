"""Memory levers on a real GPU. --offload-embeddings: the input table leaves the device (the training peak is lower
by its bytes) and the losses are eager's. Run with ``pytest -m gpu``; skipped on CPU."""

import csv
from pathlib import Path

import pytest

import ftprof
from ftprof.config import RunConfig
from tests.requires import method_params

pytestmark = pytest.mark.gpu


def _run(tmp_path, method: str, **flat):
    values = dict(method=method, model="tiny", seq_len=256, batch_size=4, max_steps=8, measure_warmup_steps=2,
                  device="cuda", output_dir=str(tmp_path), quiet=True, memory_logging="all")
    return ftprof.train(RunConfig.from_flat({**values, **flat}))


def _losses(result) -> list[float]:
    with open(Path(result.run_dir) / "steps.csv") as fh:
        return [float(r["loss"]) for r in csv.DictReader(fh)]


@pytest.mark.parametrize("method", method_params(["lora", "qlora"]))
def test_the_table_leaves_the_device_and_the_losses_stay(tmp_path, method):
    plain = _run(tmp_path / "p", method)
    moved = _run(tmp_path / "m", method, offload_embeddings=True)
    assert plain.status == moved.status == "ok", (plain.failure, moved.failure)
    table = 512 * 64 * 2  # the tiny preset's vocab x hidden in bf16
    a, b = plain.memory.memory_breakdown, moved.memory.memory_breakdown
    assert a.training_peak - b.training_peak == pytest.approx(table, abs=4096), (a, b)
    assert a.weights_frozen - b.weights_frozen == pytest.approx(table, abs=4096), (a, b)
    worst = max(abs(y - x) / abs(x) for x, y in zip(_losses(plain), _losses(moved), strict=True))
    assert worst < 1e-3, (_losses(plain), _losses(moved))

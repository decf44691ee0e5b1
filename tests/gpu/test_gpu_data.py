"""Real data and trackers on a CUDA device: a save_pretrained checkpoint with a chat template, chat data, every
method, packed and padded; TensorBoard receives CUDA memory per step. Run with ``pytest -m gpu``."""

import pytest

import ftprof
from ftprof.config import RunConfig
from tests.data_files import chat_rows, save_checkpoint, write
from tests.requires import method_params, requires

pytestmark = [pytest.mark.gpu, requires("datasets", "tensorboard")]  # real data; the tracker check


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-llama")


@pytest.mark.parametrize("method", method_params(["full", "lora", "qlora", "gptq-lora"]))
@pytest.mark.parametrize("packing", [False, True])
def test_checkpoint_on_chat_data(tmp_path, checkpoint, method, packing):
    data = write(tmp_path / "chat.jsonl", chat_rows(64))
    extra = {"gptq_calibration_samples": 8} if method == "gptq-lora" else {}
    cfg = RunConfig.from_flat(dict(method=method, model=checkpoint, dataset=data, packing=packing, seq_len=256,
                                   batch_size=4, max_steps=6, measure_warmup_steps=2, device="cuda", quiet=True,
                                   output_dir=str(tmp_path), report_to="tensorboard", **extra))
    result = ftprof.train(cfg)
    assert result.status == "ok", result.failure.error_tail
    assert result.data.format == "chat" and result.data.rows == 64
    assert (result.data.padding_fraction == 0) == packing
    assert 0 < result.throughput.real_tokens_per_s < result.throughput.tokens_per_s
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / result.run_dir.split("/")[-1] / "tensorboard"))
    acc.Reload()
    assert acc.Scalars("memory/peak_allocated_gib")[-1].value > 0

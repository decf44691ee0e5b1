"""Real data and a real checkpoint on CPU: a Llama saved with save_pretrained (tokenizer with a chat template beside
it), trained through --model PATH with every method, and every data format through --dataset."""

import json
import subprocess
import sys

import pytest

import ftprof
from tests.conftest import tiny_config
from tests.data_files import chat_rows, instruction_rows, save_checkpoint, text_rows, write
from tests.requires import method_param


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-llama")


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("data") / "chat.jsonl", chat_rows(16))


def _run(tmp_path, method, **flat):
    values = dict(max_steps=2, measure_warmup_steps=1, batch_size=2, seq_len=96)
    values.update(flat)
    result = ftprof.train(tiny_config(tmp_path, method, **values))
    assert result.status == "ok", result.failure.error_tail
    return result


@pytest.mark.parametrize("method", ["full", "lora", "qlora",
                                    method_param("gptq-lora", pytest.mark.slow)])
def test_checkpoint_trains_on_chat_data_with_every_method(tmp_path, checkpoint, chat_file, method):
    extra = {"gptq_calibration_samples": 4} if method == "gptq-lora" else {}
    result = _run(tmp_path, method, model=checkpoint, dataset=chat_file, **extra)
    assert result.data.format == "chat" and result.data.rows == 16
    speed = result.throughput
    assert 0 < speed.real_tokens_per_s < speed.tokens_per_s  # padding and prompts carry no labels
    saved = json.loads((tmp_path / result.run_dir.split("/")[-1] / "result.json").read_text())
    assert saved["data"]["fingerprint"] == result.data.fingerprint
    assert saved["data"]["padding_fraction"] == pytest.approx(result.data.padding_fraction)


@pytest.mark.parametrize("name, rows, packing", [
    ("d.txt", text_rows(), False), ("d.json", text_rows(), True), ("d.csv", instruction_rows(), False),
    ("d.parquet", instruction_rows(), True), ("saved", chat_rows(), True),
])
def test_every_data_format_trains(tmp_path, name, rows, packing):
    path = write(tmp_path / name, rows)
    result = _run(tmp_path / "runs", "lora", dataset=path, packing=packing, seq_len=160)
    assert result.data.rows == len(rows)
    if packing:
        assert result.data.padding_fraction == 0 and result.throughput.tokens_per_step == 2 * 160
    else:
        assert result.data.padding_fraction > 0


@pytest.mark.slow  # a subprocess: ~11 s on 2 busy cores
def test_chat_data_needs_a_chat_template_before_the_model_loads(tmp_path, chat_file):
    """One line, exit 2, no run directory: the checkpoint's tokenizer has no chat template."""
    bare = save_checkpoint(tmp_path / "bare", chat_template=False)
    proc = subprocess.run([sys.executable, "-m", "ftprof", "train", "lora", "--model", bare, "--dataset", chat_file,
                           "--device", "cpu", "--output-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("ftprof train: error: --dataset: chat data needs a chat "
                                                           "template")
    assert not (tmp_path / "runs").exists()

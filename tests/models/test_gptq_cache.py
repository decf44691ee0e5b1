"""The GPTQ cache: one quantization per model, however many processes ask for it at once."""

import threading

import pytest

from ftprof.config import MethodConfig
from ftprof.models import gptq
from tests.conftest import tiny_config
from tests.requires import requires, requires_run


def test_concurrent_requests_quantize_once_and_share_the_result(tmp_path, monkeypatch):
    monkeypatch.setenv(gptq.CACHE_ENV, str(tmp_path))
    calls, logs = [], []
    holding, waited = threading.Event(), threading.Event()

    def fake_quantize(build, tok, label, target, method, calib, device, log):
        calls.append(label)
        holding.set()
        waited.wait(timeout=30)  # until the second request has found the lock taken
        target.mkdir(parents=True)
        (target / "quantize_config.json").write_text("{}")

    monkeypatch.setattr(gptq, "_quantize", fake_quantize)
    method = MethodConfig(method="gptq-lora").resolved("float32")
    results = []

    def log(line):
        logs.append(line)
        waited.set()

    def request():
        results.append(gptq.ensure_quantized(None, None, "tiny", "k1", method, None, None, log))

    threads = [threading.Thread(target=request) for _ in range(2)]
    threads[0].start()
    assert holding.wait(timeout=30)
    threads[1].start()
    for t in threads:
        t.join()
    assert calls == ["tiny"]  # the second request waited and reused the first one's checkpoint
    assert results[0] == results[1] == tmp_path / "gptq" / "tiny-k1"
    assert any("waiting for another process" in line for line in logs)
    assert sorted(p.name for p in (tmp_path / "gptq").iterdir()) == ["tiny-k1"]  # no lock file left behind


def test_a_failed_quantization_leaves_no_entry_and_frees_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(gptq.CACHE_ENV, str(tmp_path))
    attempts = []

    def failing(build, tok, label, target, method, calib, device, log):
        attempts.append(1)
        raise RuntimeError("calibration failed")

    monkeypatch.setattr(gptq, "_quantize", failing)
    method = MethodConfig(method="gptq-lora").resolved("float32")
    for _ in range(2):  # a second attempt is not blocked by the first one's lock
        try:
            gptq.ensure_quantized(None, None, "tiny", "k2", method, None, None, print)
        except RuntimeError:
            pass
    assert len(attempts) == 2 and not (tmp_path / "gptq" / "tiny-k2").exists()


@pytest.mark.slow
@requires_run("gptq-lora")
def test_quantization_runs_in_a_child_process_and_keeps_its_log(tmp_path, monkeypatch):
    """A real quantization of the tiny preset: GPTQModel runs in a child process (its memory is given back when it
    exits), and the checkpoint keeps the child's log."""
    import ftprof

    monkeypatch.setenv(gptq.CACHE_ENV, str(tmp_path / "cache"))
    result = ftprof.train(tiny_config(tmp_path, "gptq-lora", max_steps=1, measure_warmup_steps=0))
    assert result.status == "ok", result.failure.error_message
    entries = [p for p in (tmp_path / "cache" / "gptq").iterdir() if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / "quantize_config.json").is_file()
    assert (entries[0] / "quantize.log").read_text().strip()  # the child's output, kept off the terminal


@pytest.mark.slow  # GPTQ quantization: seconds to a minute on the 2-core machine
@requires("gptqmodel")
def test_a_failing_quantizer_child_is_one_clear_error(tmp_path):
    spec = {"bits": 4, "group_size": 128, "quantizer": "rtn", "backend": "torch", "device": "cpu",
            "calibration": str(tmp_path / "missing.pt"), "logs": str(tmp_path / "logs")}
    with pytest.raises(RuntimeError, match=r"GPTQ quantization failed \(exit 1\): .*"):
        gptq.run_quantizer(tmp_path / "no-model", tmp_path / "out", spec, tmp_path / "q.log")
    assert (tmp_path / "q.log").read_text().strip()  # the child's traceback went to the log, not the terminal

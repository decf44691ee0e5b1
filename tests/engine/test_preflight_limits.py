"""Preflight refuses what cannot run before the model loads: a CPU run that cannot fit in host memory (with the
numbers), a hub id or hub dataset with the hub unreachable (no retries; the line names HF_HUB_OFFLINE); a host
out-of-memory during a run is oom_host."""

import pytest

from ftprof.host_memory import GIB, host_need, parameter_count
from ftprof.models.source import resolve_model_source
from tests.conftest import assert_train_refuses


def test_parameter_count_of_presets_matches_their_sizes():
    assert parameter_count(resolve_model_source("llama-8b").config) == pytest.approx(8.03e9, rel=0.01)
    assert parameter_count(resolve_model_source("llama-70b").config) == pytest.approx(69.0e9, rel=0.01)


def test_full_fine_tuning_counts_gradients_and_two_adam_states():
    config = resolve_model_source("llama-8b").config
    need = host_need(config, "full", "float32", 1, 128)
    assert need.gradients == need.weights and need.optimizer == 2 * need.weights
    lora = host_need(config, "lora", "float32", 1, 128)
    assert lora.gradients == 0 and lora.weights == need.weights
    assert host_need(config, "qlora", "float32", 1, 128).weights == pytest.approx(need.weights / 8, rel=0.01)


@pytest.mark.parametrize("method, argv, fragment", [
    ("lora", ["--batch-size", "100000000"], "logits"),
    ("full", ["--model", "llama-70b"], "Adam state"),
])
def test_a_cpu_run_that_cannot_fit_is_refused_with_the_numbers(tmp_path, capsys, method, argv, fragment):
    assert_train_refuses(tmp_path, capsys, method, argv, "host memory: this CPU run needs at least")
    assert_train_refuses(tmp_path, capsys, method, argv, fragment)


def test_the_prediction_uses_available_memory(tmp_path, capsys, monkeypatch):
    import ftprof.host_memory as host_memory

    monkeypatch.setattr(host_memory, "available_bytes", lambda: GIB // 1024)  # 1 MiB left
    assert_train_refuses(tmp_path, capsys, "lora", [], "the machine has 0.0 GiB available")


def test_host_allocation_failure_is_oom_host():
    from ftprof.engine.trainer import classify_exception
    from ftprof.results.status import Status

    exc = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 102400000000 bytes.")
    assert classify_exception(exc) is Status.OOM_HOST and Status.OOM_HOST.exit_code == 3
    assert classify_exception(RuntimeError("other")) is Status.ERROR


def test_what_fails_once_the_process_was_asked_to_stop_is_an_interruption(monkeypatch):
    # a rank stopped while its peer is inside a collective can see the peer leave first, as gloo's error
    from ftprof import lifetime
    from ftprof.engine.trainer import classify_exception
    from ftprof.results.status import Status

    monkeypatch.setattr(lifetime, "_stop_requested", [])
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    assert classify_exception(gloo) is Status.ERROR
    lifetime.request_stop()
    assert classify_exception(gloo) is Status.INTERRUPTED


@pytest.fixture
def hub_unreachable(monkeypatch):
    """The hub does not answer; HF_HUB_OFFLINE and the libraries' copies of it are restored afterwards."""
    import sys

    from ftprof.data import hub

    monkeypatch.setattr(hub, "_connect", lambda: False)
    monkeypatch.setattr(hub, "_probed", [])
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for module, attr in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                         ("transformers.utils.hub", "_is_offline_mode"), ("datasets.config", "HF_DATASETS_OFFLINE")):
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, attr):
            monkeypatch.setattr(loaded, attr, getattr(loaded, attr))


@pytest.mark.parametrize("argv", [["--dataset", "nobody/no-such-dataset"], ["--model", "nobody/no-such-model"]])
def test_an_unreachable_hub_is_one_line_naming_hf_hub_offline_without_retries(tmp_path, capsys, hub_unreachable,
                                                                               argv, monkeypatch):
    """No request is tried once the probe found the hub unreachable: no name looked up, no connection, and none of
    huggingface_hub's backoff sleeps between retries (those would take about 25 s)."""
    import socket
    import threading
    import time

    attempts = []

    def refuse(what):
        def attempt(*args, **kwargs):
            attempts.append((what, args[:2]))
            raise OSError(f"{what}: no network in this test")
        return attempt

    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    real_sleep, here = time.sleep, threading.get_ident()

    def sleep(seconds):
        if threading.get_ident() == here:  # the run's own thread (another library's helper thread may nap)
            attempts.append(("sleep", seconds))
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)  # huggingface_hub's http_backoff sleeps through time.sleep
    assert_train_refuses(tmp_path, capsys, "lora", argv, "HF_HUB_OFFLINE=1 was set")
    assert attempts == []


@pytest.mark.parametrize("argv, fragment", [(["--output-dir", ""], "--output-dir is empty"),
                                            (["--save", "--save-dir", " "], "--save-dir must not be empty"),
                                            (["--prof-output-dir", ""], "--prof-output-dir is empty")])
def test_an_empty_directory_option_is_refused(tmp_path, capsys, argv, fragment):
    from ftprof.cli.main import main

    code = main(["train", "lora", "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err

"""--checkpointing auto's offload choice (ftprof/plan/budget.py) reaches the model: the resolved run reports it and
the engine installs the offload hooks on the checkpointed layers. Auto never chooses the offload on the CPU (a plain
copy there), so the choice is forced into the resolved run here; the CPU offload runs the same hooks."""

from __future__ import annotations

import dataclasses

from ftprof import metrics, runtime
from ftprof.metrics import GIB
from ftprof.models import offload
from ftprof.preflight import preflight
from ftprof.results.parts import AutoChoice
from tests.conftest import run_one_step, tiny_config


def _forced(tmp_path, monkeypatch, choice: AutoChoice):
    monkeypatch.setattr(runtime, "available_memory", lambda device, cap=None: 64 * GIB)
    resolved = preflight(tiny_config(tmp_path, "lora", checkpointing="auto", seq_len=32))
    assert resolved.auto_choice.offload is False and resolved.offload_checkpoints is False  # the CPU: not tried
    return dataclasses.replace(resolved, auto_choice=choice)


def test_the_resolved_run_reports_auto_s_offload(tmp_path, monkeypatch):
    forced = _forced(tmp_path, monkeypatch, AutoChoice("full", "forced", 1, offload=True))
    assert (forced.policy, forced.checkpointed_layers, forced.offload_checkpoints) == ("full", 1, True)
    assert forced.config.model.offload_checkpoints is False  # config.json keeps what the user asked
    explicit = preflight(tiny_config(tmp_path / "explicit", "lora", checkpointing="full", offload_checkpoints=True))
    assert explicit.auto_choice is None and explicit.offload_checkpoints is True  # the flag itself: unchanged


def test_the_engine_offloads_the_layers_auto_chose(tmp_path, monkeypatch):
    from ftprof.engine.build import build
    from ftprof.profiling.memory import MemoryTracker

    forced = _forced(tmp_path, monkeypatch, AutoChoice("full", "forced", None, offload=True))
    lines: list[str] = []
    built = build(forced, MemoryTracker(forced.device), lines.append)
    assert built.checkpointing == "full"
    assert offload.offloaded_layers(built.model) == metrics.decoder_layers(built.model)
    assert any(line.startswith("--offload-checkpoints: 2 layer inputs") for line in lines), lines
    run_one_step(forced, built)  # forward and backward through the hooks
    assert offload.offloader_of(built.model).offloaded == 2


def test_without_the_offload_auto_s_full_installs_no_hooks(tmp_path, monkeypatch):
    from ftprof.engine.build import build
    from ftprof.profiling.memory import MemoryTracker

    forced = _forced(tmp_path, monkeypatch, AutoChoice("full", "forced", None))
    built = build(forced, MemoryTracker(forced.device), lambda _: None)
    assert built.checkpointing == "full" and not offload.offloaded_layers(built.model)

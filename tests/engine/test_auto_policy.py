"""--checkpointing auto's choice is written once into the resolved run (ResolvedRun.policy), and everything after
reads it there: the policy the model gets, and what the method builds for it (GPTQ-LoRA's lean backward, which
only pays where no layer is recomputed)."""

from __future__ import annotations

import pytest

from ftprof import runtime
from ftprof.analysis.run_facts import run_facts
from ftprof.metrics import GIB
from tests.conftest import build_run, tiny_config
from tests.requires import requires


def _lean_linears(model) -> int:
    """GPTQ linears whose forward was routed through models/gptq.py's lean backward."""
    return sum(1 for m in model.modules() if hasattr(m, "qweight") and "lean" in getattr(m.forward, "__qualname__", ""))


def _available_for(cfg, policy: str) -> int:
    """Memory for which auto's fastest fitting policy is ``policy``: above its predicted peak (plus the 1 GiB
    margin), below the next faster policy's."""
    import dataclasses

    from ftprof.models.source import resolve_model_source
    from ftprof.plan.candidates import of_config
    from ftprof.plan.predict import Target, planner

    p = planner(cfg, resolve_model_source("tiny"), "float32", Target("cpu"))
    peak = {c: p.predict(dataclasses.replace(of_config(cfg), checkpointing=c)).peak_bytes
            for c in ("none", "selective", "full")}
    faster = {"full": "selective", "selective": "none"}.get(policy)
    above = GIB + peak[policy] + 1
    return above if faster is None else (above + GIB + peak[faster]) // 2


@pytest.mark.slow
@requires("gptqmodel", "peft")
@pytest.mark.parametrize("policy", ["none", "full"])
def test_gptq_lora_gets_the_lean_backward_only_where_auto_recomputes_nothing(tmp_path, monkeypatch, policy):
    cfg = tiny_config(tmp_path, "gptq-lora", checkpointing="auto", max_steps=1)
    available = 64 * GIB if policy == "none" else _available_for(cfg, "full")
    monkeypatch.setattr(runtime, "available_memory", lambda device, cap=None: available)
    resolved, built = build_run(cfg)
    assert resolved.policy == built.checkpointing == policy
    lean = _lean_linears(built.model)
    assert (lean > 0) == (policy == "none"), lean


def test_the_resolved_run_reads_auto_s_choice(tmp_path, monkeypatch):
    from ftprof.preflight import preflight

    monkeypatch.setattr(runtime, "available_memory", lambda device, cap=None: 64 * GIB)
    resolved = preflight(tiny_config(tmp_path, "lora", checkpointing="auto"))
    assert resolved.config.model.checkpointing == "auto"  # config.json keeps what the user asked
    assert resolved.policy == resolved.auto_choice.policy == "none" and resolved.checkpointed_layers is None


@pytest.mark.parametrize(("ran", "expected"), [(True, True), (False, False)])
def test_an_auto_run_s_trace_facts_say_what_ran(ran, expected):
    """An auto run's config.json has no yes/no (auto chose at run time): the trace's record of what ran decides,
    so the recomputation diagnosis is not lost for every auto run."""
    config = {"model": {"checkpointing": "auto", "gradient_checkpointing": None}, "method": {"method": "lora"}}
    meta = {"ftprof": {"checkpointing": ran, "checkpointing_policy": "full" if ran else "none"}}
    assert run_facts(meta, config).checkpointing is expected
    assert run_facts({}, {"model": {"checkpointing": "selective", "gradient_checkpointing": None}}).checkpointing


@pytest.mark.parametrize(("method", "policy", "lean"), [("lora", "full", True), ("lora", "none", False),
                                                         ("full", "full", False)])
def test_auto_s_full_recomputes_lean_where_it_applies(tmp_path, monkeypatch, method, policy, lean):
    """Where auto lands on full checkpointing it takes --lean-recompute too (the same memory, fewer FLOPs: the
    planner prices it faster); the model gets it, and the FLOP count says so. Not for a full fine-tune (it trains
    the weight) nor where nothing is recomputed."""
    from ftprof.models import recompute

    cfg = tiny_config(tmp_path, method, checkpointing="auto", max_steps=1)
    available = 64 * GIB if policy == "none" else _available_for(cfg, "full")
    monkeypatch.setattr(runtime, "available_memory", lambda device, cap=None: available)
    resolved, built = build_run(cfg)
    assert resolved.policy == built.checkpointing == policy
    assert resolved.lean_recompute is resolved.auto_choice.lean_recompute is lean
    assert resolved.config.model.lean_recompute is False  # config.json keeps what the user asked
    assert any(recompute.marked(m) for m in built.model.modules()) is lean
    assert ("--lean-recompute too" in resolved.auto_choice.reason) is lean


def test_lean_recompute_asked_where_auto_chooses_none_is_said(tmp_path, monkeypatch):
    from ftprof.preflight import preflight

    monkeypatch.setattr(runtime, "available_memory", lambda device, cap=None: 64 * GIB)
    resolved = preflight(tiny_config(tmp_path, "lora", checkpointing="auto", lean_recompute=True))
    assert resolved.policy == "none" and not resolved.lean_recompute
    assert "--lean-recompute does nothing here: --checkpointing auto chose none" in " ".join(resolved.notes)

"""The option declarations (ftprof/config/declarations.py) are what validation, the effective configuration, the
planner's candidates and classes, the probe cache key and report labels read: each reader is checked here against
the declarations themselves, so a new declaration is picked up everywhere without code of its own."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from ftprof.config import MethodConfig, ModelConfig, RunConfig, declarations
from ftprof.config.declarations import BY_NAME, DECLARED
from ftprof.errors import ConfigError
from ftprof.plan import calibration
from ftprof.plan.candidates import Candidate, enumerate_candidates, of_config
from ftprof.results.effective import effective_frame
from ftprof.results.labels import short


@pytest.mark.parametrize(("flat", "message"), [
    ({"method": "full", "fp8_base": True}, "--fp8-base is a LoRA and QLoRA option and does not apply to method 'full'"),
    ({"method": "gptq-lora", "lora_fused_projections": True}, "--lora-fused-projections is a LoRA and QLoRA option"),
    ({"method": "lora", "fp8_base": True, "lora_fused_projections": True},
     "--fp8-base and --lora-fused-projections each decide how the base weights are multiplied: pick one"),
    ({"method": "qlora", "fp8_base": True, "compile": True, "compile_dequant": True},
     "--compile-dequant and --fp8-base each dequantize the 4-bit weights: pick one"),
    ({"method": "lora", "compile_mode": "reduce-overhead"}, "--compile-mode reduce-overhead needs --compile"),
    ({"method": "lora", "compile_tuning": True}, "--compile-tuning needs --compile"),
    ({"method": "lora", "fp8_base": True, "nproc_per_node": 2},
     "--fp8-base keeps e4m3 copies of whole base weights, which FSDP shards"),
    ({"method": "lora", "lora_fused_projections": True, "nproc_per_node": 2},
     "--lora-fused-projections joins base weights into one buffer"),
])
def test_a_declared_combination_is_refused_in_one_line(flat, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as caught:
        RunConfig.from_flat(flat)
    assert "\n" not in str(caught.value)


def test_what_the_declarations_allow_is_accepted():
    RunConfig.from_flat({"method": "lora", "compile": True, "compile_mode": "max-autotune-no-cudagraphs",
                         "grad_accum": 2})  # no CUDA graphs: accumulation is fine
    RunConfig.from_flat({"method": "lora", "compile": True, "compile_mode": "reduce-overhead", "batch_size": 4})
    RunConfig.from_flat({"method": "qlora", "compile": True, "compile_mode": "reduce-overhead", "grad_accum": 4})
    cfg = RunConfig.from_flat({"method": "qlora", "fp8_base": True, "compile": True, "compile_mode": "reduce-overhead",
                               "compile_tuning": True})
    assert cfg.method.fp8_base and cfg.model.compile_mode == "reduce-overhead"
    assert not declarations.problems(cfg.declared_values())


def test_every_declaration_names_a_real_field_and_effect():
    fields = {f.name for section in (MethodConfig, ModelConfig) for f in dataclasses.fields(section)}
    fields |= {f.name for f in dataclasses.fields(RunConfig.__dataclass_fields__["data"].default_factory())}
    for d in DECLARED:
        assert d.name in fields, d.name
        assert d.effects and d.effects <= declarations.EFFECTS, d.name
        for when in (*d.needs, *d.void_when, *(e.when for e in d.excludes)):
            assert when.option in fields | {declarations.SHARDED, declarations.SEVERAL,
                                            "method", "kernels",
                                            "checkpointing", "attn_implementation"}, (d.name, when.option)


def _frame(rows):
    return effective_frame(pd.DataFrame(rows))


def test_the_effective_configuration_drops_a_declared_option_where_it_does_nothing():
    eff = _frame([
        {"method": "full", "fp8_base": True, "compile": False, "compile_mode": "reduce-overhead", "kernels": "eager"},
        {"method": "lora", "fp8_base": True, "compile": True, "compile_mode": "reduce-overhead", "kernels": "liger",
         "compile_loss": False},
        {"method": "lora", "fp8_base": False, "compile": True, "compile_mode": "default", "kernels": "eager",
         "compile_loss": False},
    ])
    assert eff["fp8_base"].tolist() == [None, True, False]  # full: not a full fine-tune's option
    assert eff["compile_mode"].tolist() == [None, "reduce-overhead", "default"]  # without --compile: nothing
    assert eff["compile_loss"].tolist()[1:] == [None, False]  # Liger computes the loss itself


def test_report_labels_use_the_declared_spelling():
    assert short("fp8_base", True) == "fp8" and short("fp8_base", False) == "no-fp8"
    assert short("compile_mode", "reduce-overhead") == "compile-reduce-overhead"
    assert short("lora_fused_projections", True) == BY_NAME["lora_fused_projections"].spell(True)


def _options(cands, method, compiled):
    return {c.options for c in cands if c.method == method and c.compile == compiled}


def test_the_planner_tries_every_declared_candidate_option_where_it_applies():
    hopper = enumerate_candidates(["full", "qlora"], 4, 4, 1, cuda=True, capability=(9, 0))
    qlora = _options(hopper, "qlora", True)
    assert (("fp8_base", True),) in qlora and (("compile_mode", "reduce-overhead"),) in qlora
    assert (("lora_fused_projections", True),) in qlora and () in qlora
    assert not any(dict(o).get("fp8_base") and dict(o).get("lora_fused_projections") for o in qlora)  # excluded
    assert not any("compile_mode" in dict(o) for o in _options(hopper, "qlora", False))  # needs --compile
    assert _options(hopper, "full", False) == {(), (("offload_checkpoints", True),)}  # no LoRA option for full
    ampere = enumerate_candidates(["qlora"], 4, 4, 1, cuda=True, capability=(8, 0))
    assert not any("fp8_base" in dict(c.options) for c in ampere)  # no FP8 tensor cores
    cpu = enumerate_candidates(["qlora"], 4, 4, 1, compile_options=(False, True))
    assert not any(dict(c.options).get("compile_mode") == "reduce-overhead" for c in cpu)  # CUDA graphs need CUDA


def test_the_planner_avoids_cuda_graphs_where_they_failed():
    """CUDA graphs are not tried under checkpointing (measured to lose or abort on an H200); without it they are,
    at every micro-batch split (with accumulation too: the loop keeps gradient buffers of their own)."""
    graphs = [c for c in enumerate_candidates(["qlora"], 4, 4, 1, cuda=True, capability=(9, 0))
              if dict(c.options).get("compile_mode") == "reduce-overhead"]
    assert graphs and {c.checkpointing for c in graphs} == {"none"}
    assert {(c.batch_size, c.grad_accum) for c in graphs} == {(4, 1), (2, 2), (1, 4)}


def test_the_planner_tries_a_lean_recomputation_where_it_does_something():
    """Under full checkpointing, and under eager selective (compiled selective never kept what it leaves out: the
    same run twice); never without checkpointing."""
    lean = {(c.checkpointing, c.compile) for c in enumerate_candidates(["qlora"], 4, 4, 1, cuda=True,
                                                                       capability=(9, 0))
            if dict(c.options).get("lean_recompute")}
    assert lean == {("full", False), ("full", True), ("selective", False)}


def test_a_candidate_is_the_configuration_it_names():
    cand = Candidate("qlora", "full", 2, "liger", True, 4, 1, (("compile_mode", "reduce-overhead"), ("fp8_base", True)))
    assert of_config(RunConfig.from_flat({**cand.flat(), "model": "tiny"})) == cand
    assert "fp8" in cand.label and "compile-reduce-overhead" in cand.label


def test_speed_classes_and_knobs_come_from_the_declarations():
    assert calibration.DEFAULT_KNOBS["fp8_base"] is False and calibration.DEFAULT_KNOBS["compile_mode"] == "default"
    assert "compile_loss" in calibration.MEMORY_KNOBS and "fp8_base" not in calibration.MEMORY_KNOBS
    record = {"method": "lora", "policy": "none", "kernels": "eager", "compile": True, "knobs": {"fp8_base": True}}
    key = calibration.class_key(record)
    assert key.options == (("fp8_base", True),) and key.base.options == () and key.describe().endswith("fp8")
    assert calibration.class_key({**record, "method": "full"}).options == ()  # not an option of full


def test_the_probe_cache_key_follows_every_method_option_it_measures():
    from ftprof.models.source import resolve_model_source
    from ftprof.plan.probe import cache_key

    source = resolve_model_source("tiny")

    def key(**method):
        cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", **method})
        return cache_key(dataclasses.replace(cfg, method=cfg.method.resolved("float32", preset=True)), source,
                         "float32")

    base = key()
    assert key(lora_dropout=0.1) != base  # an undeclared method option keys the probe: never a stale probe
    assert key(lora_addmm=True) != base  # changes what is saved? declared for speed only, but measured: keyed
    assert key(fp8_base=True) == base  # sized from layouts by the memory model, not measured by the probe


def test_a_cuda_graph_run_gets_a_prediction():
    """The probe builds the model eager and uncompiled: compile's own options go back to their defaults with it
    (a CUDA-graph mode without --compile is refused by the configuration, and the run went unpredicted)."""
    from ftprof.models.source import resolve_model_source
    from ftprof.plan.predict import Target, planner

    cfg = RunConfig.from_flat({"model": "tiny", "method": "qlora", "compile": True, "compile_mode": "reduce-overhead",
                               "fp8_base": True, "seq_len": 64})
    cfg = dataclasses.replace(cfg, method=cfg.method.resolved("bfloat16", preset=True))
    p = planner(cfg, resolve_model_source("tiny"), "bfloat16", Target("NVIDIA H200", capability=(9, 0)))
    prediction = p.predict(of_config(cfg))
    assert prediction.peak_bytes > 0
    assert prediction.candidate["compile_mode"] == "reduce-overhead" and prediction.candidate["fp8_base"] is True


@pytest.mark.slow  # the llama-1b probe: seconds
def test_the_fewest_layers_rows_keep_what_full_checkpointing_allows(tmp_path):
    """The plan's 'full on the fewest layers that fit' rows come from full-checkpointing candidates only: no CUDA
    graphs among them (an H200 plan at 24 GiB offered one as its top pick)."""
    from ftprof.plan.make import PlanRequest, make_plan

    cfg = RunConfig.from_flat({"model": "llama-1b", "method": "qlora", "seq_len": 2048, "batch_size": 4,
                               "output_dir": str(tmp_path), "memory_limit_gib": 12})
    plan = make_plan(PlanRequest(cfg, ("qlora",), gpu="h200"))
    partial = [r for r in plan.rows if r.candidate.checkpointing == "full" and r.candidate.checkpoint_layers]
    assert partial and not any(dict(r.candidate.options).get("compile_mode") for r in partial)

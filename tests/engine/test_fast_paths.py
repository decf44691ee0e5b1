"""Fast paths as run options on CPU: checkpointing policies (numerics and memory), auto's choice, compile, and the
one-line errors for what cannot run here. The GPU numerics against eager are in tests/gpu/test_gpu_fast_paths.py."""

import json
from pathlib import Path

import pytest
import torch

import ftprof
from tests.conftest import assert_train_refuses, tiny_config
from tests.tolerances import COMPILED_LOSS, LOSS_AFTER_STEPS

GIB = 1 << 30


@pytest.fixture(scope="module")
def policy_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("policies")
    return {p: ftprof.train(tiny_config(out / p, "lora", checkpointing=p, max_steps=3, seq_len=64, lr=3e-3))
            for p in ("none", "selective", "full")}


def test_policies_train_the_same_numbers(policy_runs):
    losses = {p: (r.throughput.loss_first, r.throughput.loss_last) for p, r in policy_runs.items()}
    assert all(r.status == "ok" for r in policy_runs.values())
    assert losses["selective"] == pytest.approx(losses["none"], rel=LOSS_AFTER_STEPS)
    assert losses["full"] == pytest.approx(losses["none"], rel=LOSS_AFTER_STEPS)


def test_selective_keeps_less_than_none_and_more_than_full(policy_runs):
    saved = {p: r.memory.memory_breakdown.activations_saved for p, r in policy_runs.items()}
    assert saved["full"] < saved["selective"] < saved["none"], saved
    assert {p: r.checkpointing.checkpointing_policy for p, r in policy_runs.items()} == {p: p for p in policy_runs}
    # HFU counts what is recomputed: the layers' matmuls under full, none under selective
    assert policy_runs["full"].flops.recompute_flops_per_token > 0
    assert policy_runs["selective"].flops.recompute_flops_per_token == 0


@pytest.mark.slow
def test_selective_saves_the_joined_projections_output_as_it_saves_a_matmuls(tmp_path, policy_runs):
    """ftprof's own GEMM ops (--lora-fused-projections' joined GEMM, --fp8-base's) are matmuls to selective's
    policy: left out, their outputs were recomputed in backward, a whole base forward again."""
    joined = ftprof.train(tiny_config(tmp_path, "lora", checkpointing="selective", max_steps=3, seq_len=64, lr=3e-3,
                                      lora_fused_projections=True))
    plain = policy_runs["selective"]
    assert joined.status == "ok"
    saved = joined.memory.memory_breakdown.activations_saved
    assert saved == pytest.approx(plain.memory.memory_breakdown.activations_saved, rel=0.02)
    assert joined.throughput.loss_last == pytest.approx(plain.throughput.loss_last, rel=LOSS_AFTER_STEPS)


def test_auto_records_its_choice_and_estimates(tmp_path):
    result = ftprof.train(tiny_config(tmp_path, "lora", checkpointing="auto", max_steps=2, run_name="a"))
    auto = result.checkpointing.checkpointing_auto
    assert result.status == "ok" and result.checkpointing.checkpointing_policy == auto.policy == "none"  # tiny fits
    est = auto.estimated_peak
    assert est["none"] > est["selective"] > est["full"] > auto.static_bytes > 0
    assert "fits" in auto.reason
    assert json.loads((tmp_path / "a" / "config.json").read_text())["model"]["checkpointing"] == "auto"


def test_partial_checkpointing_sits_between_full_and_none(policy_runs, tmp_path):
    """The tiny preset's first of its two layers checkpointed: the same numbers, half full's recomputation, and
    saved activations between full's and none's."""
    run = ftprof.train(tiny_config(tmp_path, "lora", checkpointing="full", checkpoint_layers=1, max_steps=3,
                                   seq_len=64, lr=3e-3))
    assert run.status == "ok", run.failure.error_message
    assert run.checkpointing.checkpointing_policy == "full" and run.checkpointing.checkpointed_layers == 1
    none = policy_runs["none"].throughput
    assert (run.throughput.loss_first, run.throughput.loss_last) == pytest.approx((none.loss_first, none.loss_last),
                                                                                  rel=1e-5)
    assert run.flops.recompute_flops_per_token == pytest.approx(policy_runs["full"].flops.recompute_flops_per_token / 2)
    saved = {p: r.memory.memory_breakdown.activations_saved for p, r in policy_runs.items()}
    assert saved["full"] < run.memory.memory_breakdown.activations_saved < saved["none"], saved


def test_compile_under_partial_checkpointing_compiles_checkpointed_blocks_inside_their_checkpoint():
    from transformers import AutoModelForCausalLM

    from ftprof.engine.compile import _scope, compile_targets
    from ftprof.metrics import decoder_layers
    from ftprof.models.checkpointing import apply_policy
    from ftprof.models.presets import preset_config

    model = AutoModelForCausalLM.from_config(preset_config("tiny"))
    model.train()
    apply_policy(model, "full", layers=1)
    first, second = decoder_layers(model)
    assert first.gradient_checkpointing and not second.gradient_checkpointing
    targets = compile_targets(model)
    assert targets == [second]  # the first is compiled inside its checkpoint (engine/compiled_checkpoint.py)
    assert _scope([first, second], targets) == "block inside its checkpoint in 1 of 2 blocks"  # compile.scope
    graphs = compile_targets(model, "reduce-overhead")  # CUDA graphs: the checkpointed block's children
    assert second in graphs and all(c in graphs for c in first.children()) and first not in graphs
    assert _scope([first, second], graphs) == "block children in 1 of 2 blocks"
    apply_policy(model, "none")
    assert compile_targets(model) == [first, second]


def test_compile_tuning_spells_the_mode_out_as_options():
    """torch.compile refuses a mode and options together: with --compile-tuning the mode's own options go first."""
    from ftprof.engine.compile import compile_kwargs

    assert compile_kwargs("default", False) == {"mode": None}
    assert compile_kwargs("reduce-overhead", False) == {"mode": "reduce-overhead"}
    assert compile_kwargs("default", True) == {"options": {"coordinate_descent_tuning": True}}
    assert compile_kwargs("reduce-overhead", True) == {"options": {"triton.cudagraphs": True,
                                                                   "coordinate_descent_tuning": True}}
    torch.compile(torch.nn.Linear(2, 2), **compile_kwargs("reduce-overhead", True))  # accepted (compiles lazily)


@pytest.mark.slow
def test_compile_tuning_is_recorded_and_matches_eager_on_cpu(tmp_path):
    eager = ftprof.train(tiny_config(tmp_path / "e", "lora", max_steps=2))
    tuned = ftprof.train(tiny_config(tmp_path / "t", "lora", max_steps=2, compile=True, compile_tuning=True))
    assert tuned.status == "ok" and tuned.compile.outcome.tuning is True
    assert tuned.throughput.loss_last == pytest.approx(eager.throughput.loss_last,
                                                       rel=1e-3 if tuned.compile.outcome.compiled else 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs"])
def test_compile_matches_eager_on_cpu(tmp_path, mode):
    eager = ftprof.train(tiny_config(tmp_path / "e", "lora", max_steps=3))
    compiled = ftprof.train(tiny_config(tmp_path / "c", "lora", max_steps=3, compile=True, compile_mode=mode))
    assert compiled.status == "ok" and compiled.compile.outcome.blocks == 2
    assert compiled.compile.outcome.mode == mode
    if compiled.compile.outcome.compiled:
        assert compiled.compile.compile_time_s > 0
        assert compiled.compile.outcome.loss  # transformers' loss (upcast + cross entropy) is compiled with the blocks
        assert compiled.throughput.loss_last == pytest.approx(eager.throughput.loss_last, rel=COMPILED_LOSS)
    else:  # no working C++ toolchain for inductor here: the run fell back to eager and said why
        assert compiled.compile.outcome.fallback and any("--compile" in n for n in compiled.notes)
        assert compiled.throughput.loss_last == pytest.approx(eager.throughput.loss_last, rel=1e-6)


@pytest.mark.slow
def test_compile_under_selective_checkpointing_traces_each_block_whole(tmp_path, policy_runs):
    """A side effect in the block's forward (transformers' hub-kernel wrapper sets a context variable) broke the
    selective checkpoint's graph, and the blocks ran mostly eager: slower compiled than not."""
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = ftprof.train(tiny_config(tmp_path / "c", "lora", checkpointing="selective", max_steps=3, seq_len=64,
                                        lr=3e-3, compile=True))
    assert compiled.status == "ok"
    if compiled.compile.outcome.compiled:
        assert not counters["graph_break"], dict(counters["graph_break"])
        eager = policy_runs["selective"].throughput
        assert compiled.throughput.loss_last == pytest.approx(eager.loss_last, rel=COMPILED_LOSS)


def test_a_failed_compile_puts_blocks_and_loss_back_to_eager(tmp_path):
    """warm_up's fallback: whatever fails in the first forward, every compiled block and the loss run eager again."""
    import contextlib

    from ftprof.engine.compile import causal_lm, compile_targets, warm_up
    from tests.conftest import build_run

    plan, built = build_run(tiny_config(tmp_path, "lora"))
    eager_loss = causal_lm(built.model).loss_function
    vocab = causal_lm(built.model).config.vocab_size
    bad = {"input_ids": torch.full((1, 8), vocab + 5), "labels": torch.zeros((1, 8), dtype=torch.long)}
    notes = []
    outcome = warm_up(built.model, built.params, bad, contextlib.nullcontext, notes.append)
    assert not outcome.compiled and not outcome.loss and outcome.fallback, outcome
    assert notes and notes[0].startswith("--compile: decoder blocks did not compile")
    assert all(m._compiled_call_impl is None for m in compile_targets(built.model))
    assert causal_lm(built.model).loss_function is eager_loss


def test_a_failed_compile_under_full_checkpointing_puts_the_layers_checkpoint_back(tmp_path):
    """The same fallback with each layer compiled inside its checkpoint: the layers' checkpoint functions are
    torch's own again."""
    import contextlib

    from ftprof.engine import compiled_checkpoint
    from ftprof.engine.compile import causal_lm, warm_up
    from ftprof.metrics import decoder_layers
    from tests.conftest import build_run

    plan, built = build_run(tiny_config(tmp_path, "lora", checkpointing="full"))
    layers = decoder_layers(built.model)
    eager = [block._gradient_checkpointing_func for block in layers]
    vocab = causal_lm(built.model).config.vocab_size
    bad = {"input_ids": torch.full((1, 8), vocab + 5), "labels": torch.zeros((1, 8), dtype=torch.long)}
    outcome = warm_up(built.model, built.params, bad, contextlib.nullcontext, lambda _line: None)
    assert not outcome.compiled and outcome.scope == "block inside its checkpoint", outcome
    assert [block._gradient_checkpointing_func for block in layers] == eager
    assert not any(isinstance(f, compiled_checkpoint.CompiledForward) for f in eager)


@pytest.mark.slow  # torch.compile: inductor builds C++ kernels (tens of seconds on 2 cores)
def test_a_loss_that_does_not_compile_runs_eager_and_the_blocks_stay_compiled(tmp_path):
    import contextlib

    from ftprof.engine.compile import causal_lm, compile_targets, warm_up
    from tests.conftest import build_run

    plan, built = build_run(tiny_config(tmp_path, "lora"))
    lm = causal_lm(built.model)
    eager = lm.loss_function

    def loss_with_a_graph_break(*args, **kwargs):
        torch._dynamo.graph_break()  # what a host sync in a user's loss does to the compiled graph
        return eager(*args, **kwargs)

    lm.loss_function = loss_with_a_graph_break
    batch = next(built.batches)
    notes = []
    outcome = warm_up(built.model, built.params, batch, contextlib.nullcontext, notes.append)
    assert lm.loss_function is loss_with_a_graph_break and not outcome.loss
    if not outcome.compiled:  # no C++ compiler for inductor here: everything went back to eager, and said so
        assert outcome.fallback and notes[-1].startswith("--compile: decoder blocks did not compile"), notes
        return
    assert outcome.fallback is None
    assert notes == [notes[0]] and notes[0].startswith("--compile: the loss did not compile"), notes
    assert all(m._compiled_call_impl is not None for m in compile_targets(built.model))
    assert all(p.grad is None for p in built.params)


@pytest.mark.slow  # torch.compile: inductor builds C++ kernels (tens of seconds on 2 cores)
def test_compile_compiles_the_loss_the_model_calls(tmp_path):
    """Under PEFT the loss is set on the transformers model itself (the one whose forward reads it), not on PEFT's
    wrapper, which forwards attribute reads but keeps what is set on it."""
    from transformers import PreTrainedModel

    from ftprof.engine.compile import causal_lm
    from tests.conftest import build_run

    plan, built = build_run(tiny_config(tmp_path / "on", "lora", compile=True, max_steps=1))
    lm = causal_lm(built.model)
    assert isinstance(lm, PreTrainedModel) and type(lm).__name__ == "LlamaForCausalLM"
    if built.compiled.compiled:  # else no C++ compiler here: the fallback test covers the way back
        assert built.compiled.loss
        assert hasattr(lm.loss_function, "_torchdynamo_orig_callable")  # what torch.compile returns
    plan, built = build_run(tiny_config(tmp_path / "off", "lora", compile=True, compile_loss=False, max_steps=1))
    assert not built.compiled.loss  # --no-compile-loss: the blocks alone, to measure what the loss's compile buys
    assert not hasattr(causal_lm(built.model).loss_function, "_torchdynamo_orig_callable")


@pytest.mark.slow
def test_compile_under_full_checkpointing_keeps_the_checkpoint(tmp_path, policy_runs):
    """Under full checkpointing each block is compiled inside its checkpoint, so torch's checkpoint stays outside
    compiled code: the run keeps as little for backward as eager full checkpointing and trains the same numbers."""
    run = ftprof.train(tiny_config(tmp_path, "lora", checkpointing="full", compile=True, max_steps=3, seq_len=64,
                                   lr=3e-3))
    assert run.status == "ok", run.failure.error_message
    assert run.compile.outcome.compiled, run.compile.outcome
    assert run.compile.outcome.scope == "block inside its checkpoint" and run.compile.outcome.blocks == 2
    saved = {p: r.memory.memory_breakdown.activations_saved for p, r in policy_runs.items()}
    activations = run.memory.memory_breakdown.activations_saved
    assert activations <= saved["full"] * 1.1 < saved["none"], (activations, saved)
    full = policy_runs["full"].throughput
    assert (run.throughput.loss_first, run.throughput.loss_last) == pytest.approx((full.loss_first, full.loss_last),
                                                                                  rel=1e-3)


@pytest.mark.parametrize("argv, fragment", [
    (["--kernels", "liger"], "--kernels liger needs a CUDA device"),
    (["--sdpa-backend", "cudnn"], "--sdpa-backend cudnn needs a CUDA device"),
    (["--sdpa-backend", "fast"], "invalid choice"),
    (["--kernels", "liger", "--lora-targets", "q_proj,lm_head"], "--lora-targets lm_head"),
    (["--no-gradient-checkpointing", "--checkpointing", "full"], "contradicts --checkpointing full"),
    (["--checkpoint-layers", "1"], "applies to --checkpointing full or selective, not none"),
    (["--memory-limit-gib", "12"], "--memory-limit-gib caps GPU memory: it needs a CUDA device"),
    (["--memory-limit-gib", "nan"], "--memory-limit-gib must be a finite number"),
    (["--memory-limit-gib", "0"], "positive number of GiB"),
    (["--checkpointing", "auto", "--checkpoint-layers", "1"], "auto picks the count itself"),
    (["--checkpointing", "full", "--checkpoint-layers", "3"], "has 2 decoder layers"),
    (["--checkpointing", "full", "--checkpoint-layers", "0"], "at least 1"),
    (["--checkpointing", "sometimes"], "invalid choice"),
    (["--compile-mode", "max-autotune-no-cudagraphs"], "--compile-mode max-autotune-no-cudagraphs needs --compile"),
    (["--compile", "--compile-mode", "reduce-overhead"], "needs a CUDA device"),
    (["--compile-dequant"], "--compile-dequant needs --compile"),
    (["--compile-tuning"], "--compile-tuning needs --compile"),
    (["--keep-dequantized"], "--keep-dequantized is a bitsandbytes option"),  # the command's method is lora
    (["--compile", "--compile-mode", "fastest"], "invalid choice"),
    (["--checkpointing", "auto", "--nproc-per-node", "2"], "--checkpointing auto estimates one unsharded"),
    (["--checkpointing", "auto", "--fsdp-cpu-offload"], "--checkpointing auto estimates one unsharded"),
])
def test_fast_path_bad_input_is_one_line(tmp_path, capsys, argv, fragment):
    assert_train_refuses(tmp_path, capsys, "lora", argv, fragment)


def test_compile_caches_are_keyed_on_ftprofs_model_code(monkeypatch, tmp_path):
    """torch.compile's cache keys carry a digest of ftprof's model code (a custom op's backward is traced from
    Python torch's keys do not cover), added once to a tag the user set, and changed by any change to that code."""
    import shutil

    import torch.compiler.config as compiler_config

    from ftprof import models
    from ftprof.engine.compile import tag_caches

    with compiler_config.patch(cache_key_tag="mine"):  # (monkeypatch would delete torch's config entry on undo)
        tag_caches()
        tag_caches()
        first = compiler_config.cache_key_tag
    assert first.startswith("mine+ftprof-") and first.count("ftprof-") == 1
    copy = tmp_path / "models"
    shutil.copytree(Path(models.__file__).parent, copy)
    (copy / "fp8_kernels.py").write_text((copy / "fp8_kernels.py").read_text() + "\n# changed\n")
    monkeypatch.setattr(models, "__file__", str(copy / "__init__.py"))
    with compiler_config.patch(cache_key_tag=""):
        tag_caches()
        changed = compiler_config.cache_key_tag
    assert changed.startswith("ftprof-") and changed != first.removeprefix("mine+")

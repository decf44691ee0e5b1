import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ftprof import metrics
from ftprof.models.materialize import build_random_model
from ftprof.models.presets import preset_config


def _measured_flops_per_token(model, seq_len, batch=2):
    ids = torch.randint(3, 500, (batch, seq_len))
    with FlopCounterMode(display=False) as counter:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return counter.get_total_flops() / (batch * seq_len)


def _tiny(attn="sdpa"):
    return build_random_model(preset_config("tiny"), torch.device("cpu"), torch.float32, attn_implementation=attn)


def test_full_finetune_formula_matches_flop_counter():
    model = _tiny("eager")  # eager attention: its matmuls are visible to the counter
    seq = 64
    layers, dim = metrics.attention_dims(model.config)
    predicted = metrics.flops_per_token(metrics.count_params(model), layers, dim, seq)
    assert _measured_flops_per_token(model, seq) == pytest.approx(predicted, rel=0.02)


def test_matmul_part_matches_with_sdpa():
    # FlopCounterMode has no formula for the CPU SDPA kernel, so it sees the weight matmuls only.
    model = _tiny("sdpa")
    seq = 64
    layers, dim = metrics.attention_dims(model.config)
    predicted = metrics.flops_per_token(metrics.count_params(model), layers, dim, seq) - 12 * layers * dim * seq
    assert _measured_flops_per_token(model, seq) == pytest.approx(predicted, rel=0.02)


def test_lora_formula_matches_flop_counter():
    from peft import LoraConfig, get_peft_model

    model = _tiny("eager")
    model.requires_grad_(False)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                  "gate_proj", "up_proj", "down_proj"]))
    counts = metrics.count_params(model)
    assert counts.trainable_matmul == sum(p.numel() for p in model.parameters() if p.requires_grad)
    seq = 64
    layers, dim = metrics.attention_dims(model.config)
    predicted = metrics.flops_per_token(counts, layers, dim, seq)
    # The frozen embeddings feed layer 0, so autograd skips the input-grad of layer 0's first projections:
    # the counter sees slightly less than the convention's 4N for them.
    measured = _measured_flops_per_token(model, seq)
    assert measured == pytest.approx(predicted, rel=0.06)
    assert measured <= predicted


def test_peak_table_and_unknown_device():
    assert metrics.peak_flops("NVIDIA H200") == 989e12
    assert metrics.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert metrics.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert metrics.peak_flops("Some Future GPU") is None
    assert metrics.utilization(1e9, 1000.0, None) is None
    assert metrics.utilization(1e9, 1000.0, 1e13) == pytest.approx(0.1)


def test_step_stats():
    stats = metrics.step_stats([1.0, 2.0, 3.0, 4.0, 10.0])
    assert stats.median == 3.0 and stats.p90 == 10.0 and stats.mean == 4.0 and stats.count == 5
    assert metrics.step_stats([]) is None
    assert metrics.step_stats([2.0]).stdev == 0.0


def test_throughput_is_summed_over_ranks():
    total, per_gpu = metrics.throughput(4096, 0.5, world_size=2)
    assert per_gpu == 8192 and total == 16384


def test_recompute_counts_decoder_layers_only():
    model = _tiny("eager")
    all_params = metrics.count_params(model)
    layers_only = metrics.count_params(torch.nn.ModuleList(metrics.decoder_layers(model)))
    lm_head = model.lm_head.in_features * model.lm_head.out_features
    assert all_params.trainable_matmul - layers_only.trainable_matmul == lm_head
    layers, dim = metrics.attention_dims(model.config)
    down = sum(layer.mlp.down_proj.in_features * layer.mlp.down_proj.out_features for layer in model.model.layers)
    recomputed = metrics.recomputed_params(model)
    assert recomputed.trainable_matmul == layers_only.trainable_matmul - down
    extra = metrics.recompute_flops_per_token(recomputed, layers, dim, 64)
    assert extra == 2 * recomputed.trainable_matmul + 4 * layers * dim * 64


def _checkpointed(model):
    model.train()
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


@pytest.mark.parametrize("lora", [False, True])
def test_hfu_recompute_term_matches_flop_counter_with_checkpointing(lora):
    model = _tiny("eager")
    if lora:
        from peft import LoraConfig, get_peft_model

        model.requires_grad_(False)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                      "gate_proj", "up_proj", "down_proj"]))
    model = _checkpointed(model)
    seq = 64
    layers, dim = metrics.attention_dims(model.config)
    with_ckpt = _measured_flops_per_token(model, seq)
    recompute = metrics.recompute_flops_per_token(metrics.recomputed_params(model), layers, dim, seq)
    model.gradient_checkpointing_disable()
    without = _measured_flops_per_token(model, seq)
    assert with_ckpt - without == pytest.approx(recompute, rel=0.01)


def _step(i, phase="", warmup=False, tokens=100, seconds=0.5, **causes):
    return {"step": i, "loss": 1.0, "step_time_s": seconds, "tokens": tokens, "real_tokens": tokens,
            "warmup": warmup, "profiler_phase": phase, "started_unix": 1000.0 + i, "data_s": 0.0, "gc_s": 0.0,
            "compile_s": 0.0, "alloc_retries": 0} | causes


def test_energy_is_read_over_the_last_unbroken_stretch_of_headline_steps():
    """Profiled steps in the middle split the steady steps; energy per token comes from the last unbroken
    stretch of unprofiled ones (the trace export between cycles stays out, as it does from throughput)."""
    phases = {1: "wait", 2: "wait", 3: "warmup", 4: "active", 5: "active", 6: "", 7: ""}
    steps = [_step(i, phase, warmup=i == 1) for i, phase in phases.items()]
    window = metrics.energy_steps(steps)
    assert [s["step"] for s in window] == [6, 7]
    assert metrics.wall_window(window) == (1006.0, 1007.5)
    assert metrics.energy_per_token(30.0, window) == pytest.approx(30.0 / 200)
    assert metrics.energy_per_token(None, window) is None and metrics.energy_per_token(3.0, []) is None


def test_rank_aggregation_uses_the_same_energy_and_peak_definitions():
    from ftprof.engine.aggregate import aggregate_result, aggregate_steps
    from ftprof.results.parts import RunIdentity
    from ftprof.results.schema import RunResult

    phases = {1: "", 2: "active", 3: "", 4: ""}
    per_rank = [[dict(_step(i, p, warmup=i == 1), mem_allocated=1, mem_peak_allocated=10 * r + i, mem_reserved=2,
                      mem_peak_reserved=20 * r + i) for i, p in phases.items()] for r in (1, 2)]
    rows = aggregate_steps(per_rank)
    gathered = [{"rank": r, "summary": {"step_time_p50_s": 0.5, "torch_peak_allocated": 100 * (r + 1),
                                        "torch_peak_reserved": 150 * (r + 1)},
                 "nvml": {"energy_j": 10.0, "device_used_peak": 5, "process_used_peak": 400}} for r in (0, 1)]
    res = aggregate_result(RunResult(status="ok", run_dir="", run=RunIdentity("lora", "tiny", "cuda", "x")), gathered,
                           rows, "ddp")
    # ranks' energy summed, over the tokens of both ranks in steps 3-4 (the last unbroken unprofiled stretch)
    assert res.nvml.energy_per_token_j == pytest.approx(20.0 / 400)
    assert res.memory.torch_peak_allocated == 200 and res.memory.torch_peak_reserved == 300
    assert res.memory.non_torch_overhead == 400 - 300 and res.memory.fragmentation == 100


def test_run_peak_is_the_max_over_steps_and_stages():
    assert metrics.run_peak([5, None, 7], [3, 12, None]) == 12
    assert metrics.run_peak([None], []) is None
    stages = {"load": 50, "first_forward": 7, "steady_state": 8}
    assert metrics.training_peak(stages, [9, 3]) == 9  # loading excluded
    assert metrics.training_peak(stages, []) == 8


def _recompute_measured(model, seq=64):
    from ftprof.models.checkpointing import apply_policy

    model.train()
    apply_policy(model, "none")
    plain = _measured_flops_per_token(model, seq)
    apply_policy(model, "full")
    return _measured_flops_per_token(model, seq) - plain


def test_recompute_count_matches_flop_counter_for_full_finetuning():
    model = _tiny("eager")
    layers, dim = metrics.attention_dims(model.config)
    predicted = metrics.recompute_flops_per_token(metrics.recomputed_params(model), layers, dim, 64)
    assert _recompute_measured(model) == pytest.approx(predicted, rel=1e-6)


def test_recompute_count_matches_flop_counter_for_lora():
    """Under checkpointing PEFT turns on the embeddings' output gradient, so layer 0's q, k and v (and their LoRA
    A) compute input gradients they skip otherwise: FLOPs the 4N convention counts as model FLOPs already. The rest
    of the difference is the recomputation, exactly as counted."""
    from peft import LoraConfig, get_peft_model

    model = _tiny("eager")
    model.requires_grad_(False)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                  "gate_proj", "up_proj", "down_proj"]))
    layers, dim = metrics.attention_dims(model.config)
    predicted = metrics.recompute_flops_per_token(metrics.recomputed_params(model), layers, dim, 64)
    attn = model.base_model.model.model.layers[0].self_attn
    layer0_input_grads = sum(2 * p.numel() for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
                             for name, p in proj.named_parameters()
                             if name.endswith("base_layer.weight") or "lora_A" in name)
    assert _recompute_measured(model) == pytest.approx(predicted + layer0_input_grads, rel=1e-6)


def test_slow_steps_name_the_host_cause_that_took_the_extra_time():
    steps = [_step(1, seconds=3.0, warmup=True, compile_s=2.5), _step(2, seconds=1.0), _step(3, seconds=1.0),
             _step(4, seconds=1.6, gc_s=0.4), _step(5, seconds=1.0),
             _step(6, seconds=1.5, compile_s=0.1, data_s=0.05, alloc_retries=3), _step(7, seconds=1.4, gc_s=0.1),
             _step(8, seconds=1.1)]
    slow = {s["step"]: s for s in metrics.slow_steps(steps)}
    assert sorted(slow) == [1, 4, 6, 7]  # the steady median is 1.1 s: 1.32 s or more is slow
    assert (slow[1]["cause"], slow[1]["cause_s"], slow[1]["warmup"]) == ("torch.compile", 2.5, True)
    assert slow[4]["cause"] == "Python garbage collection" and slow[4]["extra_s"] == pytest.approx(0.5)
    assert slow[6]["cause"] == "allocator retries (3)" and slow[6]["cause_s"] is None  # 0.1 s of 0.4: not compile
    assert slow[7]["cause"] == metrics.UNEXPLAINED


def test_slow_steps_leave_out_unexplained_warmup_profiled_and_jitter():
    steps = [_step(1, seconds=3.0, warmup=True), *(_step(i, seconds=0.020) for i in (2, 3, 5)),
             _step(4, seconds=0.026), _step(6, "active", seconds=0.5)]
    assert metrics.slow_steps(steps) == []  # 6 ms over a 20 ms median is jitter; step 6 is the profiler's
    two = [_step(1, seconds=1.0), _step(2, seconds=5.0)]
    assert metrics.slow_steps(two) == []  # too few steady steps for a median


def test_host_time_sums_the_window_and_skips_rows_from_before_causes():
    steps = [_step(2, seconds=1.0, data_s=0.1, gc_s=0.2), _step(3, seconds=2.0, data_s=0.1, alloc_retries=1)]
    totals = metrics.host_time(steps)
    assert totals == pytest.approx({"data_s": 0.2, "gc_s": 0.2, "compile_s": 0.0, "alloc_retries": 1,
                                    "steps_s": 3.0})
    old = [{k: v for k, v in s.items() if k not in metrics.HOST_CAUSES} for s in steps]
    assert metrics.host_time(old) is None


def test_the_steady_window_says_when_profiled_steps_were_left_out_or_all_that_was_timed():
    def step(phase, warmup=False):
        return {"warmup": warmup, "profiler_phase": phase, "step_time_s": 1.0}

    def note(steps):
        return metrics.steady_window_note(*metrics.steady_window(steps))

    mixed = [step("", True), step("wait"), step("active"), step("active")]
    assert note(mixed) == "steady-state figures from 1 unprofiled steps (2 profiled steps left out)"
    only_profiled = [step("", True), step("warmup"), step("active")]  # a short profile: nothing unprofiled to time
    assert "from 2 profiled step(s)" in note(only_profiled)
    assert note([step("", True), step(""), step("")]) is None

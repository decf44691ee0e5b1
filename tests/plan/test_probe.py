"""The planner's probe and memory model against what real CPU runs measure: static parts to the byte, activations
per policy, a deeper model than the probe (a 4-layer checkpoint saved here), and the 4-bit layouts against
bitsandbytes' own tensors."""

import dataclasses

import pytest
import torch

import ftprof
from ftprof.models.source import resolve_model_source
from ftprof.plan.candidates import of_config
from ftprof.plan.predict import Target, planner
from ftprof.plan.probe import nf4_bytes
from ftprof.profiling.memory import static_breakdown
from tests.conftest import tiny_config
from tests.data_files import save_checkpoint

# Saved activations of a CPU run against the probe: the run measures its first micro-batch, the probe two short
# forwards; both see the same ops, so they agree but for rounding of per-token figures.
ACTIVATIONS = 0.02


def predicted(cfg, source=None):
    source = source or resolve_model_source(cfg.model.model)
    cfg = dataclasses.replace(cfg, method=cfg.method.resolved("float32", preset=source.kind == "preset"))
    return planner(cfg, source, "float32", Target("cpu")).predict(of_config(cfg))


def measured(result):
    b = result.memory.memory_breakdown
    return b.weights_frozen + b.weights_trainable, b.gradients, b.optimizer_state, b.activations_saved


@pytest.mark.parametrize("method, flat", [("full", {}), ("lora", {}), ("qlora", {}),
                                          ("lora", {"fp8_base": True}), ("qlora", {"fp8_base": True})])
def test_static_parts_match_a_real_run_to_the_byte(tmp_path, method, flat):
    cfg = tiny_config(tmp_path, method, max_steps=2, **flat)
    result = ftprof.train(cfg)
    weights, grads, state, _ = measured(result)
    pred = predicted(cfg)
    assert result.prediction.static_bytes == pred.static_bytes == weights + grads + state
    assert pred.gradient_bytes == grads


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
def test_activations_match_a_real_run_per_policy(tmp_path, policy):
    cfg = tiny_config(tmp_path, "lora", checkpointing=policy, max_steps=2, seq_len=64)
    result = ftprof.train(cfg)
    *_, saved = measured(result)
    assert result.prediction.activation_bytes == pytest.approx(saved, rel=ACTIVATIONS)
    assert result.prediction.activation_factor == 1.0  # a CPU run: the probe is the measurement


@pytest.mark.slow  # two runs of a checkpoint saved here: 6 s on the 2-core machine
def test_a_model_deeper_than_the_probe_is_predicted_from_two_layers(tmp_path):
    """A 4-layer checkpoint (saved here) trained for real: the probe builds 2 layers and scales."""
    deep = save_checkpoint(tmp_path / "deep", layers=4)
    for policy in ("none", "full"):
        cfg = tiny_config(tmp_path / policy, "lora", model=deep, checkpointing=policy, max_steps=2)
        result = ftprof.train(cfg)
        weights, grads, state, saved = measured(result)
        assert result.status == "ok" and result.prediction.static_bytes == weights + grads + state
        assert result.prediction.activation_bytes == pytest.approx(saved, rel=ACTIVATIONS)


@pytest.mark.parametrize("shape", [(64, 64), (64, 176), (176, 64), (96, 640)])
@pytest.mark.parametrize("double_quant", [True, False])
def test_nf4_layout_is_what_bitsandbytes_stores(shape, double_quant):
    import bitsandbytes as bnb

    fin, fout = shape
    # as QLoRA builds it (models/methods.py): on meta, then quantized by its first move to a real device
    linear = bnb.nn.Linear4bit(fin, fout, bias=False, compress_statistics=double_quant, quant_type="nf4",
                               device="meta")
    linear.weight = bnb.nn.Params4bit(torch.randn(fout, fin), requires_grad=False, compress_statistics=double_quant,
                                      quant_type="nf4", module=linear)
    linear = linear.to("cpu")
    assert linear.weight.quant_state is not None
    stored = static_breakdown(linear, torch.optim.SGD([torch.zeros(1)]))["weights_frozen"]
    assert nf4_bytes(fin, fout, double_quant) == stored


@pytest.mark.slow  # two processes importing torch and probing: 13 s on the 2-core machine
def test_processes_probing_at_once_measure_once(tmp_path):
    """Two processes planning the same model at the same time (the ranks of one run): one measures, the other
    waits and reads its result."""
    import os
    import subprocess
    import sys

    code = ("import dataclasses, json, sys; from ftprof.config import RunConfig; "
            "from ftprof.models.source import resolve_model_source; from ftprof.plan.probe import probe; "
            "cfg = RunConfig.from_flat({'method': 'lora', 'model': 'tiny', 'device': 'cpu'}); "
            "r = probe(cfg, resolve_model_source('tiny'), 'float32'); print(json.dumps(r.seconds))")
    env = {**os.environ, "FTPROF_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    seconds = sorted(float(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert seconds[0] == 0.0 < seconds[1]  # one read the other's measurement from the cache
    assert len(list((tmp_path / "plan").glob("probe-*.json"))) == 1


@pytest.mark.slow  # a checkpoint saved and trained per family: 6 s each on the 2-core machine
@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_families_are_probed_as_exactly(tmp_path, family):
    """A 3-layer Qwen2 (biased q/k/v projections) and Mistral checkpoint saved here: static parts to the byte,
    activations as measured, from the two-layer probe."""
    import transformers

    from ftprof.models.tokenizer import build_tokenizer

    names = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM")}
    config_cls, model_cls = (getattr(transformers, n) for n in names[family])
    tokenizer = build_tokenizer()
    config = config_cls(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model_cls(config).save_pretrained(tmp_path / family)
    tokenizer.save_pretrained(tmp_path / family)
    result = ftprof.train(tiny_config(tmp_path / "runs", "lora", model=str(tmp_path / family), seq_len=64,
                                      max_steps=2))
    weights, grads, state, saved = measured(result)
    assert result.status == "ok" and result.prediction.static_bytes == weights + grads + state
    assert result.prediction.activation_bytes == pytest.approx(saved, rel=ACTIVATIONS)


def test_the_probe_measures_the_same_sizes_without_drawing_random_weights():
    """The probe leaves a preset's weights undrawn (half its time on llama-8b): what a forward saves does not
    depend on the values."""
    import torch

    from ftprof.models.materialize import build_random_model
    from ftprof.models.presets import preset_config
    from ftprof.profiling.memory import SavedActivations

    saved = []
    for init in (True, False):
        model = build_random_model(preset_config("tiny"), torch.device("cpu"), torch.bfloat16, init=init)
        ids = torch.randint(0, model.config.vocab_size, (1, 64))
        with SavedActivations(model) as meter:
            model(input_ids=ids, labels=ids)
        saved.append(meter.bytes)
    assert saved[0] == saved[1] > 0

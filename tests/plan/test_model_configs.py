"""`ftprof plan --model DIR` checks the directory's config.json before anything heavy (issue 41): sizes missing (named),
zero or absurd sizes (with the numbers), an encoder (said as such), a decoder whose module names are not the default
LoRA targets (told to pass --lora-targets). One line, exit 2, torch never imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli.test_bad_input import RUNNER

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256}

# (case, config.json, words the line must hold)
CASES = [
    ("model_type alone", {"model_type": "llama"},
     ["lacks hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size", "llama's defaults"]),
    ("one size missing", {k: v for k, v in LLAMA.items() if k != "vocab_size"}, ["lacks vocab_size"]),
    ("no model_type", {k: v for k, v in LLAMA.items() if k != "model_type"}, ["has no model_type"]),
    ("zero layers", {**LLAMA, "num_hidden_layers": 0}, ["num_hidden_layers is 0", "at least 1"]),
    ("negative hidden", {**LLAMA, "hidden_size": -64}, ["hidden_size is -64"]),
    ("hidden a string", {**LLAMA, "hidden_size": "64"}, ["hidden_size is '64'"]),
    ("heads do not divide", {**LLAMA, "num_attention_heads": 5}, ["not a multiple of num_attention_heads 5"]),
    ("hidden 10^7", {**LLAMA, "hidden_size": 10**7, "num_attention_heads": 32, "num_hidden_layers": 32},
     ["hidden_size 10,000,000", "TiB of bf16 weights", "check the sizes"]),
    ("bert", {**LLAMA, "model_type": "bert", "architectures": ["BertForMaskedLM"]},
     ["a bert model (BertForMaskedLM) is not a decoder-only causal LM"]),
    ("t5", {**LLAMA, "model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
            "is_encoder_decoder": True}, ["not a decoder-only causal LM"]),
    ("gpt2", {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
              "vocab_size": 256}, ["gpt2 names its layers c_attn", "pass --lora-targets"]),
    ("not an object", [1, 2], ["holds a JSON list"]),
    ("not JSON", "{oops", ["is not JSON"]),
]


def _write(tmp_path, name, config):
    d = tmp_path / name.replace(" ", "_")
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


def test_odd_configs_are_refused_in_one_line_before_torch(tmp_path):
    argvs = [["plan", "lora", "--model", str(_write(tmp_path, case, config)), "--device", "cpu",
              "--plan-dir", str(tmp_path / "plan")] for case, config, _ in CASES]
    out = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argvs)], capture_output=True, text=True,
                         timeout=120)
    results = json.loads(out.stdout)
    problems = []
    for (case, _, words), res in zip(CASES, results, strict=True):
        err = res["stderr"].strip()
        if res["code"] != 2 or len(err.splitlines()) != 1 or not all(w in err for w in words) or "lora-targets" in \
                err and case != "gpt2":
            problems.append(f"{case}: exit {res['code']}, stderr {err!r}")
    assert not problems, "\n".join(problems)
    assert not results[-1]["torch"]  # every refusal came before torch (the runner's process imported none)


def test_gpt2_with_its_own_targets_passes_the_check(tmp_path):
    from ftprof.checks import check_config
    from ftprof.config import RunConfig

    d = _write(tmp_path, "gpt2", CASES[10][1])
    cfg = RunConfig.from_flat({"model": str(d), "method": "lora", "lora_targets": "c_attn", "device": "cpu"})
    check_config(cfg)  # no refusal: the user named its modules


@pytest.mark.parametrize("config", [LLAMA, {**LLAMA, "model_type": "mistral"},
                                    {**LLAMA, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}])
def test_a_sound_decoder_config_passes(tmp_path, config):
    from ftprof.models.source import local_config_problem

    assert local_config_problem(str(tmp_path), config) is None

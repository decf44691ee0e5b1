import pytest

from ftprof.config import DEFAULT_LORA_TARGETS, MethodConfig, RunConfig, TrainConfig, flat_field_owners
from ftprof.errors import ConfigError


def test_defaults_are_valid_and_round_trip():
    cfg = RunConfig()
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert RunConfig.from_flat(cfg.to_flat()) == cfg


def test_option_names_are_unique_across_sections():
    from dataclasses import fields

    from ftprof.config import SECTIONS

    owners = flat_field_owners()
    names = [f.name for cls in SECTIONS.values() for f in fields(cls)]
    assert len(names) == len(set(names)) == len(owners)  # a name in two sections would collapse in the mapping
    assert owners["lora_r"] == "method" and owners["seq_len"] == "data" and owners["lr"] == "train"


@pytest.mark.parametrize("flat, fragment", [
    ({"method": "dora"}, "method: 'dora' is not one of"),
    ({"batch_size": 0}, "--batch-size must be at least 1"),
    ({"seq_len": 1}, "--seq-len must be at least 2"),
    ({"grad_accum": 0}, "--grad-accum"),
    ({"max_steps": 0}, "--max-steps"),
    ({"lr": -1.0}, "--lr must be positive"),
    ({"dtype": "fp8"}, "--dtype"),
    ({"optimizer": "sgd"}, "--optimizer"),
    ({"device": "tpu"}, "--device"),
    ({"method": "lora", "gptq_bits": 4}, "--gptq-bits is a GPTQ option and does not apply to method 'lora'"),
    ({"method": "qlora", "gptq_group_size": 64}, "--gptq-group-size is a GPTQ option"),
    ({"method": "full", "lora_r": 8}, "--lora-r is a lora option and does not apply to method 'full'"),
    ({"method": "lora", "quant_type": "nf4"}, "--quant-type is a bitsandbytes option"),
    ({"method": "lora", "lora_dropout": 1.5}, "--lora-dropout"),
    ({"method": "gptq-lora", "gptq_group_size": 3}, "--gptq-group-size must be -1 or >= 16"),
    ({"memory_logging": "everything"}, "--memory-logging"),
    ({"run_name": "a/b"}, "--run-name"),
    ({"lora_rr": 8}, "unknown option 'lora_rr' (did you mean 'lora_r'?)"),
])
def test_bad_values_are_one_line_errors(flat, fragment):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_flat(flat)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_method_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean 'qlora'"):
        MethodConfig(method="qlorra")


def test_method_defaults_resolve_per_method():
    lora = MethodConfig(method="lora").resolved("bfloat16")
    assert (lora.lora_r, lora.lora_alpha, lora.lora_dropout) == (16, 32.0, 0.0)
    assert lora.lora_targets == DEFAULT_LORA_TARGETS and lora.quant_type is None and lora.gptq_bits is None
    q = MethodConfig(method="qlora", lora_r=8).resolved("bfloat16")
    assert (q.quant_type, q.double_quant, q.compute_dtype, q.quant_storage) == ("nf4", True, "bfloat16", "bfloat16")
    assert q.lora_alpha == 16.0
    g = MethodConfig(method="gptq-lora", gptq_bits=8).resolved("float32")
    assert (g.gptq_bits, g.gptq_group_size, g.gptq_backend) == (8, 128, "gptq_torch")
    # Random-weight presets round to nearest (calibration would buy nothing); real checkpoints get GPTQ proper.
    assert g.gptq_quantizer == "gptq"
    assert MethodConfig(method="gptq-lora").resolved("float32", preset=True).gptq_quantizer == "rtn"
    assert MethodConfig(method="gptq-lora", gptq_quantizer="gptq").resolved("float32", preset=True).gptq_quantizer \
        == "gptq"
    full = MethodConfig(method="full").resolved("bfloat16")
    assert full.lora_r is None and full.quant_type is None


def test_lora_targets_parse_from_comma_list():
    m = MethodConfig(method="lora", lora_targets="q_proj, v_proj")
    assert m.lora_targets == ("q_proj", "v_proj")


def test_memory_logging_aliases():
    assert RunConfig.from_flat({"memory_logging": "nvidia"}).output.memory_logging == "nvml"
    assert RunConfig.from_flat({"memory_logging": "huggingface"}).output.memory_logging == "torch"


def test_replace_revalidates():
    cfg = RunConfig.from_flat({"method": "lora"})
    assert cfg.replace(lora_r=4).method.lora_r == 4
    with pytest.raises(ConfigError):
        cfg.replace(batch_size=0)


def test_newer_schema_is_rejected():
    data = RunConfig().to_dict()
    data["schema_version"] = 999
    with pytest.raises(ConfigError, match="newer"):
        RunConfig.from_dict(data)


@pytest.mark.parametrize("build, words", [
    (lambda: TrainConfig(max_steps="3"), "option 'max_steps' must be int, got str"),
    (lambda: MethodConfig(method="lora", lora_r="8"), "option 'lora_r' must be int"),
    (lambda: RunConfig(model="tiny"), "RunConfig's model is a ModelConfig, got str"),
    (lambda: RunConfig.from_flat(None), "takes a dict of option names"),
    (lambda: RunConfig.from_dict("x"), "a run configuration is a JSON object"),
    (lambda: RunConfig.from_dict({"train": [1, 2]}), "config section 'train' is an object of options"),
    (lambda: RunConfig.from_flat({"learning_rate": 1e-3}), "did you mean 'lr'"),
    (lambda: RunConfig.from_flat({"method": "lora", "lora_targets": [1, 2]}), "module names (strings)"),
    (lambda: TrainConfig(max_steps=10**30), "--max-steps must be from 1 to"),
])
def test_configs_built_in_python_with_wrong_values_raise_one_config_error(build, words):
    # not a TypeError or AttributeError from deep inside a section's checks
    with pytest.raises(ConfigError) as info:
        build()
    assert words in str(info.value)


def test_the_python_api_names_what_it_was_given():
    import ftprof

    for given in (None, "x", 5):
        with pytest.raises(ConfigError, match="take a RunConfig"):
            ftprof.train(given)
    with pytest.raises(ConfigError, match="take a RunConfig"):
        ftprof.profile("x")


def test_python_callers_values_of_the_right_kind_are_taken():
    # a pathlib.Path for a directory, numpy's numbers for counts and rates (a sweep built with numpy)
    from pathlib import Path

    import numpy as np

    cfg = RunConfig.from_flat({"output_dir": Path("out"), "max_steps": np.int64(4), "lr": np.float32(0.5)})
    assert cfg.output.output_dir == "out" and cfg.train.max_steps == 4 and type(cfg.train.max_steps) is int
    assert cfg.train.lr == 0.5 and type(cfg.train.lr) is float
    assert TrainConfig(max_steps=np.int32(3)).max_steps == 3

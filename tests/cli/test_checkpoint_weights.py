"""A checkpoint directory whose weights a run could not load is refused before torch (one line naming what is
missing, exit 2): no weight file, a damaged model.safetensors, an index naming shards that are not there. ftprof
plan without --verify or --train still plans from config.json alone (its probe builds the layers from it)."""

from __future__ import annotations

import json

from tests.cli.test_paths_round4 import _run

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256}


def _checkpoint(path, files: dict[str, bytes]):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(LLAMA))
    for name, data in files.items():
        (path / name).write_bytes(data)
    return str(path)


def test_checkpoints_without_loadable_weights_are_refused_before_torch(tmp_path):
    bare = _checkpoint(tmp_path / "bare", {})
    garbage = _checkpoint(tmp_path / "garbage", {"model.safetensors": b"garbage!!"})
    index = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                       "b": "model-00002-of-00002.safetensors"}}).encode()
    sharded = _checkpoint(tmp_path / "sharded", {"model.safetensors.index.json": index,
                                                 "model-00001-of-00002.safetensors": b"x"})
    train = ["train", "lora", "--max-steps", "1", "--device", "cpu", "--model"]
    _run([
        ([*train, bare], ["--model", "has a config.json but no weights"]),
        ([*train, garbage], ["model.safetensors is not a safetensors file"]),
        ([*train, sharded], ["names 1 missing shard(s)", "model-00002-of-00002.safetensors"]),
        (["plan", "lora", "--model", bare, "--verify", "1"], ["has a config.json but no weights"]),
    ], tmp_path)


def test_a_plan_without_runs_needs_config_json_alone(tmp_path):
    from ftprof.checks import check_before_load
    from ftprof.config import RunConfig

    bare = _checkpoint(tmp_path / "bare", {})
    check_before_load(RunConfig.from_flat({"model": bare, "method": "lora"}), weights=False)  # no error

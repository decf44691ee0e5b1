"""Small datasets on disk in every format ftprof reads, and a real checkpoint (save_pretrained) for tests."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = "the model trains on tokens and the loss goes down as the optimizer updates weights each step".split()


def sentence(i: int, n: int = 8) -> str:
    return " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(n)) + f" {i}."


def text_rows(n: int = 24) -> list[dict]:
    return [{"text": sentence(i, 6 + i % 7)} for i in range(n)]


def instruction_rows(n: int = 24) -> list[dict]:
    return [{"instruction": f"repeat {sentence(i, 3)}", "input": "" if i % 2 else "slowly",
             "output": sentence(i + 1, 5)} for i in range(n)]


def chat_rows(n: int = 24) -> list[dict]:
    return [{"messages": [{"role": "system", "content": "you are a model"},
                          {"role": "user", "content": sentence(i, 4)},
                          {"role": "assistant", "content": sentence(i + 1, 5)},
                          {"role": "user", "content": "again"},
                          {"role": "assistant", "content": sentence(i + 2, 3)}]} for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def write(path: Path, rows: list[dict]) -> str:
    """Rows in the format named by the path: .jsonl, .json (an array), .csv, .parquet, .txt (text only, one
    paragraph per row), or a folder (datasets' save_to_disk)."""
    suffix = path.suffix
    if suffix == ".jsonl":
        return write_jsonl(path, rows)
    if suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".txt":
        path.write_text("\n\n".join(r["text"] for r in rows) + "\n")
    else:
        import datasets

        ds = datasets.Dataset.from_list(rows)
        if suffix == ".csv":
            ds.to_csv(str(path), index=False)
        elif suffix == ".parquet":
            ds.to_parquet(str(path))
        else:
            ds.save_to_disk(str(path))
    return str(path)


def save_checkpoint(path: Path, chat_template: bool = True, layers: int | None = None, tied: bool = False,
                    vocab: int | None = None) -> str:
    """A small Llama (the tiny preset's shape, random weights; ``layers`` decoder layers instead of its 2; ``tied``:
    the output layer shares the input embedding table; ``vocab`` rows in that table instead of 512, the tokenizer's
    ids staying below 512) saved with save_pretrained, with ftprof's built-in tokenizer (with or without its chat
    template) beside it."""
    import copy

    import torch
    from transformers import LlamaForCausalLM

    from ftprof.models.presets import preset_config
    from ftprof.models.tokenizer import build_tokenizer

    torch.manual_seed(0)
    config = preset_config("tiny")
    config.name_or_path = str(path)
    config.num_hidden_layers = layers or config.num_hidden_layers
    config.tie_word_embeddings = tied
    config.vocab_size = vocab or config.vocab_size
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer = copy.deepcopy(build_tokenizer())
    if not chat_template:
        tokenizer.chat_template = None
    tokenizer.save_pretrained(path)
    return str(path)

"""Which columns make a training row, the checks on them, and one row -> token ids and labels.

Three formats:
- text:        one column of text; every token carries a label.
- instruction: a prompt built from a template with {column} placeholders, then the response column.
- chat:        a column of {role, content} turns rendered with the tokenizer's chat template.
With ``--train-on completion`` (default) only the response (the assistant turns) carries labels; with
``--train-on prompt`` the prompt does too, so every token is trained on, as for text.

Every sequence ends with the end of its document (the tokenizer's eos for text and instruction; the chat template's
own end-of-turn marks for chat), so packed documents stay separable.
"""

from __future__ import annotations

from ftprof.config import DataConfig, template_fields
from ftprof.errors import ConfigError, did_you_mean

IGNORE_INDEX = -100  # label of a position that takes no loss (padding, and the prompt under --train-on completion)

# The Alpaca templates (Taori et al. 2023): the with-input variant is used for rows whose 'input' is non-empty.
ALPACA_PROMPT = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
                 "request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
ALPACA_PROMPT_WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                            "further context. Write a response that appropriately completes the request.\n\n"
                            "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")


def _missing_column(option: str, name: str, columns: list[str], dataset: str) -> ConfigError:
    return ConfigError(f"{option}: dataset '{dataset}' has no column '{name}' (columns: {', '.join(columns)})"
                       f"{did_you_mean(name, columns)}")


def _no_format_columns(data: DataConfig, columns: list[str]) -> ConfigError:
    wanted = {data.messages_field: "chat", data.response_field: "instruction", data.text_field: "text"}
    hint = next((h for h in (did_you_mean(name, columns) for name in wanted) if h), "")
    looked = ", ".join(f"'{name}' ({fmt})" for name, fmt in wanted.items())
    return ConfigError(f"{data.option('dataset')}: '{data.dataset}' has none of the columns --data-format auto looks "
                       f"for: {looked} "
                       f"(columns: {', '.join(columns)}){hint}; see --messages-field, --response-field, --text-field")


def resolve_format(data: DataConfig, columns: list[str]) -> str:
    """text | instruction | chat, from --data-format (auto: by the columns present); its columns must exist."""
    fmt = data.data_format
    if fmt == "auto":
        if data.messages_field in columns:
            fmt = "chat"
        elif data.response_field in columns:
            fmt = "instruction"
        elif data.text_field in columns:
            fmt = "text"
        else:
            raise _no_format_columns(data, columns)
    if fmt == "chat" and data.messages_field not in columns:
        raise _missing_column("--messages-field", data.messages_field, columns, data.dataset)
    if fmt == "text" and data.text_field not in columns:
        raise _missing_column("--text-field", data.text_field, columns, data.dataset)
    if fmt == "instruction":
        if data.response_field not in columns:
            raise _missing_column("--response-field", data.response_field, columns, data.dataset)
        needed = template_fields(data.prompt_template) if data.prompt_template else ["instruction"]
        for name in needed:
            if name not in columns:
                raise _missing_column("--prompt-template", name, columns, data.dataset)
    return fmt


def check_chat(data: DataConfig, rows, tokenizer, model: str) -> None:
    """Chat data needs a tokenizer with a chat template and an assistant turn in every row (something to learn)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{data.option('dataset')}: chat data needs a chat template, and the tokenizer of model "
                          f"'{model}' has "
                          "none (use --data-format instruction or text, or a model whose tokenizer has one)")
    check_chat_turns(data, rows)


def check_chat_turns(data: DataConfig, rows) -> None:
    """Every chat row is a list of {role, content} turns with an assistant turn (no tokenizer needed)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    column = rows.data.column(data.messages_field).combine_chunks()
    if not pa.types.is_list(column.type) or not pa.types.is_struct(column.type.value_type) \
            or column.type.value_type.get_field_index("role") < 0:
        raise ConfigError(f"--messages-field: column '{data.messages_field}' of '{data.dataset}' is not a list of "
                          f"{{role, content}} turns (it holds {column.type})")
    turns = column.flatten()
    is_assistant = pc.fill_null(pc.equal(turns.field("role"), "assistant"), False).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(column).to_numpy()
    has_assistant = np.zeros(len(column), dtype=bool)
    has_assistant[parents[is_assistant]] = True
    missing = np.flatnonzero(~has_assistant)
    if len(missing):
        raise ConfigError(f"{data.option('dataset')}: chat row {missing[0]} of '{data.dataset}' has no assistant turn "
                          f"({len(missing)} of {len(column)} rows have none; each row needs one to learn from)")


class RowTokenizer:
    """``datasets.map`` function (batched): rows -> input_ids, labels, and n_labels (rows with 0 are dropped).

    A plain class, so ``datasets`` can hash it (tokenizer and options included) and reuse the cached result."""

    def __init__(self, data: DataConfig, fmt: str, tokenizer):
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.text_field, self.response_field, self.messages_field = (data.text_field, data.response_field,
                                                                     data.messages_field)
        self.template = data.prompt_template
        self.prompt_labels = data.train_on == "prompt"
        # Packing keeps whole documents (the stream is cut later); otherwise a sequence is cut to --seq-len here.
        self.limit = None if data.packing else data.seq_len

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        n = len(next(iter(batch.values())))
        rows = ({k: v[i] for k, v in batch.items()} for i in range(n))
        encode = {"text": self._text, "instruction": self._instruction, "chat": self._chat}[self.fmt]
        out: dict[str, list] = {"input_ids": [], "labels": [], "n_labels": []}
        for row in rows:
            ids, labels = encode(row)
            ids, labels = ids[:self.limit], labels[:self.limit]
            out["input_ids"].append(ids)
            out["labels"].append(labels)
            # labels that take a loss once shifted (the first position predicts nothing)
            out["n_labels"].append(sum(1 for x in labels[1:] if x != IGNORE_INDEX))
        return out

    def _eos(self) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return [eos] if eos is not None else []

    def _text(self, row: dict) -> tuple[list[int], list[int]]:
        text = row[self.text_field]
        if not isinstance(text, str) or not text.strip():
            return [], []
        ids = self.tokenizer(text)["input_ids"] + self._eos()
        return ids, list(ids)

    def _prompt(self, row: dict) -> str:
        if self.template is not None:
            return self.template.format_map({k: "" if v is None else v for k, v in row.items()})
        has_input = isinstance(row.get("input"), str) and row["input"].strip()
        return (ALPACA_PROMPT_WITH_INPUT if has_input else ALPACA_PROMPT).format_map(row)

    def _instruction(self, row: dict) -> tuple[list[int], list[int]]:
        response = row[self.response_field]
        if not isinstance(response, str) or not response.strip():
            return [], []
        prompt = self.tokenizer(self._prompt(row))["input_ids"]
        answer = self.tokenizer(response, add_special_tokens=False)["input_ids"] + self._eos()
        prompt_labels = list(prompt) if self.prompt_labels else [IGNORE_INDEX] * len(prompt)
        return prompt + answer, prompt_labels + answer

    def _chat(self, row: dict) -> tuple[list[int], list[int]]:
        messages = row[self.messages_field] or []
        text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = enc["input_ids"]
        if self.prompt_labels:
            return ids, list(ids)
        spans = assistant_spans(self.tokenizer, messages, text)
        labels = [tok if any(a <= start < b for a, b in spans) else IGNORE_INDEX
                  for tok, (start, _) in zip(ids, enc["offset_mapping"], strict=True)]
        return ids, labels


def assistant_spans(tokenizer, messages: list[dict], text: str) -> list[tuple[int, int]]:
    """Character ranges of the assistant turns in the rendered conversation ``text``.

    Rendering the conversation up to a turn (with the generation prompt) and through it gives where the turn starts
    and ends; this holds for every template whose rendering of a prefix is a prefix of the whole."""
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True) if i else ""
        through = tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)
        if not (text.startswith(through) and through.startswith(before)):
            raise ConfigError("--train-on completion: the tokenizer's chat template does not render a conversation's "
                              "beginning as a prefix of the whole, so the assistant turns cannot be located "
                              "(use --train-on prompt)")
        spans.append((len(before), len(through)))
    return spans

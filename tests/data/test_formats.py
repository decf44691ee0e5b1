import copy

import pytest

from ftprof.config import DataConfig
from ftprof.data.formats import IGNORE_INDEX, RowTokenizer, assistant_spans, check_chat, resolve_format
from ftprof.errors import ConfigError
from ftprof.models.tokenizer import build_tokenizer
from tests.data_files import chat_rows


def _labelled_text(tok, ids, labels) -> str:
    return tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE_INDEX])


def test_auto_format_follows_the_columns():
    data = DataConfig(dataset="x.jsonl")
    assert resolve_format(data, ["messages", "text"]) == "chat"
    assert resolve_format(data, ["instruction", "input", "output"]) == "instruction"
    assert resolve_format(data, ["text", "id"]) == "text"


@pytest.mark.parametrize("options, columns, fragment", [
    ({"data_format": "text"}, ["txt", "id"], r"--text-field: dataset 'x.jsonl' has no column 'text' "
                                              r"\(columns: txt, id\) \(did you mean 'txt'\?\)"),
    ({}, ["txt", "id"], r"none of the columns --data-format auto looks for: 'messages' \(chat\), 'output' "
                        r"\(instruction\), 'text' \(text\) \(columns: txt, id\) \(did you mean 'txt'\?\)"),
    ({"messages_field": "message"}, ["messages"], "auto looks for: 'message' .*did you mean 'messages'"),
    ({"data_format": "chat"}, ["message"], "no column 'messages' .*did you mean 'message'"),
    ({"response_field": "answer"}, ["question", "answers"], "auto looks for.*did you mean 'answers'"),
    ({"data_format": "instruction", "response_field": "answer"}, ["question", "answers"],
     "--response-field: .*no column 'answer' .*did you mean 'answers'"),
    ({"prompt_template": "Q: {questoin}\nA: "}, ["question", "output"],
     "--prompt-template: .*no column 'questoin' .*did you mean 'question'"),
])
def test_missing_columns_name_the_real_ones(options, columns, fragment):
    with pytest.raises(ConfigError, match=fragment):
        resolve_format(DataConfig(dataset="x.jsonl", **options), columns)


def test_chat_labels_only_the_assistant_turns():
    tok = build_tokenizer()
    rows = chat_rows(2)
    encode = RowTokenizer(DataConfig(dataset="x", seq_len=512), "chat", tok)
    out = encode({"messages": [r["messages"] for r in rows]})
    for row, ids, labels in zip(rows, out["input_ids"], out["labels"], strict=True):
        turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert _labelled_text(tok, ids, labels) == "".join(f"{t}<|eos|>\n" for t in turns)
        assert tok.decode(ids) == tok.apply_chat_template(row["messages"], tokenize=False)
    whole = RowTokenizer(DataConfig(dataset="x", seq_len=512, train_on="prompt"), "chat", tok)
    out = whole({"messages": [rows[0]["messages"]]})
    assert out["labels"][0] == out["input_ids"][0]


def test_instruction_template_and_completion_labels():
    tok = build_tokenizer()
    batch = {"instruction": ["say a", "say b"], "input": ["", "slowly"], "output": ["the model", "the loss"]}
    out = RowTokenizer(DataConfig(dataset="x", seq_len=512), "instruction", tok)(batch)
    assert _labelled_text(tok, out["input_ids"][0], out["labels"][0]) == "the model<|eos|>"
    assert "### Input:\nslowly" in tok.decode(out["input_ids"][1])
    assert "### Input:" not in tok.decode(out["input_ids"][0])
    custom = DataConfig(dataset="x", seq_len=512, prompt_template="Q: {instruction} ({input})\nA: ", train_on="prompt")
    out = RowTokenizer(custom, "instruction", tok)(batch)
    assert tok.decode(out["input_ids"][1]) == "Q: say b (slowly)\nA: the loss<|eos|>"
    assert out["labels"][1] == out["input_ids"][1]


def test_rows_cut_to_seq_len_count_what_is_left():
    tok = build_tokenizer()
    out = RowTokenizer(DataConfig(dataset="x", seq_len=4), "instruction", tok)(
        {"instruction": ["a long instruction that fills the sequence"], "output": ["the model"]})
    assert len(out["input_ids"][0]) == 4 and out["n_labels"] == [0]  # the response was cut away: dropped later


def test_chat_needs_a_template_and_an_assistant_turn():
    import datasets

    data = DataConfig(dataset="chat.jsonl")
    rows = chat_rows(3)
    rows[2]["messages"] = [m for m in rows[2]["messages"] if m["role"] != "assistant"]
    ds = datasets.Dataset.from_list(rows)
    with pytest.raises(ConfigError, match="chat row 2 of 'chat.jsonl' has no assistant turn .*1 of 3 rows"):
        check_chat(data, ds, build_tokenizer(), "tiny")
    bare = copy.deepcopy(build_tokenizer())
    bare.chat_template = None
    with pytest.raises(ConfigError, match="the tokenizer of model 'my-model' has none"):
        check_chat(data, datasets.Dataset.from_list(chat_rows(2)), bare, "my-model")
    with pytest.raises(ConfigError, match="--messages-field: column 'text' .* is not a list of"):
        check_chat(DataConfig(dataset="x", messages_field="text"), datasets.Dataset.from_list([{"text": "a"}]),
                   build_tokenizer(), "tiny")


def test_a_template_that_rewrites_history_is_refused():
    tok = copy.deepcopy(build_tokenizer())
    # renders only the last turn: a prefix of the conversation is not a prefix of its rendering
    tok.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    messages = chat_rows(1)[0]["messages"]
    with pytest.raises(ConfigError, match="--train-on prompt"):
        assistant_spans(tok, messages, tok.apply_chat_template(messages, tokenize=False))

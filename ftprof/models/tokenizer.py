"""A byte-level BPE tokenizer built locally with `tokenizers`, for the built-in presets (no hub access), with a
chat template; and the loader that picks a run's tokenizer.

It is trained in well under a second on a small built-in corpus, deterministically, so every run and every
machine gets the same ids. Ids 0, 1, 2 are pad, bos, eos, matching the presets' configs.
"""

from __future__ import annotations

import functools

VOCAB_SIZE = 512
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")

_WORDS = ("the model trains on tokens and the loss goes down as the optimizer updates weights each step while memory "
          "holds activations gradients and states of adam for every parameter in the network layer attention "
          "projection query key value output gate up down norm embedding head batch sequence length rank alpha "
          "quantized four bit weights scales groups kernels throughput latency profile trace benchmark sweep "
          "report table plot run result device host process thread time second minute hour fast slow large small")


def _corpus() -> list[str]:
    words = _WORDS.split()
    lines = []
    for i in range(400):  # deterministic pseudo-sentences: enough merges for a 512-entry vocab
        n = 6 + i % 9
        lines.append(" ".join(words[(i * 7 + j * 13) % len(words)] for j in range(n)) + f" {i}.")
    return lines


# A ChatML-style template over the built-in special tokens, so chat data trains on the presets too.
CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")


@functools.lru_cache(maxsize=1)
def build_tokenizer():
    """Return a transformers PreTrainedTokenizerFast trained on the built-in corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL_TOKENS[0], bos_token=SPECIAL_TOKENS[1],
                                   eos_token=SPECIAL_TOKENS[2], model_max_length=1 << 20,
                                   chat_template=CHAT_TEMPLATE)


def load_tokenizer(source, synthetic: bool, log=print):
    """The run's tokenizer: the built-in one for presets, else the checkpoint's (pad = eos when it has no pad).
    A checkpoint without a tokenizer still trains on synthetic data, with the built-in tokenizer."""
    if source.kind == "preset":
        return build_tokenizer()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source.name)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        if not synthetic:
            from ftprof.errors import ConfigError

            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"--dataset: real data needs the tokenizer of '{source.name}', which does not load: "
                              f"{first}") from None
        log("no tokenizer beside the model; using ftprof's built-in tokenizer for synthetic data")
        return build_tokenizer()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok

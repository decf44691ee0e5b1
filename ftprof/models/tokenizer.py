"""A byte-level BPE tokenizer built locally with `tokenizers`, for the built-in presets (no hub access).

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
                                   eos_token=SPECIAL_TOKENS[2], model_max_length=1 << 20)

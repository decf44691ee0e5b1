"""Who the two sides of an A/B are: the run's name, method and shape (batch x seq, and gradient accumulation), from
the ftprof block each trace carries (layout.encode_metadata) and, where the trace sits in a run directory, from
that run's config.json. Their tokens per step decide whether the A/B compares per step or per token."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Side:
    name: str
    method: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    grad_accum: int | None = None
    model: str | None = None

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens one rank processes per optimizer step (None when the shape is unknown)."""
        if self.batch_size is None or self.seq_len is None:
            return None
        return self.batch_size * self.seq_len * (self.grad_accum or 1)

    @property
    def shape(self) -> str | None:
        if self.batch_size is None or self.seq_len is None:
            return None
        accum = f" x{self.grad_accum} accum" if self.grad_accum and self.grad_accum > 1 else ""
        return f"{self.batch_size}x{self.seq_len}{accum}"

    def describe(self) -> str:
        """'lora-r16 (lora on llama-1b, 2x128)': the name, then what is known of method, model and shape."""
        method = f"{self.method} on {self.model}" if self.method and self.model else self.method or self.model
        facts = [x for x in (method, self.shape) if x]
        return self.name + (f" ({', '.join(facts)})" if facts else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_step": self.tokens_per_step}


def _int(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def side_of(summary: dict, name: str, run_config: dict | None = None) -> Side:
    """A side from one summary dict (TraceSummary.to_dict()) and its run's config.json, when at hand (the config
    wins: it also knows the gradient accumulation, which the trace's block does not)."""
    from ftprof.profiling.layout import decode_metadata

    block = decode_metadata((summary.get("metadata") or {}).get("ftprof"))
    config = run_config or {}
    section = lambda key: config.get(key) if isinstance(config.get(key), dict) else {}  # noqa: E731
    data, method, train, output = section("data"), section("method"), section("train"), section("output")
    return Side(name=output.get("run_name") or name, model=section("model").get("model") or block.get("model"),
                method=method.get("method") or block.get("method"),
                batch_size=_int(data.get("batch_size", block.get("batch_size"))),
                seq_len=_int(data.get("seq_len", block.get("seq_len"))),
                grad_accum=_int(train.get("grad_accum", block.get("grad_accum"))))

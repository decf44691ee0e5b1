"""Show a SummaryDiff: a rich table in the terminal, Markdown on disk. The heading names both sides (run name,
method, shape) and the unit: per step, or per token when the shapes differ."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from ftprof.analysis.diff import BucketDiff, SummaryDiff
from ftprof.analysis.diff_sides import Side

CHANGE_TEXT = {"appeared": "new in B", "vanished": "gone in B"}


def _ci(x: float | None) -> str:
    return f"±{x:,.2f}" if x is not None else "-"


def _interval(r: BucketDiff) -> str:
    """The 95% interval, or, for a bucket only one side has, which side."""
    return CHANGE_TEXT.get(r.change) or _ci(r.ci_ms)


def _ms(x: float | None) -> str:
    return f"{x:,.2f}" if x is not None else "-"


def _side(d: dict, fallback: str) -> str:
    if not d:
        return fallback
    fields = {k: d.get(k) for k in ("name", "method", "batch_size", "seq_len", "grad_accum", "model")}
    return Side(**fields).describe()


def heading(d: SummaryDiff, a_name: str, b_name: str) -> str:
    """'B: lora-fast (lora, 2x128) against A: lora-base (lora, 2x128), per active step'."""
    unit = "per token (the shapes differ)" if d.per_token else "per active step"
    return f"B: {_side(d.b_side, b_name)} against A: {_side(d.a_side, a_name)}, {unit}"


def _unit(d: SummaryDiff) -> str:
    return "µs/token" if d.per_token else "ms/step"


def to_markdown(d: SummaryDiff, a_name: str, b_name: str) -> str:
    u = _unit(d)
    lines = [f"# {heading(d, a_name, b_name)}", "", f"**{d.explanation}**", "",
             f"| bucket | A {u} | B {u} | B - A | 95% CI |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r.label} | {_ms(r.a_ms)} | {_ms(r.b_ms)} | {r.delta_ms:+,.2f} | {_interval(r)} |"
              for r in d.buckets]
    lines.append(f"| **step** ({d.a_steps} vs {d.b_steps} active steps) | {_ms(d.a_step_ms)} | {_ms(d.b_step_ms)} | "
                 f"{d.delta_ms:+,.2f} | {_ci(d.ci_ms)} |")
    if d.kernels:
        lines += ["", "## Kernels that changed most", "",
                  f"| bucket | kernel | change | A {u} | B {u} | B - A |",
                  "| --- | --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {k.bucket} | `{k.name[:90]}` | {k.change} | {_ms(k.a_ms)} | {_ms(k.b_ms)} | {k.delta_ms:+,.3f} |"
                  for k in d.kernels]
    lines += [""] + [f"- {n}" for n in d.notes] if d.notes else []
    return "\n".join(lines) + "\n"


def _style(r: BucketDiff) -> str:
    """Red for a slowdown beyond the interval, green for a speed-up beyond it (a new or gone bucket: by its sign)."""
    if r.delta_ms > 0 and (r.ci_ms is None or r.delta_ms > r.ci_ms):
        return "red"
    if r.delta_ms < 0 and (r.ci_ms is None or -r.delta_ms > r.ci_ms):
        return "green"
    return ""


def rich_view(d: SummaryDiff, a_name: str, b_name: str) -> Group:
    u = _unit(d)
    t = Table(title=heading(d, a_name, b_name), header_style="bold",
              caption="\n".join([d.explanation, *d.notes]), caption_justify="left")
    for col in ("bucket", f"A {u}", f"B {u}", "B - A", "95% CI"):
        t.add_column(col, justify="left" if col == "bucket" else "right")
    for r in d.buckets:
        style = _style(r)
        delta = f"[{style}]{r.delta_ms:+,.2f}[/{style}]" if style else f"{r.delta_ms:+,.2f}"
        t.add_row(r.label, _ms(r.a_ms), _ms(r.b_ms), delta, _interval(r))
    t.add_row(f"[bold]step[/bold] ({d.a_steps} vs {d.b_steps} steps)", _ms(d.a_step_ms), _ms(d.b_step_ms),
              f"{d.delta_ms:+,.2f}", _ci(d.ci_ms))
    parts = [t]
    if d.kernels:
        k = Table(title="Kernels that changed most", header_style="bold")
        for col in ("bucket", "kernel", "change", f"B - A {u}"):
            k.add_column(col, justify="right" if col.startswith("B - A") else "left")
        for c in d.kernels:
            k.add_row(c.bucket, c.name[:70], c.change, f"{c.delta_ms:+,.3f}")
        parts.append(k)
    return Group(*parts)

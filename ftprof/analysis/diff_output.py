"""Show a SummaryDiff: a rich table in the terminal, Markdown on disk."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from ftprof.analysis.diff import SummaryDiff


def _ci(x: float | None) -> str:
    return f"±{x:,.2f}" if x is not None else "-"


def _ms(x: float | None) -> str:
    return f"{x:,.2f}" if x is not None else "-"


def to_markdown(d: SummaryDiff, a_name: str, b_name: str) -> str:
    lines = [f"# {b_name} against {a_name}", "", f"**{d.explanation}**", "",
             "| bucket | A ms/step | B ms/step | B - A | 95% CI |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r.label} | {_ms(r.a_ms)} | {_ms(r.b_ms)} | {r.delta_ms:+,.2f} | {_ci(r.ci_ms)} |" for r in d.buckets]
    lines.append(f"| **step** ({d.a_steps} vs {d.b_steps} active steps) | {_ms(d.a_step_ms)} | {_ms(d.b_step_ms)} | "
                 f"{d.delta_ms:+,.2f} | {_ci(d.ci_ms)} |")
    if d.kernels:
        lines += ["", "## Kernels that changed most", "",
                  "| bucket | kernel | change | A ms/step | B ms/step | B - A |",
                  "| --- | --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {k.bucket} | `{k.name[:90]}` | {k.change} | {_ms(k.a_ms)} | {_ms(k.b_ms)} | {k.delta_ms:+,.3f} |"
                  for k in d.kernels]
    lines += [""] + [f"- {n}" for n in d.notes] if d.notes else []
    return "\n".join(lines) + "\n"


def rich_view(d: SummaryDiff, a_name: str, b_name: str) -> Group:
    t = Table(title=f"{b_name} (B) against {a_name} (A), per active step", header_style="bold",
              caption=d.explanation, caption_justify="left")
    for col in ("bucket", "A ms", "B ms", "B - A", "95% CI"):
        t.add_column(col, justify="left" if col == "bucket" else "right")
    for r in d.buckets:
        style = "red" if r.delta_ms > 0 and (r.ci_ms is None or r.delta_ms > r.ci_ms) else \
            "green" if r.delta_ms < 0 and (r.ci_ms is None or -r.delta_ms > r.ci_ms) else ""
        delta = f"[{style}]{r.delta_ms:+,.2f}[/{style}]" if style else f"{r.delta_ms:+,.2f}"
        t.add_row(r.label, _ms(r.a_ms), _ms(r.b_ms), delta, _ci(r.ci_ms))
    t.add_row(f"[bold]step[/bold] ({d.a_steps} vs {d.b_steps} steps)", _ms(d.a_step_ms), _ms(d.b_step_ms),
              f"{d.delta_ms:+,.2f}", _ci(d.ci_ms))
    parts = [t]
    if d.kernels:
        k = Table(title="Kernels that changed most", header_style="bold")
        for col in ("bucket", "kernel", "change", "B - A ms"):
            k.add_column(col, justify="right" if col == "B - A ms" else "left")
        for c in d.kernels:
            k.add_row(c.bucket, c.name[:70], c.change, f"{c.delta_ms:+,.3f}")
        parts.append(k)
    return Group(*parts)

"""Write a TraceSummary as summary.json and summary.md, and show it as a rich table."""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.table import Table

from ftprof.profiling.trace_summary import TraceSummary
from ftprof.results.store import write_json_atomic, write_text_atomic


def _ms(us: float) -> str:
    return f"{us / 1000:,.2f}"


def _share(us: float, total: float) -> str:
    return f"{100 * us / total:.1f}%" if total else "-"


def to_markdown(s: TraceSummary) -> str:
    total = sum(s.categories_us.values())
    where = "GPU kernels" if s.device_kind == "gpu" else "CPU operators (self time)"
    lines = [f"# Where the time went: {Path(s.trace).name}", "",
             f"**Verdict:** {s.verdict}", ""]
    if s.profiler_overhead is not None:
        lines += [f"Profiler overhead: active steps ran {100 * s.profiler_overhead:+.1f}% against unprofiled steps "
                  "of the same run.", ""]
    lines += ["## Diagnoses", ""]
    lines += [f"- **{d.severity}** `{d.code}`: {d.message}" for d in s.diagnoses] or ["- none"]
    lines += ["", f"## Time by category ({where})", "", "| category | ms | share |", "| --- | ---: | ---: |"]
    lines += [f"| {c} | {_ms(t)} | {_share(t, total)} |" for c, t in s.categories_us.items()]
    if s.device_kind == "gpu":
        lines += [f"| idle gaps | {_ms(s.window_us - s.busy_us)} | {_share(s.window_us - s.busy_us, s.window_us)} "
                  "of window |"]
    lines += ["", f"## Time by stage ({s.stage_source})", "", "| stage | ms |", "| --- | ---: |"]
    lines += [f"| {k.split('/')[-1]} | {_ms(t)} |" for k, t in s.stages_us.items()] or ["| (no ftprof labels) | |"]
    if s.top_kernels:
        lines += ["", "## Top kernels", "", "| kernel | ms | calls |", "| --- | ---: | ---: |"]
        lines += [f"| `{k['name'][:100]}` | {_ms(k['us'])} | {k['count']} |" for k in s.top_kernels]
    key = "self_us" if s.device_kind == "cpu" else "inclusive_us"
    lines += ["", f"## Top operators ({key.replace('_us', '')} time)", "", "| operator | ms | calls |",
              "| --- | ---: | ---: |"]
    lines += [f"| `{o['name'][:100]}` | {_ms(o[key])} | {o['count']} |" for o in s.top_operators]
    return "\n".join(lines) + "\n"


def write(s: TraceSummary, out_dir: Path, stem: str = "summary") -> dict[str, str]:
    json_path = write_json_atomic(out_dir / f"{stem}.json", s.to_dict())
    md_path = write_text_atomic(out_dir / f"{stem}.md", to_markdown(s))
    return {"summary_json": str(json_path), "summary_md": str(md_path)}


def rich_view(s: TraceSummary) -> Group:
    total = sum(s.categories_us.values())
    cats = Table(title=f"Where the time went ({'GPU' if s.device_kind == 'gpu' else 'CPU'}): {s.verdict}",
                 header_style="bold")
    cats.add_column("category")
    cats.add_column("ms", justify="right")
    cats.add_column("share", justify="right")
    for c, t in s.categories_us.items():
        cats.add_row(c, _ms(t), _share(t, total))
    if s.device_kind == "gpu":
        cats.add_row("[dim]idle gaps[/dim]", _ms(s.window_us - s.busy_us), _share(s.window_us - s.busy_us,
                                                                                    s.window_us))
    for k, t in s.stages_us.items():
        cats.add_row(f"[cyan]stage {k.split('/')[-1]}[/cyan]", _ms(t), "")
    if s.profiler_overhead is not None:
        cats.add_row("[dim]profiler overhead (active vs unprofiled steps)[/dim]", "",
                     f"{100 * s.profiler_overhead:+.1f}%")
    diag = Table(title="Diagnoses", header_style="bold", show_lines=False)
    diag.add_column("")
    diag.add_column("finding")
    for d in s.diagnoses:
        diag.add_row("[yellow]![/yellow]" if d.severity == "warning" else "[dim]i[/dim]", d.message)
    if not s.diagnoses:
        diag.add_row("", "nothing stands out")
    return Group(cats, diag)

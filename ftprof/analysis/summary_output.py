"""Write a TraceSummary as summary.json and summary.md, and show it as a rich table."""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.table import Table

from ftprof.analysis.summary import TraceSummary
from ftprof.results.store import write_json_atomic, write_text_atomic


def _ms(us: float) -> str:
    return f"{us / 1000:,.2f}"


def _share(us: float, total: float) -> str:
    return f"{100 * us / total:.1f}%" if total else "-"


def _tflops(b: dict) -> str:
    return f"{b['tflops']:,.3g}" if b.get("tflops") else "-"


def si_flops(x: float) -> str:
    """134.2 MFLOP, 5.31 TFLOP: FLOP counts people can read."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if x >= scale:
            return f"{x / scale:,.4g} {unit}"
    return f"{x:,.0f} FLOP"


def _of_peak(b: dict) -> str:
    return f"{100 * b['peak_fraction']:.0f}%" if b.get("peak_fraction") else "-"


def _flops_line(bd: dict) -> str | None:
    if not bd.get("flops_per_step"):
        return None
    line = f"FLOPs counted from shapes: {si_flops(bd['flops_per_step'])} per step"
    if bd.get("flops_ratio"):
        line += f", {100 * bd['flops_ratio']:.1f}% of the run's HFU count ({si_flops(bd['hfu_flops_per_step'])})"
    return line


def buckets_markdown(s: TraceSummary) -> list[str]:
    bd = s.breakdown
    if not bd or not bd["buckets"]:
        return []
    peak = f", peak {bd['peak_tflops']:,.0f} TFLOP/s" if bd.get("peak_tflops") else ""
    lines = ["", f"## Fine-tuning buckets (per active step, {bd['steps']} step{'s' if bd['steps'] != 1 else ''}, "
             f"step {_ms_mean(bd)} ms{peak})", "",
             "| bucket | ms/step | share | FLOP/step | TFLOP/s | of peak | top kernel |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for b in bd["buckets"].values():
        top = f"`{b['kernels'][0]['name'][:60]}`" if b["kernels"] else ""
        f = si_flops(b["flops_per_step"]) if b.get("flops_per_step") else "-"
        lines.append(f"| {b['label']} | {b['ms_per_step']:,.2f} | {100 * (b['share'] or 0):.1f}% | {f} | "
                     f"{_tflops(b)} | {_of_peak(b)} | {top} |")
    extra = [x for x in (_flops_line(bd), _overlap_line(bd)) if x] + bd.get("notes", [])
    return lines + ([""] + [f"- {x}" for x in extra] if extra else [])


def _ms_mean(bd: dict) -> str:
    return f"{sum(bd['step_ms']) / len(bd['step_ms']):,.2f}" if bd["step_ms"] else "-"


def _overlap_line(bd: dict) -> str | None:
    comm = bd["buckets"].get("communication")
    if not comm or bd.get("communication_overlap_ms") is None:
        return None
    return (f"communication overlapped with compute: {bd['communication_overlap_ms']:,.2f} of "
            f"{comm['ms_per_step']:,.2f} ms per step")


def window_ms(s: TraceSummary) -> str:
    """The unit of the category, stage, kernel, operator and idle tables: milliseconds per active step, as the
    buckets (so the two breakdowns of a step can be read side by side), or over the whole trace where it has no
    steps."""
    return "ms/step" if _steps(s) else "ms, whole trace"


def _steps(s: TraceSummary) -> int | None:
    return (s.breakdown or {}).get("steps") or None


def _per_step(s: TraceSummary, us: float) -> str:
    """A whole-window time in the window tables' unit (:func:`window_ms`)."""
    return _ms(us / (_steps(s) or 1))


def _calls_unit(s: TraceSummary) -> str:
    return "calls/step" if _steps(s) else "calls"


def _calls(s: TraceSummary, count: int) -> str:
    """Calls in the window tables' unit: per step (to one decimal where they do not divide evenly)."""
    steps = _steps(s) or 1
    return f"{count // steps:,}" if count % steps == 0 else f"{count / steps:,.1f}"


def overhead_line(overhead: float) -> str:
    """The profiler's cost, as measured in the run: active steps against unprofiled ones. Profiled steps that ran
    faster say that the run's own step-to-step spread is larger than the profiler's cost."""
    line = f"active steps ran {100 * overhead:+.1f}% against unprofiled steps of the same run"
    return line + (": no measurable overhead (the steps' own spread is larger)" if overhead < 0 else "")


def to_markdown(s: TraceSummary) -> str:
    total = sum(s.categories_us.values())
    where = "GPU kernels" if s.device_kind == "gpu" else "CPU operators (self time)"
    unit = window_ms(s)
    lines = [f"# Where the time went: {Path(s.trace).name}", "",
             f"**Verdict:** {s.verdict}", ""]
    if s.profiler_overhead is not None:
        lines += [f"Profiler overhead: {overhead_line(s.profiler_overhead)}.", ""]
    lines += ["## Diagnoses", ""]
    lines += [f"- **{d.severity}** `{d.code}`: {d.message}" for d in s.diagnoses] or ["- none"]
    lines += buckets_markdown(s)
    lines += ["", f"## Time by category ({where})", "", f"| category | {unit} | share |", "| --- | ---: | ---: |"]
    lines += [f"| {c} | {_per_step(s, t)} | {_share(t, total)} |" for c, t in s.categories_us.items()]
    if s.device_kind == "gpu":
        idle = s.window_us - s.busy_us
        lines += [f"| idle gaps | {_per_step(s, idle)} | {_share(idle, s.window_us)} of window |"]
    lines += ["", f"## Time by stage ({s.stage_source})", "", f"| stage | {unit} |", "| --- | ---: |"]
    lines += ([f"| {k.split('/')[-1]} | {_per_step(s, t)} |" for k, t in s.stages_us.items()]
              or ["| (no ftprof labels) | |"])
    lines += _idle_markdown(s)
    if s.top_kernels:
        lines += ["", "## Top kernels", "", f"| kernel | {unit} | {_calls_unit(s)} |", "| --- | ---: | ---: |"]
        lines += [f"| `{k['name'][:100]}` | {_per_step(s, k['us'])} | {_calls(s, k['count'])} |" for k in s.top_kernels]
    key = "self_us" if s.device_kind == "cpu" else "inclusive_us"
    lines += ["", f"## Top operators ({key.replace('_us', '')} time)", "", f"| operator | {unit} | {_calls_unit(s)} |",
              "| --- | ---: | ---: |"]
    lines += [f"| `{o['name'][:100]}` | {_per_step(s, o[key])} | {_calls(s, o['count'])} |" for o in s.top_operators]
    return "\n".join(lines) + "\n"


def _idle_markdown(s: TraceSummary) -> list[str]:
    """Where the GPU waited: each gap charged to the stage whose work ended it (or to a change of stage)."""
    if not s.idle_by_stage_us:
        return []
    lines = ["", "## GPU idle: what the GPU was waiting for", "",
             "Each gap in the GPU timeline counts for the stage of the work that ended it; a gap between two stages "
             "counts for the change (a step boundary).", "",
             f"| waiting for | {window_ms(s)} | {'gaps/step' if _steps(s) else 'gaps'} | in gaps >= 1 ms |",
             "| --- | ---: | ---: | ---: |"]
    for key, row in s.idle_by_stage_us.items():
        name = " -> ".join(part.split("/")[-1] for part in key.split(" -> "))
        lines.append(f"| {name} | {_per_step(s, row['idle_us'])} | {_calls(s, int(row['gaps']))} | "
                     f"{_per_step(s, row['long_gaps_us'])} |")
    return lines


def write(s: TraceSummary, out_dir: Path, stem: str = "summary") -> dict[str, str]:
    json_path = write_json_atomic(out_dir / f"{stem}.json", s.to_dict())
    md_path = write_text_atomic(out_dir / f"{stem}.md", to_markdown(s))
    return {"summary_json": str(json_path), "summary_md": str(md_path)}


def buckets_table(s: TraceSummary) -> Table | None:
    bd = s.breakdown
    if not bd or not bd["buckets"]:
        return None
    rank = f"rank {s.rank}, " if s.rank is not None else ""
    peak = f", peak {bd['peak_tflops']:,.0f} TFLOP/s" if bd.get("peak_tflops") else ""
    notes = [x for x in (_flops_line(bd), _overlap_line(bd)) if x] + bd.get("notes", [])
    t = Table(title=f"Fine-tuning buckets ({rank}per active step of {_ms_mean(bd)} ms, {bd['steps']} steps{peak})",
              header_style="bold", caption="\n".join(notes) or None, caption_justify="left")
    for col, just in (("bucket", "left"), ("ms/step", "right"), ("share", "right"), ("TFLOP/s", "right"),
                      ("of peak", "right")):
        t.add_column(col, justify=just)
    for b in bd["buckets"].values():
        t.add_row(b["label"], f"{b['ms_per_step']:,.2f}", f"{100 * (b['share'] or 0):.1f}%", _tflops(b), _of_peak(b))
    return t


def rich_view(s: TraceSummary) -> Group:
    total = sum(s.categories_us.values())
    # the shares are of the kernels' (GPU) or the operators' self time (CPU), not of the step: on a CPU the host
    # time outside operators is the step-time table's to show
    whose = "GPU kernels" if s.device_kind == "gpu" else "CPU operators' self time"
    cats = Table(title=f"Where the time went ({whose}): {s.verdict}", header_style="bold")
    cats.add_column("category")
    cats.add_column(window_ms(s), justify="right")
    cats.add_column("share", justify="right")
    for c, t in s.categories_us.items():
        cats.add_row(c, _per_step(s, t), _share(t, total))
    if s.device_kind == "gpu":
        cats.add_row("[dim]idle gaps[/dim]", _per_step(s, s.window_us - s.busy_us),
                     _share(s.window_us - s.busy_us, s.window_us))
    for k, t in s.stages_us.items():
        cats.add_row(f"[cyan]stage {k.split('/')[-1]}[/cyan]", _per_step(s, t), "")
    if s.profiler_overhead is not None:
        cats.add_row("[dim]profiler overhead (active vs unprofiled steps)[/dim]", "",
                     f"{100 * s.profiler_overhead:+.1f}%" + (" (noise)" if s.profiler_overhead < 0 else ""))
    diag = Table(title="Diagnoses", header_style="bold", show_lines=False)
    diag.add_column("")
    diag.add_column("finding")
    for d in s.diagnoses:
        diag.add_row("[yellow]![/yellow]" if d.severity == "warning" else "[dim]i[/dim]", d.message)
    if not s.diagnoses:
        diag.add_row("", "nothing stands out")
    table = buckets_table(s)
    return Group(*([table] if table is not None else []), cats, diag)


def _step_ms(s: TraceSummary) -> float | None:
    bd = s.breakdown
    return sum(bd["step_ms"]) / len(bd["step_ms"]) if bd and bd["step_ms"] else None


def slowest_rank(summaries: list[TraceSummary]) -> tuple[int | None, float, float] | None:
    """(rank, its ms per step, ms per step over the fastest rank) of the slowest rank; None without step times."""
    timed = [(s.rank, t) for s in summaries if (t := _step_ms(s)) is not None]
    if not timed:
        return None
    rank, worst = max(timed, key=lambda x: x[1])
    return rank, worst, worst - min(t for _, t in timed)


def ranks_table(summaries: list[TraceSummary], columns: int = 6) -> Table:
    """One row per rank: step time and the largest buckets (ms per step), the slowest rank named."""
    totals: dict[str, float] = {}
    for s in summaries:
        for key, b in (s.breakdown or {}).get("buckets", {}).items():
            totals[key] = totals.get(key, 0.0) + b["ms_per_step"]
    keys = sorted(totals, key=lambda k: -totals[k])[:columns]
    slow = slowest_rank(summaries)
    caption = (f"slowest: rank {slow[0]}, {slow[1]:,.2f} ms per step ({slow[2]:+,.2f} over the fastest)"
               if slow else None)
    t = Table(title="Per rank (ms per active step)", header_style="bold", caption=caption, caption_justify="left")
    t.add_column("rank")
    t.add_column("step", justify="right")
    labels = {}
    for s in summaries:
        for key, b in (s.breakdown or {}).get("buckets", {}).items():
            labels[key] = b["label"]
    for key in keys:
        t.add_column(labels[key], justify="right")
    for s in sorted(summaries, key=lambda x: (x.rank is None, x.rank)):
        buckets = (s.breakdown or {}).get("buckets", {})
        mark = " [red]slowest[/red]" if slow and s.rank == slow[0] and len(summaries) > 1 else ""
        t.add_row(f"{s.rank}{mark}", _ms(1000 * (_step_ms(s) or 0)),
                  *[f"{buckets[k]['ms_per_step']:,.2f}" if k in buckets else "-" for k in keys])
    return t

"""``build_report``: run directories -> raw_summary.csv, summary.csv, summary.md, PNG plots, report.html."""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ftprof.errors import ConfigError
from ftprof.report import choose as choose_mod
from ftprof.report import compare as compare_mod
from ftprof.report import eval_loss, plots, prediction, profiles
from ftprof.report import slow_steps as slow_steps_mod
from ftprof.report.tables import SummaryTable, load_results, summarize, to_csv_frame, to_markdown
from ftprof.results.load import find_run_dirs
from ftprof.results.run_dir import CONFIG, ENV
from ftprof.results.store import write_text_atomic

FORMATS = ("all", "md", "csv")
DEFAULT_SORT = "tokens_per_s"


@dataclass
class Report:
    frame: pd.DataFrame  # every run, every field
    table: SummaryTable
    out_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    comparison: compare_mod.Comparison | None = None
    choice: choose_mod.Choice | None = None


def runs_device(df: pd.DataFrame) -> tuple[str, float] | None:
    """(name, total bytes) of the GPU the successful runs came from (their env.json), when they agree on one."""
    if "run_dir" not in df or "status" not in df:
        return None
    seen = set()
    for run_dir in df.loc[df["status"] == "ok", "run_dir"]:
        try:
            gpus = json.loads((Path(run_dir) / ENV).read_text()).get("gpus") or []
        except (OSError, ValueError):
            continue
        if gpus and gpus[0].get("total_memory"):
            seen.add((str(gpus[0].get("name")), float(gpus[0]["total_memory"])))
    return seen.pop() if len(seen) == 1 else None


def _writable(out: Path) -> None:
    """The output directory, created; one line (exit 2) when it cannot be: a file in the way, no permission."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".ftprof-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--output-dir: cannot write to '{out}': {exc.strerror or exc}") from None


def skipped_markdown(problems: list[str]) -> str:
    """The run directories left out, and why: in summary.md and report.html, not only on the terminal."""
    return "\n".join(["## Skipped run directories", "", *(f"- {p}" for p in problems)]) + "\n"


def _check_paths(paths: list[str | Path], baseline: str | Path | None) -> None:
    for p, where in [(p, "") for p in paths] + ([(baseline, "--baseline: ")] if baseline else []):
        if not Path(p).exists():
            raise ConfigError(f"{where}'{p}' does not exist")
        if not Path(p).is_dir():  # result.json, config.json, a summary: the run directory holding it is meant
            hint = f"; its run directory is '{Path(p).parent}'" if (Path(p).parent / CONFIG).is_file() else ""
            raise ConfigError(f"{where}'{p}' is a file, not a directory (a run directory or a folder of them){hint}")
    if baseline:
        _check_apart(paths, baseline)


def _check_apart(paths: list[str | Path], baseline: str | Path) -> None:
    """The baseline and the runs compared with it must be different folders, neither inside the other: runs
    compared with themselves pass a gate that checked nothing."""
    base = Path(baseline).resolve()
    for p in paths:
        here = Path(p).resolve()
        if here == base:
            raise ConfigError(f"--baseline: '{baseline}' is also a path to report (the same folder): runs compared "
                              "with themselves check nothing; give the baseline's own results directory")
        if base in here.parents or here in base.parents:
            inner, outer = (p, baseline) if base in here.parents else (baseline, p)
            raise ConfigError(f"--baseline: '{inner}' lies inside '{outer}', so some runs would be compared with "
                              "themselves; give the current and the baseline results as separate folders")


def build_report(paths: list[str | Path], out_dir: str | Path | None = None, *, baseline: str | Path | None = None,
                 threshold_pct: float = 5.0, sort: str | None = DEFAULT_SORT, group_by: str | None = None,
                 formats: str = "all", plot: bool = True) -> Report:
    if not paths:
        raise ConfigError("give at least one results directory")
    _check_paths(list(paths), baseline)
    if formats not in FORMATS:
        raise ConfigError(f"--format: '{formats}' is not one of {', '.join(FORMATS)}")
    if threshold_pct < 0:
        raise ConfigError("--threshold must be >= 0")
    problems: list[str] = []
    df = load_results(list(paths), problems=problems)
    if df.empty:
        where = ", ".join(map(str, paths))
        if problems:  # run directories exist, but none could be read: say which and why, not "none found"
            raise ConfigError(f"no readable run directory under {where}: {len(problems)} skipped, e.g. {problems[0]}")
        raise ConfigError(f"no run directories (with ftprof's config.json) under {where}")
    problems += [f"{p}: holds no run directory (with ftprof's config.json)" for p in paths if not find_run_dirs([p])]
    df = profiles.with_bucket_columns(df)
    if sort and sort not in df.columns:
        if sort != DEFAULT_SORT:
            raise ConfigError(f"--sort: '{sort}' is not a column (try tokens_per_s, step_time_p50_s, mfu)")
        sort = None  # no run finished, so nothing has a throughput yet: the rows keep their order
    if group_by and group_by not in df.columns:
        raise ConfigError(f"--group-by: '{group_by}' is not a column (try method, model, batch_size)")
    out = Path(out_dir) if out_dir else Path(paths[0]) / "report"
    _writable(out)
    table = summarize(df, sort=sort, group_by=group_by)
    report = Report(df, table, out, problems=problems)
    if formats in ("all", "csv"):
        report.files["raw_summary.csv"] = write_text_atomic(out / "raw_summary.csv", df.to_csv(index=False))
        report.files["summary.csv"] = write_text_atomic(out / "summary.csv", to_csv_frame(table).to_csv(index=False))
    markdown = to_markdown(table, title=f"ftprof report: {', '.join(str(p) for p in paths)}")
    report.choice = choose_mod.choose(df, device=runs_device(df))
    markdown += "\n" + choose_mod.to_markdown(report.choice)
    if baseline:
        base_df = load_results([baseline], problems=problems)
        if base_df.empty:
            raise ConfigError(f"--baseline: no run directories under '{baseline}'")
        report.comparison = compare_mod.compare(df, base_df, threshold_pct)
        markdown += "\n" + compare_mod.to_markdown(report.comparison, threshold_pct)
    slow = slow_steps_mod.to_markdown(df)
    if slow:
        markdown += "\n" + slow
    markdown += ("\n" + eval_loss.to_markdown(df)) if "eval_loss_last" in df else ""  # runs that evaluated
    markdown += prediction.add_to_report(df, out, report.files, write_csv=formats in ("all", "csv"))
    if problems:
        markdown += "\n" + skipped_markdown(problems)
    if formats in ("all", "md"):
        report.files["summary.md"] = write_text_atomic(out / "summary.md", markdown)
    if plot and formats == "all":
        for png in plots.all_plots(df, out, report.choice):
            report.files[png.name] = png
        report.files["report.html"] = write_text_atomic(out / "report.html", to_html(report, markdown))
    return report


def _md_table_to_html(markdown: str) -> str:
    """The summary's Markdown, rendered minimally (tables, headings, paragraphs, lists) without extra packages."""
    out, in_table = [], False
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-: ") for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<li>{_inline(line[2:])}</li>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    if in_table:
        out.append("</table>")
    return "\n".join(out)


def _inline(text: str) -> str:
    text = html.escape(text)
    parts = text.split("**")
    return "".join(f"<b class='bad'>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def to_html(report: Report, markdown: str) -> str:
    """One self-contained file: tables, interactive charts (plotly's JavaScript inlined) and PNGs embedded,
    nothing to fetch."""
    from ftprof.report import interactive

    images = []
    for name, path in report.files.items():
        if name.endswith(".png"):
            data = base64.b64encode(Path(path).read_bytes()).decode()
            images.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
                          f"<figcaption>{html.escape(plots.CAPTIONS.get(name, name))}</figcaption></figure>")
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}"
             "td:first-child,th:first-child{text-align:left}.bad{color:#b00}img{max-width:100%}"
             "figure{display:inline-block;margin:1em;vertical-align:top;max-width:48%}figcaption{font-size:13px;color:#333}"
             ".chart{margin:1em 0}.note{color:#555}")
    charts = interactive.charts_html(report.frame, report.choice)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ftprof report</title><style>{style}</style>"
            f"</head><body>{_md_table_to_html(markdown)}{charts}{''.join(images)}</body></html>\n")

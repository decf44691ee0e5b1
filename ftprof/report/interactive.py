"""report.html's interactive charts (plotly, its JavaScript inlined: the file opens offline): every configuration
on the Pareto chart and every run's memory breakdown, each point and bar named on hover, where the PNGs label only
the frontier and the picks."""

from __future__ import annotations

import pandas as pd

from ftprof.metrics import GIB
from ftprof.results.labels import labels

MISSING = "plotly is not installed (pip install 'ftprof[plots]'): the charts below are PNGs without hover."


def available() -> bool:
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True


def _hover(c, throughput: str = "tokens/s") -> str:
    return (f"<b>{c.label}</b><br>{c.tokens_per_s:,.1f} {throughput}<br>{c.peak_bytes / GIB:.2f} GiB"
            + (f"<br>{c.repeats} runs" if c.repeats > 1 else "")
            + (f"<br>step p90/p50 {c.spread:.2f}" + (" (the worst of its runs)" if c.repeats > 1 else "")
               if c.spread else ""))


def pareto_figure(choice):
    import plotly.graph_objects as go

    front = {id(c) for c in choice.frontier}
    rest = [c for c in choice.configurations if id(c) not in front]
    fig = go.Figure()
    fig.add_trace(go.Scattergl(x=[c.peak_bytes / GIB for c in rest], y=[c.tokens_per_s for c in rest],
                               mode="markers", name="other configurations", marker={"color": "#999", "size": 6},
                               hovertext=[_hover(c, choice.throughput) for c in rest], hoverinfo="text"))
    fig.add_trace(go.Scatter(x=[c.peak_bytes / GIB for c in choice.frontier],
                             y=[c.tokens_per_s for c in choice.frontier], mode="lines+markers",
                             line={"shape": "hv"}, name="Pareto frontier", hovertext=[_hover(c, choice.throughput)
                                                                                      for c in choice.frontier],
                             hoverinfo="text"))
    fig.update_layout(title=f"{choice.throughput.capitalize()} against peak memory: every configuration (hover for its "
                            "name)",
                      xaxis_title=f"peak memory per GPU (GiB, {choice.memory_source})",
                      yaxis_title=f"{choice.throughput} (global)", height=560, template="plotly_white")
    return fig


def breakdown_figure(df: pd.DataFrame):
    """Stacked bars of every GPU run's memory breakdown, or None when no run recorded one."""
    import plotly.graph_objects as go

    from ftprof.report.plots import breakdown_parts

    rows = df[pd.to_numeric(df.get("torch_peak_allocated"), errors="coerce").notna()] \
        if "torch_peak_allocated" in df else df.iloc[0:0]
    parts = breakdown_parts(rows) if len(rows) else None
    if parts is None:
        return None
    names = list(labels(df).loc[rows.index])
    fig = go.Figure()
    for part, values in parts.items():
        fig.add_trace(go.Bar(y=names, x=(values.fillna(0) / GIB).round(3), name=part, orientation="h"))
    fig.update_layout(barmode="stack", title="Where the memory went, every run (GiB per GPU)",
                      height=max(400, 22 * len(names) + 200), template="plotly_white",
                      yaxis={"autorange": "reversed", "automargin": True})
    return fig


def charts_html(df: pd.DataFrame, choice) -> str:
    """The charts as HTML divs, plotly's JavaScript inlined once before the first; "" when there is nothing to
    draw, a note when plotly is missing."""
    if not available():
        return f"<p class='note'>{MISSING}</p>"
    figs = [f for f in (pareto_figure(choice) if choice and choice.configurations else None,
                        breakdown_figure(df)) if f is not None]
    out = []
    for i, fig in enumerate(figs):
        out.append(fig.to_html(full_html=False, include_plotlyjs=i == 0, div_id=f"ftprof-chart-{i}",
                               config={"displaylogo": False}))
    return "".join(f"<div class='chart'>{d}</div>" for d in out)

"""matplotlib figures that stay readable from 2 to 1,000 items: headless, sized by what they hold, laid out by
constrained_layout (nothing cut), every library warning kept off the output, written atomically."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

DPI = 110
LABEL_FONT = 7.5
LABEL_ROW_IN = 0.2  # height of one label row, inches (7.5 pt text plus its gap)
CHAR_IN = 0.06  # width of one label character at LABEL_FONT, inches (DejaVu Sans averages ~0.055: never cut)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def quiet():
    """Library warnings and log lines (matplotlib's layout and font notes) stay out of the report's output."""
    from ftprof.runtime import logger_level

    with logger_level("matplotlib", logging.ERROR), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def figure(width: float, height: float, **kw):
    """A figure laid out by constrained_layout (never tight_layout), with its first axes."""
    plt = pyplot()
    return plt.subplots(figsize=(width, height), layout="constrained", **kw)


def save(fig, path: Path) -> Path:
    """The figure as a PNG, written atomically like every other file (rendered in memory, then renamed in)."""
    from ftprof.results.store import write_bytes_atomic

    buf = io.BytesIO()
    with quiet():
        fig.savefig(buf, format="png", dpi=DPI)
    pyplot().close(fig)
    return write_bytes_atomic(path, buf.getvalue())


def text_width_in(texts, font: float = LABEL_FONT) -> float:
    """Inches the longest text needs at ``font`` points (an upper estimate)."""
    return max((len(t) for t in texts), default=0) * CHAR_IN * font / LABEL_FONT


def label_column(ax, label_ax, points: list[tuple[float, float, str]], color="black") -> None:
    """Label points in a column of their own (``label_ax``, right of ``ax``): one row per label, in the points'
    vertical order, each joined to its point by a thin line. Rows never overlap and the column is as wide as its
    longest label, so nothing is cut or hidden however close the points lie."""
    from matplotlib.patches import ConnectionPatch

    label_ax.set_axis_off()
    label_ax.set_xlim(0, 1)
    label_ax.set_ylim(0, 1)
    rows = sorted(points, key=lambda p: p[1])
    n = len(rows)
    for i, (x, y, text) in enumerate(rows):
        ty = (i + 0.5) / n
        # out of the layout: the column's width is sized for its text, and a line reaching into the plot must not
        # make constrained_layout shrink either axes
        label_ax.text(0.04, ty, text, fontsize=LABEL_FONT, va="center", ha="left", color=color, in_layout=False)
        line = ConnectionPatch(xyA=(x, y), coordsA=ax.transData, xyB=(0.03, ty), coordsB=label_ax.transAxes,
                               color="0.6", lw=0.6, in_layout=False)
        label_ax.add_artist(line)


def legend_below(fig, ax, max_entries: int = 12) -> bool:
    """The axes' legend under the plot (outside it, never over the data), when it has at most ``max_entries``."""
    handles, names = ax.get_legend_handles_labels()
    if not handles or len(handles) > max_entries:
        return False
    ncols = min(len(handles), 3 if max(len(n) for n in names) > 30 else 4)
    fig.legend(handles, names, loc="outside lower center", ncols=ncols, fontsize=LABEL_FONT, frameon=False)
    return True

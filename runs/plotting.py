"""The house style of the figures `sangam sweep` and `sangam reproduce` draw (matplotlib, no display):
a style per series that never repeats within a figure, latency axes that saturated series do not set,
and every figure saved as a PNG and a PDF."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import LogFormatter

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

# Cycle lengths 9, 7 and 4 are pairwise coprime, so series i takes the (i mod 9)-th colour, (i mod 7)-th
# marker and (i mod 4)-th line style, neighbours differ in all three, and no two of the first 9 * 7 * 4
# share all three (Chinese remainder theorem).
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LineStyle = Literal["-", "--", ":", "-."]
LINESTYLES: tuple[LineStyle, ...] = ("-", "--", ":", "-.")
DISTINCT = len(COLORS) * len(MARKERS) * len(LINESTYLES)  # 252 series in one figure
BEYOND = "#7f7f7f"  # the band of points beyond a latency axis (no series takes this grey)
BAND_ALPHA = 0.12
REACH = 3.0  # a latency axis ends at the last point within 3x its upper quartile
ALPHA = 0.85  # a series drawn later over a coincident one lets it show through
DPI = 200
FORMATS = ("png", "pdf")
RC: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "axes.axisbelow": True,  # grid lines behind bars
    "grid.alpha": 0.3,
    "lines.linewidth": 1.4,
    "lines.markersize": 5,
    "lines.markeredgewidth": 1.2,
    "legend.handlelength": 3.0,  # long enough to tell the line styles apart
    "pdf.fonttype": 42,  # TrueType in the PDF: publishers refuse Type 3 fonts
}


@dataclass(frozen=True, slots=True)
class Style:
    """How one series is drawn: a colour, a marker (hollow, so a coincident marker's outline shows) and
    a line style."""

    color: str
    marker: str
    linestyle: LineStyle


def styles(n: int) -> list[Style]:
    """`n` styles, no two alike; more than `DISTINCT` series in one figure are refused."""
    if n > DISTINCT:
        raise ValueError(f"{n} series in one figure: at most {DISTINCT} can be drawn in distinct styles")
    return [
        Style(COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)])
        for i in range(n)
    ]


def styled(labels: Iterable[str]) -> dict[str, Style]:
    """A style per distinct label, in first-seen order: one series keeps its style in every panel."""
    names = list(dict.fromkeys(labels))
    return dict(zip(names, styles(len(names)), strict=True))


def latency_top(values: Iterable[float]) -> float:
    """Where a latency axis ends: the largest value within `REACH` times the values' upper quartile.
    A saturated series (its latency grows with the run's length) then lies beyond the axis instead of
    flattening the others, as long as its points are fewer than a quarter of all."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if not ordered:
        raise ValueError("no finite latency to draw")
    quartile = ordered[3 * (len(ordered) - 1) // 4]
    return max(v for v in ordered if v <= REACH * quartile)


@contextmanager
def house_style() -> Iterator[None]:
    """Draw and save the figures inside this: paper-sized fonts, light grid, embeddable PDF fonts."""
    with matplotlib.rc_context(RC):
        yield


def figure(width: float, height: float) -> Figure:
    """A figure (inches) whose layout keeps titles, labels and outside legends from overlapping."""
    return Figure(figsize=(width, height), layout="constrained")


def line(
    ax: Axes,
    xs: Sequence[float],
    ys: Sequence[float],
    style: Style,
    label: str,
    markevery: float | None = None,
) -> None:
    """One series; those drawn later lie on top, translucent. `markevery`: a marker at every this
    fraction of the axes' diagonal along the line (for lines of many points), else at every point."""
    ax.plot(xs, ys, label=label, color=style.color, marker=style.marker, linestyle=style.linestyle,
            markerfacecolor="none", alpha=ALPHA, markevery=markevery)  # fmt: skip


def cap_latency(axes: Sequence[Axes]) -> list[Axes]:
    """End the latency axis the `axes` share at `latency_top` of all their lines' points; above that top a
    shaded band holds each point beyond it, drawn in its line's colour and marker. The axes so marked."""
    ys = [y for ax in axes for ln in ax.get_lines() for _, y in _points(ln) if math.isfinite(y)]
    if not ys:
        return []
    top, low = latency_top(ys), min(ys)
    band = 0.15 * ((top - low) or top or 1.0)  # above the top: a gap, then the shaded band
    marked = []
    for ax in axes:
        ax.set_ylim(low - band / 3, top + band)
        beyond = [(ln, [x for x, y in _points(ln) if y > top]) for ln in ax.get_lines()]
        for ln, xs in beyond:
            if xs:
                ax.plot(xs, [top + 0.72 * band] * len(xs), linestyle="none", marker=ln.get_marker(),
                        color=ln.get_color(), markerfacecolor="none", alpha=ALPHA)  # fmt: skip
        if any(xs for _, xs in beyond):
            ax.axhspan(top + 0.45 * band, top + band, color=BEYOND, alpha=BAND_ALPHA, linewidth=0)
            marked.append(ax)
    return marked


def log_latency(ax: Axes) -> None:
    """A logarithmic latency axis labelled in plain seconds (2, 5, 10, 200), not powers of ten."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def _points(ln: Line2D) -> list[tuple[float, float]]:
    return [(x, y) for x, y in np.asarray(ln.get_xydata(), dtype=float).tolist()]


def legend_handles(style_of: Mapping[str, Style], beyond: bool = False) -> tuple[list[Artist], list[str]]:
    """Legend entries for the styled series, and for the band of `cap_latency` if one was drawn."""
    handles: list[Artist] = [
        Line2D([], [], color=s.color, marker=s.marker, linestyle=s.linestyle, markerfacecolor="none")
        for s in style_of.values()
    ]
    labels = list(style_of)
    if beyond:
        handles.append(Patch(color=BEYOND, alpha=BAND_ALPHA, linewidth=0))
        labels.append("beyond the axis")
    return handles, labels


def legend_inches(labels: Sequence[str]) -> float:
    """About how wide a legend column of these labels is, in inches (at `RC`'s legend font size)."""
    return 0.8 + 0.065 * max(map(len, labels), default=0)


def save(fig: Figure, stem: Path) -> list[Path]:
    """`stem`.png (at `DPI`) and `stem`.pdf."""
    paths = [stem.with_name(f"{stem.name}.{fmt}") for fmt in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=DPI)
    return paths

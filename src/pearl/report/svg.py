"""Small dependency-free SVG charts for run folders (line and step series on one time axis)."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


@dataclass(slots=True)
class Series:
    label: str
    points: list[tuple[float, float]]
    step: bool = False  # a step function (value holds until the next point)
    right_axis: bool = False  # plotted against the right-hand axis
    dashed: bool = False


@dataclass(slots=True)
class Chart:
    title: str
    x_label: str
    y_label: str
    y2_label: str = ""
    series: list[Series] = field(default_factory=list)
    width: int = 900
    height: int = 320


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * i / n for i in range(n + 1)]


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == 0 else f"{v:.2g}"


def render(chart: Chart) -> str:
    """The chart as an SVG document."""
    left, right, top, bottom = 70, 70, 30, 70
    w, h = chart.width - left - right, chart.height - top - bottom
    xs = [x for s in chart.series for x, _ in s.points] or [0.0, 1.0]
    x_lo, x_hi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1

    def y_range(right_axis: bool) -> tuple[float, float]:
        ys = [y for s in chart.series if s.right_axis == right_axis for _, y in s.points]
        if not ys:
            return 0.0, 1.0
        hi = max(ys)
        return 0.0, hi * 1.05 if hi > 0 else 1.0

    ranges = {False: y_range(False), True: y_range(True)}

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * w

    def py(y: float, right_axis: bool) -> float:
        lo, hi = ranges[right_axis]
        return top + h - (y - lo) / (hi - lo) * h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{chart.width}" height="{chart.height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{chart.width}" height="{chart.height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">{escape(chart.title)}</text>',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
    ]
    for t in _ticks(x_lo, x_hi):
        out.append(
            f'<text x="{px(t):.1f}" y="{top + h + 14}" text-anchor="middle">{_fmt(t)}</text>'
        )
    for t in _ticks(*ranges[False]):
        out.append(
            f'<text x="{left - 6}" y="{py(t, False) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
        )
        out.append(
            f'<line x1="{left}" x2="{left + w}" y1="{py(t, False):.1f}" y2="{py(t, False):.1f}" '
            'stroke="#eee"/>'
        )
    if any(s.right_axis for s in chart.series):
        for t in _ticks(*ranges[True]):
            out.append(f'<text x="{left + w + 6}" y="{py(t, True) + 4:.1f}">{_fmt(t)}</text>')
    out.append(
        f'<text x="{left + w / 2}" y="{top + h + 30}" text-anchor="middle">{escape(chart.x_label)}</text>'
    )
    out.append(
        f'<text transform="translate(16,{top + h / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(chart.y_label)}</text>"
    )
    if chart.y2_label:
        out.append(
            f'<text transform="translate({chart.width - 12},{top + h / 2}) rotate(90)" '
            f'text-anchor="middle">{escape(chart.y2_label)}</text>'
        )
    for k, s in enumerate(chart.series):
        color = PALETTE[k % len(PALETTE)]
        pts = sorted(s.points)
        if s.step and pts:
            stepped = []
            for i, (x, y) in enumerate(pts):
                stepped.append((x, y))
                nxt = pts[i + 1][0] if i + 1 < len(pts) else x_hi
                stepped.append((nxt, y))
            pts = stepped
        coords = " ".join(f"{px(x):.1f},{py(y, s.right_axis):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="5,3"' if s.dashed else ""
        out.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>'
        )
        lx, ly = left + (k % 4) * (w / 4), top + h + 46 + (k // 4) * 14
        out.append(
            f'<line x1="{lx:.1f}" x2="{lx + 18:.1f}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
            f'stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 22:.1f}" y="{ly}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

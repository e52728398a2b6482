"""Charts drawn on the server as inline SVG: pure functions from numbers to markup.

No script and no library: the dashboard embeds the returned ``<svg>`` as it is. Every text
that goes into the markup is escaped here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

PALETTE = ("#2f81f7", "#3fb950", "#d29922", "#f85149", "#a371f7")


def _nice_max(value: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    magnitude = 1.0
    while magnitude * 10 <= value:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _fmt(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def line_chart(
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    width: int = 560,
    height: int = 160,
    unit: str = "",
    title: str = "",
    times: Sequence[datetime] = (),
) -> str:
    """Lines over a shared x axis (one point per sample, oldest left), with a legend.

    ``times``: the moment of each sample (as many as the longest series); the x axis is then
    labelled with clock times (UTC, ``HH:MM``, ``HH:MM:SS`` when the span is under 5 minutes).
    """
    left, right, top, bottom = 44, 8, 22, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    count = max((len(values) for _, values in series), default=0)
    peak = _nice_max(max((max(values, default=0.0) for _, values in series), default=0.0))
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="13" class="chart-title">{escape(title)}</text>',
    ]
    for i in range(5):
        y = top + plot_h * i / 4
        label = _fmt(peak * (4 - i) / 4)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{left - 4}" y="{y + 3:.1f}" class="axis" text-anchor="end">'
            f"{escape(label)}{escape(unit)}</text>"
        )
    if count >= 2 and len(times) == count:
        parts.extend(_time_axis(times, left, plot_w, top + plot_h))
    if count < 2:
        parts.append(
            f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h / 2:.0f}" '
            'class="axis" text-anchor="middle">collecting samples…</text>'
        )
    legend_x = width - right
    for index, (name, values) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        if len(values) >= 2:
            step = plot_w / (count - 1)
            offset = count - len(values)
            points = " ".join(
                f"{left + (offset + i) * step:.1f},{top + plot_h * (1 - v / peak):.1f}"
                for i, v in enumerate(values)
            )
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{points}"/>'
            )
        label = escape(name)
        legend_x -= 8 + 7 * len(name)
        parts.append(
            f'<rect x="{legend_x}" y="5" width="8" height="8" fill="{color}"/>'
            f'<text x="{legend_x + 11}" y="13" class="legend">{label}</text>'
        )
        legend_x -= 14
    parts.append("</svg>")
    return "".join(parts)


def _time_axis(times: Sequence[datetime], left: int, plot_w: float, base: float) -> list[str]:
    """Up to five clock-time labels under the plot, at evenly spaced samples."""
    span = (times[-1] - times[0]).total_seconds()
    fmt = "%H:%M:%S" if span < 300 else "%H:%M"
    last = len(times) - 1
    marks = sorted({round(last * i / 4) for i in range(5)})
    parts = []
    for index in marks:
        x = left + plot_w * index / last
        anchor = "start" if index == 0 else "end" if index == last else "middle"
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base:.1f}" y2="{base + 3:.1f}" class="grid"/>'
            f'<text x="{x:.1f}" y="{base + 13:.1f}" class="axis" text-anchor="{anchor}">'
            f"{escape(times[index].strftime(fmt))}</text>"
        )
    return parts


def bar_chart(
    bars: Sequence[tuple[str, float]], *, width: int = 560, bar_h: int = 16, title: str = ""
) -> str:
    """Horizontal bars, one per (label, value), largest scale at the top value."""
    label_w, top = 170, 22
    height = top + max(1, len(bars)) * (bar_h + 4) + 4
    peak = max((v for _, v in bars), default=0.0) or 1.0
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="13" class="chart-title">{escape(title)}</text>',
    ]
    if not bars:
        parts.append(f'<text x="0" y="{top + 12}" class="axis">nothing yet</text>')
    for i, (label, value) in enumerate(bars):
        y = top + i * (bar_h + 4)
        w = (width - label_w - 60) * value / peak
        short = label if len(label) <= 26 else label[:25] + "…"
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 4}" class="axis" text-anchor="end">'
            f"{escape(short)}</text>"
            f'<rect x="{label_w}" y="{y}" width="{max(w, 1):.1f}" height="{bar_h}" '
            f'fill="{PALETTE[0]}" rx="2"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 4}" class="axis">'
            f"{escape(_fmt(value))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)

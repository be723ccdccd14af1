#!/usr/bin/env python3
"""Renders the plots of the results page from docs/src/results/figures.json as SVG files
beside it, with no plotting library: `python3 scripts/plots.py` writes them, and
`python3 scripts/plots.py --check` fails when a file differs from what the figures
render (scripts/check_docs.py runs the check)."""

import json
import sys
from html import escape
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "src" / "results"
COLOURS = ["#3b6ea5", "#d08a2e", "#5b9e5b", "#8a5ba5", "#a55b5b"]
WIDTH = 720


def text(x, y, words, size=12, anchor="start", weight="normal", fill="#222"):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}">{escape(str(words))}</text>')


def svg(height, parts):
    body = "\n".join(parts)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">\n'
            f'<rect width="{WIDTH}" height="{height}" fill="white"/>\n{body}\n</svg>\n')


def legend(names, left, height):
    """A colour key along the bottom of a plot, one entry per name."""
    parts, x = [], left
    for number, name in enumerate(names):
        parts.append(f'<rect x="{x}" y="{height - 28}" width="12" height="12" '
                     f'fill="{COLOURS[number % len(COLOURS)]}"/>')
        parts.append(text(x + 16, height - 18, name, 12))
        x += 28 + 7 * len(name)
    return parts


def grouped_bars(plot):
    """Vertical bars: one group per category, one bar per series (missing values left out)."""
    categories, series = plot["categories"], plot["series"]
    top = max(value for one in series for value in one["values"] if value is not None)
    left, right, head, foot = 60, 20, 50, 70
    height = 360
    inner_w, inner_h = WIDTH - left - right, height - head - foot
    parts = [text(WIDTH / 2, 24, plot["title"], 15, "middle", "bold")]
    steps = 5
    for step in range(steps + 1):
        value = top * step / steps
        y = head + inner_h - inner_h * step / steps
        parts.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(text(left - 6, y + 4, f"{value:.{plot.get('decimals', 0)}f}", 11, "end", fill="#555"))
    parts.append(text(16, head + inner_h / 2, plot["unit"], 12, "middle", fill="#555").replace(
        "<text ", f'<text transform="rotate(-90 16 {head + inner_h / 2:.1f})" ', 1))
    group_w = inner_w / len(categories)
    bar_w = group_w * 0.8 / len(series)
    for index, category in enumerate(categories):
        x0 = left + group_w * index + group_w * 0.1
        parts.append(text(left + group_w * (index + 0.5), head + inner_h + 18, category, 12, "middle"))
        for number, one in enumerate(series):
            value = one["values"][index]
            if value is None:
                continue
            bar_h = inner_h * value / top
            x = x0 + bar_w * number
            y = head + inner_h - bar_h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{bar_h:.1f}" '
                         f'fill="{COLOURS[number % len(COLOURS)]}"/>')
            parts.append(text(x + (bar_w - 2) / 2, y - 4, f"{value:g}", 10, "middle", fill="#333"))
    parts.extend(legend([one["name"] for one in series], left, height))
    return svg(height, parts)


def horizontal_bars(plot):
    """One horizontal bar per row, coloured by its group."""
    rows = plot["rows"]
    groups = list(dict.fromkeys(row["group"] for row in rows))
    left, right, head, row_h = 290, 60, 50, 26
    height = head + row_h * len(rows) + 50
    inner_w = WIDTH - left - right
    top = plot.get("max") or max(row["value"] for row in rows)
    parts = [text(WIDTH / 2, 24, plot["title"], 15, "middle", "bold")]
    for index, row in enumerate(rows):
        y = head + row_h * index
        width = inner_w * row["value"] / top
        colour = COLOURS[groups.index(row["group"]) % len(COLOURS)]
        parts.append(text(left - 8, y + 16, row["name"], 12, "end"))
        parts.append(f'<rect x="{left}" y="{y + 4:.1f}" width="{width:.1f}" height="{row_h - 8}" fill="{colour}"/>')
        parts.append(text(left + width + 6, y + 17, f"{row['value']:.3f}", 11, fill="#333"))
    parts.extend(legend(groups, left, height))
    return svg(height, parts)


def render():
    figures = json.loads((RESULTS / "figures.json").read_text())
    drawn = {}
    for name, plot in figures.items():
        kind = plot["kind"]
        drawn[f"{name}.svg"] = grouped_bars(plot) if kind == "grouped-bars" else horizontal_bars(plot)
    return drawn


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for name, content in render().items():
        path = RESULTS / name
        if check:
            if not path.exists() or path.read_text() != content:
                stale.append(name)
        else:
            path.write_text(content)
    if stale:
        sys.exit(f"plots: {', '.join(stale)} differ from docs/src/results/figures.json; run python3 scripts/plots.py")
    print(f"plots: {len(render())} {'checked' if check else 'written'}")


if __name__ == "__main__":
    main()

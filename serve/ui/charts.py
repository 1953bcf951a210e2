"""Charts as plain geometry for an inline SVG (drawn by the templates: no script, no CDN): bars,
and steps (a count over time)."""

from __future__ import annotations

WIDTH, HEIGHT, GAP = 640, 160, 6


def bars(points: list[tuple[str, float | None]]) -> dict:
    """x, width, y and height for each (label, value); missing values draw no bar. Negative
    values (rewards can be) hang below a zero line."""
    values = [v for _, v in points if v is not None]
    top, bottom = max(values + [0.0]), min(values + [0.0])
    span = (top - bottom) or 1.0
    zero = HEIGHT * top / span
    step = WIDTH / max(len(points), 1)
    out = []
    for i, (label, value) in enumerate(points):
        h = 0.0 if value is None else HEIGHT * abs(value) / span
        y = zero - h if (value or 0) >= 0 else zero
        out.append(
            {
                "label": label,
                "value": value,
                "x": round(i * step + GAP / 2, 1),
                "w": round(max(step - GAP, 1), 1),
                "y": round(y, 1),
                "h": round(h, 1),
            }
        )
    return {"bars": out, "width": WIDTH, "height": HEIGHT, "zero": round(zero, 1)}


def steps(history: list[tuple[float, int, int]], now: float, top: int) -> dict:
    """Two step lines over time, from the first point to ``now``: the desired and the ready
    replicas of a deployment (``history``: (unix time, desired, ready) at each change), y from 0
    to ``top``."""
    start = history[0][0] if history else now
    span, top = max(now - start, 1.0), max([top, 1] + [max(p[1], p[2]) for p in history])

    def line(column: int) -> str:
        points: list[str] = []
        for i, point in enumerate(history):
            x, y = WIDTH * (point[0] - start) / span, HEIGHT * (1 - point[column] / top)
            if i:  # hold the previous count until this change
                points.append(f"{x:.1f},{points[-1].split(',')[1]}")
            points.append(f"{x:.1f},{y:.1f}")
        if points:
            points.append(f"{WIDTH:.1f},{points[-1].split(',')[1]}")
        return " ".join(points)

    return {"width": WIDTH, "height": HEIGHT, "desired": line(1), "ready": line(2), "top": top, "minutes": span / 60}

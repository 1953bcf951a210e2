"""Bar charts as plain geometry for an inline SVG (drawn by the templates: no script, no CDN)."""

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

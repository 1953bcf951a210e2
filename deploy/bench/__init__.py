"""Benchmarks; each prints its figures measured side by side in one run."""


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank below), NaN for no samples."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

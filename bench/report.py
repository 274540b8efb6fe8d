"""Percentiles and a plain-text table."""

from __future__ import annotations

import statistics


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(samples_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(samples_ms),
        "p50": percentile(samples_ms, 50),
        "p90": percentile(samples_ms, 90),
        "p99": percentile(samples_ms, 99),
        "max": max(samples_ms),
        "mean": statistics.fmean(samples_ms),
    }


def print_table(title: str, rows: list[dict], columns: list[str]) -> None:
    print(f"\n{title}")
    widths = {c: max([len(c), *(len(_fmt(r.get(c))) for r in rows)]) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(widths[c]) for c in columns))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None else str(value)

"""The demand forecast's method (app/jobs/forecast.py), on counts of arrivals by minute."""

from __future__ import annotations

import pytest

from app.jobs.forecast import DAY, WEEK, Horizon, forecast_rate, lags

NOW = 30_000_000  # an epoch minute


def _burst(counts: dict, start: int, minutes: int, per_minute: float) -> dict:
    for m in range(start, start + minutes):
        counts[m] = counts.get(m, 0) + per_minute
    return counts


def test_history_chooses_weeks_then_days_then_none():
    assert lags(5 * WEEK) == [WEEK, 2 * WEEK, 3 * WEEK, 4 * WEEK]
    assert lags(WEEK + 5) == [WEEK]
    assert lags(3 * DAY + 1) == [DAY, 2 * DAY, 3 * DAY]
    assert lags(DAY - 1) == []


def test_a_burst_seen_last_week_is_forecast_before_it_starts():
    history = _burst({}, NOW + 8 - WEEK, 20, 24.0)  # 24 a minute, 8 minutes from now
    # The busiest 5 minutes starting within 10: the burst's first 5.
    assert forecast_rate(history, NOW, [WEEK]) == pytest.approx(24.0)
    assert forecast_rate(history, NOW - 5, [WEEK]) == pytest.approx(24.0 * 2 / 5)  # 2 of 5
    # Beyond the lookahead, not yet.
    assert forecast_rate(history, NOW - 10, [WEEK]) == 0.0
    assert forecast_rate(history, NOW - 10, [WEEK], Horizon(lookahead=20)) > 0


def test_the_seasonal_rate_is_the_mean_over_the_weeks():
    history = _burst({}, NOW - WEEK, 10, 10.0)
    _burst(history, NOW - 2 * WEEK, 10, 20.0)
    assert forecast_rate(history, NOW, [WEEK, 2 * WEEK]) == pytest.approx(15.0)


@pytest.mark.parametrize(("recent", "level"), [(4.0, 2.0), (2.0, 1.0), (1.5, 0.75), (0.1, 0.5)])
def test_this_weeks_level_scales_the_seasonal_clamped_to_half_and_double(recent, level):
    history = _burst({}, NOW - 30 - WEEK, 40, 2.0)  # the usual: 2 a minute
    _burst(history, NOW - 30, 30, recent)
    assert forecast_rate(history, NOW, [WEEK]) == pytest.approx(2.0 * level)


def test_without_history_the_forecast_is_the_last_minutes_rate():
    counts = _burst({}, NOW - 5, 5, 3.0)
    assert forecast_rate(counts, NOW, []) == pytest.approx(3.0)
    assert forecast_rate({}, NOW, []) == 0.0

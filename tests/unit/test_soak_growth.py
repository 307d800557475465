"""How the soak judges growth: per process, after warm-up, a restart counting as unbounded."""

from __future__ import annotations

from loadtests import soak


def test_growth_is_measured_against_the_first_sample_after_warm_up() -> None:
    samples = [
        {"t": 0, "processes": {"1 w": {"rss_mb": 100.0, "fds": 10}}},
        {"t": 20, "processes": {"1 w": {"rss_mb": 200.0, "fds": 20}}},  # the baseline
        {"t": 30, "processes": {"1 w": {"rss_mb": 230.0, "fds": 20}}},
        {"t": 40, "processes": {"2 w": {"rss_mb": 200.0, "fds": 20}}},  # 1 gone, 2 new: restarted
    ]
    grown = soak.growth(samples, warmup_s=20)
    assert grown["1 w"]["rss_mb"] == float("inf") and grown["2 w"]["fds"] == float("inf")
    grown = soak.growth(samples[:3], warmup_s=20)
    assert grown == {"1 w": {"rss_mb": 0.15, "fds": 0.0}}

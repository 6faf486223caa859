"""weighted_median: a bucket's value counted once per step equals the median over the steps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.detectors.stats import median, weighted_median

_values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(st.tuples(_values, st.integers(min_value=1, max_value=6)), min_size=1, max_size=30))
def test_integer_weights_give_the_median_of_the_values_repeated(pairs: list[tuple[float, int]]) -> None:
    expanded = [v for v, w in pairs for _ in range(w)]
    assert weighted_median(pairs) == median(expanded)


def test_a_window_of_slow_and_normal_buckets_takes_the_steps_majority() -> None:
    # 6 slow buckets of 3 steps and 6 normal ones of 5: the steps are mostly normal.
    pairs = [(46_811.0, 3)] * 6 + [(65_536.0, 5)] * 6
    assert weighted_median(pairs) == 65_536.0
    assert median([v for v, _ in pairs]) == (46_811.0 + 65_536.0) / 2  # bucket-weighted: neither


def test_nothing_finite_or_weighted_is_none() -> None:
    assert weighted_median([]) is None
    assert weighted_median([(float("nan"), 3), (None, 2), (1.0, 0)]) is None

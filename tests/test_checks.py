"""fedlab._checks: the argument checks raise a ValueError that names the argument."""
import pytest


def test_argument_checks_name_the_argument():
    from fedlab._checks import in_range, positive_int

    assert positive_int("n", 3) == 3 and positive_int("n", 3.0) == 3 and isinstance(positive_int("n", 3.0), int)
    for bad in (0, -2, 2.5, True, float("nan"), float("inf"), None, "3"):
        with pytest.raises(ValueError, match="num_rounds must be a positive integer"):
            positive_int("num_rounds", bad)
    assert in_range("delta", 0.5, 0.0, 1.0) == 0.5
    assert in_range("f", 0.0, 0.0, 1.0, low_closed=True) == 0.0 and in_range("f", 1, 0, 1, high_closed=True) == 1.0
    for bad in (0.0, 1.0, float("nan"), -3):
        with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
            in_range("delta", bad, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"f must be in \[0, 1\]"):
        in_range("f", 1.5, 0, 1, low_closed=True, high_closed=True)


def test_finite_real_refuses_infinities_nan_strings_bools_and_values_below_low():
    import math

    import numpy as np

    from fedlab._checks import finite_real

    assert finite_real("w", 0) == 0.0 and finite_real("m", -2.5) == -2.5 and finite_real("w", np.float32(0.5), 0) == 0.5
    for bad in (math.inf, -math.inf, math.nan, "0.1", True, None):
        with pytest.raises(ValueError, match="tv_weight must be a finite number"):
            finite_real("tv_weight", bad)
    with pytest.raises(ValueError, match="tv_weight must be a finite number >= 0"):
        finite_real("tv_weight", -0.1, 0)

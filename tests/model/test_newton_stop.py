"""When the MAP search's Newton stops (``pymc_bigdata/model/newton_stop.py``)."""

from __future__ import annotations

import numpy as np

from pymc_bigdata.model.newton_stop import predicted_decrement


def test_the_search_s_last_step_is_predicted_from_the_one_before():
    """Quadratic convergence: a decrement of 0.033 reached from 388 predicts 2.4e-10 after
    the next step (the 10^6-row, d = 30 search, where a pass then read 1.6e-9); nothing is
    predicted from a first pass. Caught: the ratio's exponents swapped."""
    assert np.isclose(predicted_decrement(388.0, 0.0328), 2.34e-10, rtol=0.01)
    assert predicted_decrement(np.inf, 1e-6) == np.inf

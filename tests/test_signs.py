"""Sign correction of signed HMC-ECS draws (Dang et al. 2019, Eq. 5.3), on constructed draws.

``E_pi[psi] = E[psi S] / E[S]`` over draws of ``|L_hat| p``: the tests compute it with numpy
from the draws and signs, independently of :mod:`pymc_bigdata.signs`, for a vector variable
over two chains. (The step method's own use is in ``tests/step_methods/test_hmcecs.py``.)
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pytest

from pymc_bigdata.signs import sign_corrected_summary, sign_weights


def _signed_draws(seed: int = 0):
    """Two chains of 50 draws of a 2-vector ``beta`` and a scalar ``s``, a fifth of the
    signs negative, and the same as flat arrays."""
    rng = np.random.default_rng(seed)
    beta = rng.normal([1.0, -2.0], [0.5, 2.0], size=(2, 50, 2))
    scalar = rng.gamma(2.0, size=(2, 50))
    signs = np.where(rng.uniform(size=(2, 50)) < 0.2, -1, 1)
    idata = az.from_dict(
        {
            "posterior": {"beta": beta, "s": scalar},
            "sample_stats": {"sign": signs},
        }
    )
    return idata, beta.reshape(-1, 2), scalar.ravel(), signs.ravel().astype(float)


def test_sign_weights_are_the_signs_over_their_sum():
    """``w_j = s_j / sum s`` over every chain and draw. Catches weights normalised by the
    number of draws (or by ``sum |s|``), and signs dropped."""
    idata, _, _, signs = _signed_draws()
    weights = sign_weights(idata)
    assert weights.dims == ("chain", "draw")
    np.testing.assert_allclose(weights.values.ravel(), signs / signs.sum(), rtol=1e-12)
    assert float(weights.sum()) == pytest.approx(1.0)


def test_sign_corrected_summary_is_eq_5_3():
    """Means ``sum s psi / sum s``, sds ``sqrt(sum s psi^2 / sum s - mean^2)``, the share of
    negative signs and ``(mean sign)^2`` for every coordinate, labelled like ``az.summary``.
    Catches plain (unsigned) averages, a second moment without the signs, and mislabelled
    coordinates."""
    idata, beta, scalar, signs = _signed_draws()
    summary = sign_corrected_summary(idata)
    assert list(summary.index) == ["beta[0]", "beta[1]", "s"]
    for label, values in [("beta[0]", beta[:, 0]), ("beta[1]", beta[:, 1]), ("s", scalar)]:
        mean = np.sum(signs * values) / signs.sum()
        sd = np.sqrt(np.sum(signs * values**2) / signs.sum() - mean**2)
        assert summary.loc[label, "mean"] == pytest.approx(mean, rel=1e-12)
        assert summary.loc[label, "sd"] == pytest.approx(sd, rel=1e-12)
        assert summary.loc[label, "negative_fraction"] == pytest.approx(np.mean(signs < 0))
        assert summary.loc[label, "ess_factor"] == pytest.approx(np.mean(signs) ** 2)
    plain = beta.mean(axis=0)
    assert np.all(np.abs(summary.loc[["beta[0]", "beta[1]"], "mean"].values - plain) > 1e-3)


def test_signs_that_do_not_sum_to_a_positive_number_are_refused():
    """Half or more of the estimates negative: no sign-corrected estimate exists."""
    idata = az.from_dict(
        {"posterior": {"x": np.ones((1, 4))}, "sample_stats": {"sign": np.array([[1, -1, -1, 1]])}}
    )
    with pytest.raises(ValueError, match="signs sum to 0"):
        sign_weights(idata)

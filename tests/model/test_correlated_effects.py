"""Reading correlated group effects from a model's graph
(``pymc_bigdata/model/correlated_effects.py``).

What each test proves (and the one-line mutation of the package it was seen to fail on):

* the primer's form ``mu + pt.dot(chol, z).T`` is found with its slots: ``z``'s, ``mu``'s,
  the packed factor's, where each packed entry sits in ``L`` and which are logs; so are
  ``(chol @ z).T`` with no ``mu`` and a factor built by ``pm.expand_packed_triangular``;
* nothing is reported where the map would be wrong: ``z`` also read elsewhere, ``z`` not
  standard normal, an upper-triangular factor, a factor that is not a packed Cholesky
  factor, centred or not;
* a centred ``pm.MvNormal`` of the effects with a packed Cholesky factor is found, with its
  own layout.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_bigdata.model.correlated_effects import find_correlated_effects

N_GROUPS = 5
GROUP = np.repeat(np.arange(N_GROUPS), 4)
X = np.linspace(-1.0, 1.0, GROUP.size)
Y = np.sin(np.arange(GROUP.size))


def _factor(variant: str):
    """The Cholesky factor (inside a model): ``LKJCholeskyCov``'s, or as ``variant`` says."""
    compute_corr = variant not in ("expand", "upper")
    out = pm.LKJCholeskyCov(
        "chol", n=2, eta=2.0, sd_dist=pm.HalfNormal.dist(1.0), compute_corr=compute_corr
    )
    if variant == "expand":
        return pm.expand_packed_triangular(2, out)
    if variant == "upper":  # the same packed value placed above the diagonal: L' z, not L z
        return pm.expand_packed_triangular(2, out, lower=False)
    if variant == "diagonal":
        return pt.diag(pm.HalfNormal("sds", 1.0, shape=2))
    return out[0]


def _model(variant: str = "primer") -> pm.Model:
    """Correlated intercepts and slopes, the effects written as ``variant`` says."""
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0, shape=2)
        chol = _factor(variant.removeprefix("centred_"))
        z = pm.Normal("z", 0.0, 2.0 if variant == "wide_z" else 1.0, shape=(2, N_GROUPS))
        if variant == "no_mu":
            ab = pm.Deterministic("ab", (chol @ z).T)
            mean = mu[0] + ab[GROUP, 0] + (mu[1] + ab[GROUP, 1]) * X
        elif variant.startswith("centred"):
            ab = pm.MvNormal("ab", mu, chol=chol, shape=(N_GROUPS, 2))
            mean = ab[GROUP, 0] + ab[GROUP, 1] * X
        else:
            ab = pm.Deterministic("ab", mu + pt.dot(chol, z).T)
            mean = ab[GROUP, 0] + ab[GROUP, 1] * X
        if variant == "z_read_twice":
            pm.Potential("extra", -pt.sum(z**4))
        pm.Normal("y", mean, 1.0, observed=Y)
    return model


def test_primer_form_is_found_with_its_slots():
    """Mutation: ``loc_slice=loc if isinstance(loc, slice) else None`` -> ``None`` (``mu``
    not read: the centring would be about 0)."""
    model = _model("primer")
    [effect] = find_correlated_effects(model)
    names = [v.name for v in model.value_vars]
    assert names == ["mu", "chol_cholesky-cov-packed__", "z"]
    assert effect.name == "ab" and effect.effect == "z"
    assert effect.effect_slice == slice(5, 5 + 2 * N_GROUPS)
    assert (effect.n_effects, effect.n_groups) == (2, N_GROUPS)
    assert effect.loc_slice == slice(0, 2)
    assert effect.scale_slice == slice(2, 5)
    np.testing.assert_array_equal(effect.rows, [0, 1, 1])
    np.testing.assert_array_equal(effect.cols, [0, 0, 1])
    np.testing.assert_array_equal(effect.log_entries, [0, 2])


@pytest.mark.parametrize("variant", ["no_mu", "expand"])
def test_other_spellings_are_found(variant):
    """``(chol @ z).T`` (a ``Blockwise`` product) with no ``mu``, and a factor from
    ``pm.expand_packed_triangular``. Mutation: ``op = inner.op`` (no ``core_op`` of a
    ``Blockwise``): ``no_mu`` is not found."""
    [effect] = find_correlated_effects(_model(variant))
    if variant == "no_mu":
        assert effect.loc_slice is None
        np.testing.assert_array_equal(effect.loc_value, [0.0, 0.0])
    else:
        assert effect.loc_slice == slice(0, 2)


def test_centred_form_is_found_with_its_slots():
    """``ab ~ MvNormal(mu, chol=L)`` of shape ``(J, K)``: its own slots, row-major ``(J,
    K)``, read through :meth:`~CorrelatedEffect.matrix` as ``(K, J)``. Mutation: the scan
    of ``model.free_RVs`` for it removed (nothing found)."""
    model = _model("centred")
    [effect] = find_correlated_effects(model)
    assert effect.centred and effect.model_centredness == 1.0
    assert effect.name == "ab" and effect.effect == "ab"
    start = 5 + 2 * N_GROUPS  # after the unused z of _model
    assert effect.effect_slice == slice(start, start + 2 * N_GROUPS)
    assert effect.loc_slice == slice(0, 2) and effect.scale_slice == slice(2, 5)
    np.testing.assert_array_equal(effect.log_entries, [0, 2])
    x = np.arange(start + 2 * N_GROUPS, dtype=np.float64)
    ab = x[effect.effect_slice].reshape(N_GROUPS, 2)
    np.testing.assert_array_equal(effect.matrix(x), ab.T)
    expected = np.where(np.arange(x.size) >= start, x, 0.0)
    np.testing.assert_array_equal(effect.with_matrix(np.zeros_like(x), ab.T), expected)


@pytest.mark.parametrize(
    "variant", ["z_read_twice", "wide_z", "upper", "diagonal", "centred_upper", "centred_diagonal"]
)
def test_nothing_is_reported_where_the_map_would_be_wrong(variant):
    """Mutations: the ``other_uses`` check removed (``z_read_twice`` found), ``np.any(sigma
    != 1.0)`` dropped (``wide_z`` found), ``np.all(rows >= cols)`` dropped (``upper`` and
    ``centred_upper`` found)."""
    assert find_correlated_effects(_model(variant)) == []

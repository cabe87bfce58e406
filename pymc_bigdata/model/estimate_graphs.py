"""HMC-ECS's whole estimate at ``z`` as one graph: one compiled call per leapfrog evaluation.

The readable reference is a chain of small steps: ``theta = c + L z``, the residuals and the
gradient of the estimator's random part (:class:`~.difference_terms.DifferenceTerms`), the
control variates' full-data sum (:func:`~.difference_terms.control_variate_sum`), the
estimator itself in numpy (:func:`~pymc_bigdata.kernels.hmcecs.perturbed_loglik`,
:func:`~pymc_bigdata.kernels.hmcecs.block_poisson_log_abs`) and ``grad_z = L' grad_theta``.
Each is a few microseconds of Python around a ~17 µs compiled call at 100 rows, so an
evaluation took ~43 µs (benchmark model, d = 30, one-off ``timeit``). The graph below computes
the same quantities, in the same formulas, inside one compiled function (~20 µs):

* perturbed (Eqs. 4.1-4.5): ``log L_hat = sum q + sum_census d + w sum d - sigma_hat^2 / 2``
  with ``w = P/m``, ``sigma_hat^2 = (P/m)^2 sum (d - mean d)^2``;
* signed (Eq. 5.1): ``log |L_hat| = sum q + sum_census d + a + lambda + sum_g log |D_g - a|
  - G log lambda`` with ``D_g = (P/m) sum_{i in g} d_i`` over the ``G`` minibatches, the
  number of negative factors (the sign), the factor nearest zero and ``sum (d - mean d)^2``;

and the log prior, ``sum q = l(theta*) + A . Delta + 1/2 Delta' B Delta`` (``Delta`` in the
expansion's coordinates), and the gradient in ``z`` of the log posterior estimate.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.basic import Variable
from pytensor.graph.replace import graph_replace

__all__ = ["ESTIMATORS", "estimate_graph"]

#: the estimators with a fused graph
ESTIMATORS = ("perturbed", "signed")


def estimate_graph(
    estimator: str,
    order: int,
    dense: bool,
    residuals: Variable,
    prior: Variable,
    theta: Variable,
    anchor: Variable,
    coordinates: Callable[[Variable], Variable],
) -> tuple[list[Variable], list[Variable], list[Variable]]:
    """The fused estimate's graph.

    Parameters
    ----------
    estimator
        ``"perturbed"`` or ``"signed"``.
    order
        The control variates' Taylor order (0, 1 or 2).
    dense
        Whether ``L`` is a dense matrix (else its diagonal).
    residuals, prior
        The per-row residuals ``d_k`` and the log prior, graphs of ``theta``.
    theta, anchor
        The parameter vector and the anchor ``theta*`` (symbolic inputs of those graphs).
    coordinates
        The expansion's coordinates at a parameter graph (``theta`` itself or ``phi``).

    Returns
    -------
    inputs_before_rows, inputs_after_rows, outputs
        Inputs ``[z, c, L]`` (``theta`` replaced by ``c + L z``; then the anchor, the
        curvature point and the rows follow, as the caller's residual graph reads them),
        inputs ``[n_census, l0, A, B, <estimator's>]`` and outputs. Perturbed: ``w, v``;
        outputs ``[logp, grad_z, sigma2, total]``. Signed: ``w, m, a, lambda``; outputs
        ``[logp, grad_z, negatives, nearest, sum_sq, total]`` (``total = sum d`` over the
        sampled rows).
    """
    z = pt.vector("z", dtype="float64")
    center = pt.vector("center", dtype="float64")
    transform = pt.matrix("transform", dtype="float64") if dense else pt.vector("scale")
    point = center + (transform @ z if dense else transform * z)
    d, log_prior = graph_replace([residuals, prior], {theta: point}, strict=False)
    census = pt.scalar("n_census", dtype="int64")
    l0, a_sum = pt.scalar("l0", dtype="float64"), pt.vector("A", dtype="float64")
    b_sum = pt.matrix("B", dtype="float64")
    delta = coordinates(point) - coordinates(anchor)
    known = l0 + (a_sum @ delta if order >= 1 else 0.0)
    if order >= 2:
        known = known + 0.5 * delta @ (b_sum @ delta)
    known = known + d[:census].sum()
    sampled = d[census:]
    total = sampled.sum()
    spread = ((sampled - total / pt.maximum(sampled.shape[0], 1)) ** 2).sum()
    if estimator == "perturbed":
        w, v = pt.scalar("w", dtype="float64"), pt.scalar("v", dtype="float64")
        sigma2 = v * spread
        logp = log_prior + known + w * total - 0.5 * sigma2
        extra, outputs = [w, v], [sigma2, total]
    elif estimator == "signed":
        w, m = pt.scalar("w", dtype="float64"), pt.scalar("m", dtype="int64")
        bound, products = pt.scalar("a", dtype="float64"), pt.scalar("lam", dtype="float64")
        shifted = w * sampled.reshape((-1, m)).sum(axis=1) - bound
        log_abs = pt.log(pt.abs(shifted)).sum() - shifted.shape[0] * pt.log(products)
        logp = log_prior + known + bound + products + log_abs
        negatives = (shifted < 0).sum()
        nearest = pt.concatenate([pt.abs(shifted), pt.as_tensor([np.inf])]).min() / products
        extra, outputs = [w, m, bound, products], [negatives, nearest, spread, total]
    else:  # pragma: no cover - internal
        raise ValueError(estimator)
    return (
        [z, center, transform],
        [census, l0, a_sum, b_sum, *extra],
        [logp, grad(logp, z), *outputs],
    )

"""Sign correction of signed HMC-ECS draws (Dang et al. 2019, Eq. 5.3; Lyne et al. 2015).

Signed HMC-ECS targets ``|L_hat(theta)| p(theta)``; the posterior expectation of any
``psi(theta)`` is ``E[psi S] / E[S]`` with ``S`` the sign of the likelihood estimate at each
draw (the sampler statistic ``sign``).  :func:`sign_weights` gives the normalised weights
``s_j / sum_j s_j`` over all chains and draws; :func:`sign_corrected_summary` applies them to
the posterior's variables.  With perturbed HMC-ECS (or any draw whose signs are all +1) both
reduce to plain averages.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

__all__ = ["sign_corrected_summary", "sign_weights"]


def _signs(idata) -> xr.DataArray:
    try:
        return idata["sample_stats"]["sign"]
    except KeyError as exc:
        raise ValueError(
            "The result has no sample_stats 'sign': it was not sampled by pmbd.HMCECS."
        ) from exc


def sign_weights(idata) -> xr.DataArray:
    """Normalised sign weights ``s_j / sum s`` over (chain, draw), for ``E[psi] = sum w psi``.

    Parameters
    ----------
    idata
        The result of ``pm.sample(step=pmbd.HMCECS(estimator="signed"))``.

    Returns
    -------
    xarray.DataArray with dims (chain, draw), summing to 1 (some weights negative).

    Raises
    ------
    ValueError
        When the result has no ``sign`` statistic, or the signs sum to zero or less (half
        or more of the estimates negative: no sign-corrected estimate exists).
    """
    signs = _signs(idata).astype(np.float64)
    total = float(signs.sum())
    if not total > 0:
        negative = float((signs < 0).mean())
        raise ValueError(
            f"{negative:.0%} of the likelihood estimates are negative: the signs sum to "
            f"{total:g}, so the sign-corrected estimates are undefined. Resample with more "
            "products (lambda) or better control variates."
        )
    return signs / total


def sign_corrected_summary(idata, var_names: list[str] | None = None) -> pd.DataFrame:
    """Sign-corrected posterior means and sds of every coordinate (Eq. 5.3).

    ``mean = sum_j w_j psi_j`` and ``sd = sqrt(sum_j w_j psi_j^2 - mean^2)`` with ``w`` from
    :func:`sign_weights`; ``negative_fraction`` is the share of negative signs and
    ``ess_factor = (mean sign)^2`` the factor (5.4) by which the signs shrink the effective
    sample size.

    Returns
    -------
    pandas.DataFrame indexed like ``az.summary`` (``beta[0]``, ...).
    """
    weights = sign_weights(idata)
    signs = _signs(idata)
    posterior = idata["posterior"]
    names = var_names if var_names is not None else list(posterior.data_vars)
    negative = float((signs < 0).mean())
    ess_factor = float(signs.mean()) ** 2
    rows, index = [], []
    for name in names:
        values = posterior[name]
        mean = (values * weights).sum(("chain", "draw"))
        second = (values * values * weights).sum(("chain", "draw"))
        flat_mean = np.ravel(mean.values)
        flat_sd = np.sqrt(np.maximum(np.ravel(second.values) - flat_mean**2, 0.0))
        labels = _labels(name, mean)
        for label, m, s in zip(labels, flat_mean, flat_sd):
            index.append(label)
            rows.append((m, s, negative, ess_factor))
    return pd.DataFrame(
        rows, index=index, columns=["mean", "sd", "negative_fraction", "ess_factor"]
    )


def _labels(name: str, values: xr.DataArray) -> list[str]:
    if values.ndim == 0:
        return [name]
    coords = [
        values[d].values if d in values.coords else np.arange(n) for d, n in values.sizes.items()
    ]
    labels = []
    for position in np.ndindex(*values.shape):
        parts = [str(coords[k][i]) for k, i in enumerate(position)]
        labels.append(f"{name}[{', '.join(parts)}]")
    return labels

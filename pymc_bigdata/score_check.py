"""A full-data check of posterior draws after sampling, by the score's Stein identities.

Every posterior ``p(theta)`` on the unconstrained space (smooth, with tails that vanish)
satisfies, for the score ``g(theta) = grad log p(theta)`` (full data, prior and Jacobian):

* ``E[g] = 0`` (Stein's identity with a constant test function), and
* ``E[g^T (theta - a)] = -d`` for any fixed ``a`` (with ``f(theta) = theta - a``: the virial,
  whose minibatch version the samplers watch while sampling), and per coordinate
  ``E[g_j (theta_j - a_j)] = -1``.

:func:`score_check` evaluates the exact score at a few dozen thinned draws of a result (one
streamed pass over the rows each) and tests two of them, reporting a third:

1. **mean score** -- ``Q = |sum_i s_i|^2`` with ``s_i = sd * g(theta_i)`` (the score scaled by
   the draws' sds), against its law under random sign flips of the ``s_i`` (exact for
   independent draws whose scores are symmetric about 0, whatever their correlation across
   coordinates): draws off-centre along directions the data pin down;
2. **virial** -- ``w_i = g(theta_i)^T (theta_i - theta_bar) + d`` has mean 0; a t-test. Its
   ratio ``-mean(g^T (theta - theta_bar)) / d`` is 1 at the target and about the draws'
   variance ratio off it (``c^2`` for draws ``c`` times too wide): heat spread over many
   coordinates, each too little to see alone;
3. **per coordinate**, reported, not tested -- t-tests of ``E[g_j] = 0`` and
   ``E[g_j (theta_j - theta_bar_j)] = -1``, Bonferroni over the ``2 d`` tests, name the
   coordinate that looks worst. They do not flag: where the data tie a coordinate to others
   (a non-centred group effect and its scale) the products ``g_j (theta_j - theta_bar_j)``
   are heavy-tailed, and a t-test's p-value at the Bonferroni level is then far too small
   (SBPS on the non-centred hierarchy, in band: 2e-4 for ``z[1]``). The virial is the same
   sum in every linear coordinate system (``g^T (theta - theta_bar)``), and the sign flips
   need no tail assumption.

The draws are thinned to at most the smallest bulk ESS over the coordinates, so that they are
nearly independent (the tests assume it); ``theta_bar`` and the sds come from all draws. The
result flags the draws as off their target when a p-value falls below ``level / 2``. Its
power is limited by the few draws it reads: see ``docs/score_check.md`` for what it catches
and what it cannot see.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import scipy.stats
from arviz_stats.base import array_stats

from pymc_bigdata.errors import BiasWarning, ModelNotSupportedError
from pymc_bigdata.loo_checks import posterior_of
from pymc_bigdata.loo_terms import RowTerms
from pymc_bigdata.model.minibatch import MinibatchModel

__all__ = ["ScoreCheck", "score_check"]

#: draws read by default (one full pass over the rows each)
DEFAULT_DRAWS = 100

#: the fewest (nearly independent) draws the tests need
MIN_DRAWS = 10

#: random sign flips for the mean-score test's reference law
SIGN_FLIPS = 20_000


@dataclass(frozen=True)
class ScoreCheck:
    """What :func:`score_check` found.

    Attributes
    ----------
    draws
        Thinned draws read (one full-data pass each).
    p_mean_score
        The mean-score test's p-value (random sign flips).
    virial_ratio
        ``-mean(g^T (theta - theta_bar)) / d``: 1 at the target, about the draws' variance
        ratio off it.
    p_virial
        The virial t-test's p-value.
    worst_coordinate
        The unconstrained coordinate with the smallest per-coordinate p-value (for reading:
        it does not flag).
    p_coordinates
        That p-value, Bonferroni-corrected over the ``2 d`` tests (at most 1; unreliable
        where a coordinate's products are heavy-tailed).
    nonfinite
        Draws whose full-data score is not finite (outside the support): off target.
    level
        The family's level: the draws are flagged when the mean-score or the virial
        p-value is below ``level / 2``.
    """

    draws: int
    p_mean_score: float
    virial_ratio: float
    p_virial: float
    worst_coordinate: str
    p_coordinates: float
    nonfinite: int
    level: float

    @property
    def off_target(self) -> bool:
        """Whether the draws fail a test (or have a non-finite score)."""
        cut = self.level / 2.0
        return self.nonfinite > 0 or min(self.p_mean_score, self.p_virial) < cut

    def attrs(self) -> dict[str, Any]:
        """Flat attributes (``score_check_*``) to store with a result (netCDF-safe)."""
        return {
            "score_check_draws": self.draws,
            "score_check_p_mean_score": self.p_mean_score,
            "score_check_virial_ratio": self.virial_ratio,
            "score_check_p_virial": self.p_virial,
            "score_check_worst_coordinate": self.worst_coordinate,
            "score_check_p_coordinates": self.p_coordinates,
            "score_check_nonfinite": self.nonfinite,
            "score_check_off_target": int(self.off_target),
        }


def score_check(
    idata: Any,
    model: pm.Model | None = None,
    *,
    layer: MinibatchModel | None = None,
    draws: int = DEFAULT_DRAWS,
    level: float = 1e-3,
    random_seed: int = 0,
    warn: bool = True,
    store: bool = True,
) -> ScoreCheck:
    """Check a result's draws against the full data by the score's Stein identities.

    Works on any ``pm.sample`` result (any step, NUTS too) of a model whose log density
    the layer can evaluate. Costs ``draws`` full passes over the rows (fewer when the
    draws' ESS is lower); skip it on data too large to read that often.

    Parameters
    ----------
    idata
        ``pm.sample``'s result (a ``DataTree`` with a posterior group).
    model
        The model the draws come from (default: the one in context).
    layer
        A :class:`~pymc_bigdata.MinibatchModel` of ``model`` to reuse (its compiled
        functions); default: a new one.
    draws
        The most draws to read (default 100), evenly spaced within each chain.
    level
        The family's false-alarm level (default 0.001): each of the two tests flags below
        ``level / 2``.
    random_seed
        Seed of the sign flips.
    warn
        Raise a :class:`~pymc_bigdata.BiasWarning` when the draws are flagged.
    store
        Write :meth:`ScoreCheck.attrs` into the result's ``sample_stats`` (or ``posterior``)
        attributes.

    Returns
    -------
    ScoreCheck
        The tests' outcome.

    Raises
    ------
    ValueError
        If ``draws`` or ``level`` is out of range, or the draws' ESS is below 10.
    ModelNotSupportedError
        If the model has discrete free variables.
    """
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < MIN_DRAWS:
        raise ValueError(f"draws must be an integer of at least {MIN_DRAWS}, got {draws!r}.")
    if not (isinstance(level, float | int) and 0.0 < level < 1.0):
        raise ValueError(f"level must be a number in (0, 1), got {level!r}.")
    posterior = posterior_of(idata)
    terms = RowTerms(model if model is not None else pm.modelcontext(None), layer)
    if terms.layer.held_vars:
        raise ModelNotSupportedError(
            "The score check needs every free variable continuous (the model has discrete "
            f"ones: {[v.name for v in terms.layer.held_vars]})."
        )
    sampled, (chains, per_chain) = terms.value_draws(posterior)
    picked = _thinned(sampled.reshape(chains, per_chain, -1), draws)
    scores = _scores(terms.layer, sampled, picked)
    result = _tests(sampled, picked, scores, terms, level, random_seed)
    if store:
        group = "sample_stats" if "sample_stats" in idata.children else "posterior"
        idata[group].attrs.update(result.attrs())
    if warn and result.off_target:
        warnings.warn(_message(result), BiasWarning, stacklevel=2)
    return result


def _thinned(sampled: np.ndarray, draws: int) -> np.ndarray:
    """Flat indices of the draws to read: evenly spaced within each chain, at most the
    smallest bulk ESS over the coordinates in all."""
    chains, per_chain, _ = sampled.shape
    with np.errstate(all="ignore"):
        ess = array_stats.ess(np.moveaxis(sampled, -1, 0), chain_axis=-2, draw_axis=-1)
    finite = np.asarray(ess)[np.isfinite(ess)]
    usable = int(min(draws, np.floor(finite.min()) if finite.size else per_chain * chains))
    if usable < MIN_DRAWS:
        raise ValueError(
            f"The draws' smallest bulk ESS is {usable}: the score check needs at least "
            f"{MIN_DRAWS} nearly independent draws. Sample longer first."
        )
    each = max(1, math.ceil(usable / chains))
    within = np.unique(np.linspace(0, per_chain - 1, each).round().astype(np.int64))
    return (np.arange(chains)[:, None] * per_chain + within[None, :]).reshape(-1)


def _scores(layer: MinibatchModel, sampled: np.ndarray, picked: np.ndarray) -> np.ndarray:
    """The full-data score at each picked draw, ``(m, d)`` (NaN where the log density
    cannot be evaluated)."""
    out = np.full((len(picked), sampled.shape[1]), np.nan)
    for row, index in enumerate(picked):
        if not np.all(np.isfinite(sampled[index])):
            continue
        try:
            with np.errstate(all="ignore"):
                out[row] = layer.full_logp_grad(sampled[index])[1]
        except (ValueError, ArithmeticError):
            continue
    return out


def _tests(
    sampled: np.ndarray,
    picked: np.ndarray,
    scores: np.ndarray,
    terms: RowTerms,
    level: float,
    random_seed: int,
) -> ScoreCheck:
    """The two tests and the per-coordinate report on the finite scores; ``sampled`` holds
    every draw, ``(S, d)``."""
    finite = np.all(np.isfinite(scores), axis=1)
    nonfinite = int((~finite).sum())
    everywhere = sampled[np.all(np.isfinite(sampled), axis=1)]
    g, centred = scores[finite], sampled[picked][finite] - everywhere.mean(0)
    m, dim = g.shape
    if m < MIN_DRAWS:
        return ScoreCheck(m, 0.0, math.nan, 0.0, "", 0.0, nonfinite, level)
    p_mean = _mean_score_pvalue(g * everywhere.std(0), random_seed)
    virial = np.einsum("ij,ij->i", g, centred)
    ratio = -float(virial.mean()) / dim
    p_virial = float(_t_pvalues((virial + dim)[:, None])[0])
    per_coordinate = np.concatenate([_t_pvalues(g), _t_pvalues(g * centred + 1.0)])
    worst = int(np.argmin(per_coordinate))
    p_coordinates = min(1.0, float(per_coordinate[worst]) * 2 * dim)
    name = terms.layer.coordinate_label(worst % dim)
    return ScoreCheck(m, p_mean, ratio, p_virial, name, p_coordinates, nonfinite, level)


def _mean_score_pvalue(s: np.ndarray, random_seed: int) -> float:
    """``Q = |sum_i s_i|^2`` against ``SIGN_FLIPS`` random sign flips of the rows ``s_i``
    (computed from their Gram matrix): the p-value, at least ``1 / (SIGN_FLIPS + 1)``."""
    gram = s @ s.T
    observed = float(gram.sum())
    signs = np.random.default_rng(random_seed).choice([-1.0, 1.0], size=(SIGN_FLIPS, len(s)))
    flipped = np.sum((signs @ gram) * signs, axis=1)
    return (1.0 + float(np.sum(flipped >= observed * (1 - 1e-12)))) / (SIGN_FLIPS + 1.0)


def _t_pvalues(values: np.ndarray) -> np.ndarray:
    """Per-column two-sided p-values of one-sample t-tests of mean 0, ``(m, k) -> (k,)``."""
    m = len(values)
    sd = values.std(0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = values.mean(0) / (sd / math.sqrt(m))
    t = np.where(sd > 0, t, 0.0)
    return 2.0 * scipy.stats.t.sf(np.abs(t), df=m - 1)


def _message(result: ScoreCheck) -> str:
    """The warning's text: which test failed, and what to do."""
    if result.nonfinite:
        found = f"the full-data score is not finite at {result.nonfinite} draw(s)"
    else:
        found = (
            f"p-values {result.p_mean_score:.2g} (mean score) and {result.p_virial:.2g} "
            f"(virial ratio {result.virial_ratio:.3f}; 1 at the target, about the draws' "
            f"variance ratio off it), each below {result.level / 2:.2g} flags; the worst "
            f"coordinate looks {result.worst_coordinate!r}"
        )
    return (
        f"The score check against the full data says these {result.draws} draws are off "
        f"their target: {found}. Rerun with a smaller step, a larger batch_size or more "
        "tuning, or check the result against full-data NUTS."
    )

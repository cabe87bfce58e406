"""The EWSG kernel: its integrators' stationary laws, the index chain's law (Eq. 4), and the
paper's Gaussian experiment (Sec. 5.1)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from scipy import stats

from pymc_bigdata.kernels.ewsg import (
    EWSGState,
    ewsg_steps,
    index_chain,
    index_log_weight,
    momentum_update,
    stationary_covariance,
)


@pytest.mark.parametrize("friction", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("step_size", [0.1, 0.7, 1.5])
def test_obabo_is_exact_for_a_unit_gaussian(step_size, friction):
    """At temperature ``1 - h^2/4`` OBABO's positions and momenta have unit variance."""
    cov = stationary_covariance(step_size, friction, "obabo")
    np.testing.assert_allclose(np.diag(cov), [1.0, 1.0], rtol=1e-10)


def test_euler_maruyama_bias_is_first_order():
    """Eq. 3's position variance on a unit Gaussian: 1.114 at h = 0.1, gamma = 1, and its
    excess halves with h (first order)."""
    coarse = stationary_covariance(0.1, 1.0, "euler")[0, 0]
    fine = stationary_covariance(0.05, 1.0, "euler")[0, 0]
    assert coarse == pytest.approx(1.114, abs=1e-3)
    assert (coarse - 1.0) / (fine - 1.0) == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("integrator", ["obabo", "euler"])
def test_steps_reach_the_lyapunov_covariance(integrator):
    """Many independent chains with exact gradients on a unit Gaussian: the sample
    covariance of (z, r) after a long run matches the discrete Lyapunov solution."""
    rng = np.random.default_rng(0)
    chains, h, gamma = 20_000, 0.3, 1.5
    state = EWSGState(np.zeros((chains, 1)), np.zeros((chains, 1)))
    state, info = ewsg_steps(state, lambda z: -z, h, gamma, 200, 1, rng, integrator)
    assert info.finite and info.index_proposals == 200 * chains
    sample = np.cov(np.hstack([state.position, state.momentum]).T)
    expected = stationary_covariance(h, gamma, integrator)
    # sd of a sample variance near 1-1.5 from 20,000 draws: about 0.015
    np.testing.assert_allclose(sample, expected, atol=0.06)


def _obabo_constants(h: float, gamma: float) -> tuple[float, float, float]:
    """OBABO's momentum update ``r' = decay r + kick g + N(0, noise_var)`` read from the
    splitting (module docstring): ``c = exp(-gamma h)``, ``kick = (1 + c) h / 2`` and the
    exact OU step's variance ``1 - c^2`` at temperature ``1 - h^2 / 4``."""
    c = np.exp(-gamma * h)
    return c, 0.5 * (1.0 + c) * h, (1.0 - h * h / 4.0) * (1.0 - c * c)


def _eq4_log_weights(
    grads: np.ndarray, r: np.ndarray, h: float, gamma: float, integrator: str, weights: str
) -> np.ndarray:
    """The index law, written here from the paper rather than read from the kernel.

    Euler-Maruyama: Eq. 4 as printed, at the guess ``r_{k+1} = r_k``: ``x = (r_{k+1} - r_k +
    h gamma r_k) / (sigma sqrt h)``, ``n a_I = sqrt(h) n grad V_I / sigma = -sqrt(h) g_I /
    sigma`` (``g_I``: the estimate of ``grad log p = -n grad V_I``), ``sigma^2 = 2 gamma``,
    ``log p_I = |x + n a_I|^2 / 2``. OBABO: Theorem 2's form, ``p_I`` proportional to ``1 /
    N_I(r')`` at ``r' = r`` with ``N_I`` the momentum update's Gaussian given ``g_I``.
    ``"linear"``: the same exponent without its term quadratic in ``g_I``."""
    if integrator == "euler":
        sigma = np.sqrt(2.0 * gamma)
        x = np.sqrt(h) * gamma * r / sigma
        na = -np.sqrt(h) * grads / sigma
        if weights == "paper":
            return 0.5 * np.sum((x + na) ** 2, axis=-1)
        return np.sum(x * na, axis=-1)
    decay, kick, noise_var = _obabo_constants(h, gamma)
    density = stats.norm(decay * r + kick * grads, np.sqrt(noise_var))
    log_w = -np.sum(density.logpdf(r), axis=-1)
    if weights == "linear":
        log_w -= 0.5 * kick**2 * np.sum(grads**2, axis=-1) / noise_var
    return log_w


def _exact_index_law(log_w: np.ndarray, n_proposals: int) -> np.ndarray:
    """The law of the index after ``M`` steps of Eq. 5's chain from a uniform index, by
    enumeration: a uniform proposal ``j`` (possibly the current index) is taken with
    probability ``min(1, p_j / p_i)``."""
    k = len(log_w)
    move = np.minimum(1.0, np.exp(log_w[None, :] - log_w[:, None])) / k
    np.fill_diagonal(move, 0.0)
    np.fill_diagonal(move, 1.0 - move.sum(axis=1))
    return np.full(k, 1.0 / k) @ np.linalg.matrix_power(move, n_proposals)


def _index_counts(n_proposals: int, seed: int, integrator: str, weights: str):
    """Run the index chain over 8 fixed 'minibatch gradients' for 40,000 independent chains
    (h = 0.5, gamma = 1); return how often each index was chosen, the gradients and the
    momentum."""
    rng = np.random.default_rng(seed)
    grads = rng.normal(scale=3.0, size=(8, 2))
    chains = 40_000
    r = np.array([1.6, -0.8])
    update = momentum_update(0.5, 1.0, integrator)

    def draw_candidate():
        return grads[rng.integers(8, size=chains)]

    momentum = np.tile(r, (chains, 1))
    chosen, _ = index_chain(draw_candidate, momentum, update, n_proposals, rng, weights)
    labels = np.argmin(((chosen[:, None, :] - grads[None]) ** 2).sum(-1), axis=1)
    return np.bincount(labels, minlength=8), grads, r


@pytest.mark.parametrize("n_proposals", [1, 30])
@pytest.mark.parametrize("weights", ["linear", "paper"])
@pytest.mark.parametrize("integrator", ["euler", "obabo"])
def test_index_chain_follows_eq4_law(integrator: str, weights: str, n_proposals: int):
    """After M = 1 (the default) or 30 proposals the chosen index follows the law of Eq. 5's
    chain on Eq. 4's weights, both computed here independently of the kernel (chi-square
    test, 40,000 chains); the same counts reject the uniform law and the law of the weights
    with their sign flipped, so the test can tell them apart.

    Catches flipped or rescaled weights (the paper's or the linear ones), an acceptance
    ``min(1, p_I / p_J)`` instead of ``min(1, p_J / p_I)``, and a chain that ignores M."""
    counts, grads, r = _index_counts(n_proposals, 1, integrator, weights)
    log_w = _eq4_log_weights(grads, r, 0.5, 1.0, integrator, weights)
    law = _exact_index_law(log_w, n_proposals)
    assert np.exp(log_w.max() - log_w.min()) > 3  # the weights are far from uniform
    assert stats.chisquare(counts, counts.sum() * law).pvalue > 1e-3
    for wrong in (np.full(8, 1 / 8), _exact_index_law(-log_w, n_proposals)):
        assert stats.chisquare(counts, counts.sum() * wrong).pvalue < 1e-6


def test_eq4_as_printed_is_theorem_2s_form():
    """The two forms in :func:`_eq4_log_weights` agree where both apply: Euler-Maruyama's
    momentum update (``decay = 1 - gamma h``, ``kick = h``, variance ``2 gamma h``) put into
    Theorem 2's form ``1 / N_I(r)`` gives Eq. 4's printed weights up to a constant."""
    rng = np.random.default_rng(2)
    grads, r, h, gamma = rng.normal(size=(8, 2)), np.array([0.8, -0.4]), 0.3, 1.5
    density = stats.norm((1.0 - gamma * h) * r + h * grads, np.sqrt(2.0 * gamma * h))
    theorem2 = -np.sum(density.logpdf(r), axis=-1)
    eq4 = _eq4_log_weights(grads, r, h, gamma, "euler", "paper")
    np.testing.assert_allclose(theorem2 - theorem2[0], eq4 - eq4[0], rtol=1e-10, atol=1e-12)


def _gaussian_kl(mean, cov, target_mean, target_cov) -> float:
    """KL(N(mean, cov) || N(target_mean, target_cov))."""
    inv = np.linalg.inv(target_cov)
    diff = target_mean - mean
    k = len(mean)
    _, logdet_t = np.linalg.slogdet(target_cov)
    _, logdet = np.linalg.slogdet(cov)
    return 0.5 * (np.trace(inv @ cov) + diff @ inv @ diff - k + logdet_t - logdet)


def _paper_gaussian_kl(
    seed: int, n_proposals: int, weights: str = "linear", realizations: int = 10_000
) -> float:
    """Sec. 5.1: V(theta) = sum_i |theta - c_i|^2 / 2, n = 20, c_i ~ N(0, I_2), batch 1,
    30 data passes (each step reads M + 1 data), h = 0.05, gamma = 10, Euler-Maruyama;
    KL of the Gaussian fitted to the realizations' final states from the posterior
    N(mean c, I / n)."""
    rng = np.random.default_rng(seed)
    n = 20
    centres = rng.standard_normal((n, 2))

    def draw_candidate(z):  # n grad log p_I for one uniform datum per realization
        return -n * (z - centres[rng.integers(n, size=z.shape[0])])

    steps = 30 * n // (n_proposals + 1)
    start = EWSGState(np.zeros((realizations, 2)), np.zeros((realizations, 2)))
    state, _ = ewsg_steps(
        start, draw_candidate, 0.05, 10.0, steps, n_proposals, rng, "euler", weights
    )
    z = state.position
    return _gaussian_kl(z.mean(0), np.cov(z.T), centres.mean(0), np.eye(2) / n)


@pytest.mark.parametrize("weights", ["linear", "paper"])
def test_papers_gaussian_experiment(weights):
    """EWSG (M = 1) against uniform-subsampling SGHMC (the same Euler-Maruyama step with
    M = 0) at the same h, gamma and 30 data passes, over 10 random datasets of 10,000
    realizations each. The KL varies between datasets (sd about 0.1) far more than its Monte
    Carlo error within one; paired over 10 datasets the mean gap (0.27 with the paper's
    weights, 0.32 with the linear ones; uniform's KL is 0.42) is 8-10 standard errors, so
    the test asks for 3 and for EWSG to win on at least 8 of the 10. The paper's weights
    with their sign flipped (an index that makes ``r' = r`` *likely* favoured) make EWSG worse
    than uniform here (KL 1.2 against 0.42: checked once)."""
    ewsg = np.array([_paper_gaussian_kl(seed, 1, weights) for seed in range(10)])
    uniform = np.array([_paper_gaussian_kl(seed, 0) for seed in range(10)])
    gap = uniform - ewsg
    assert gap.mean() > 3 * gap.std(ddof=1) / np.sqrt(len(gap))
    assert np.sum(gap > 0) >= 8


def _position_variance(
    n_proposals: int, noise_var: float, seed: int, weights: str = "paper"
) -> float:
    """Unit Gaussian, candidate gradients ``-z + N(0, V)``: EWSG's stationary position
    variance over 20,000 independent chains (h = 0.3, gamma = 1, OBABO)."""
    rng = np.random.default_rng(seed)

    def draw_candidate(z):
        return -z + np.sqrt(noise_var) * rng.standard_normal(z.shape)

    start = EWSGState(np.zeros((20_000, 1)), np.zeros((20_000, 1)))
    state, _ = ewsg_steps(start, draw_candidate, 0.3, 1.0, 300, n_proposals, rng, "obabo", weights)
    return float(state.position.var())


def _limit_position_variance(h: float, gamma: float, noise_var: float, weights: str) -> float:
    """OBABO's exact stationary position variance on a unit Gaussian when the chosen gradient
    follows the candidates' law ``N(-z, V)`` tilted by the index weights at the guess ``r' =
    r`` (the index chain's law as ``M`` grows; ``"uniform"``: untilted, M = 0).

    Both tilts keep the law Gaussian: ``"linear"`` multiplies it by ``exp(-(1 - decay) kick r
    g / noise_var)``, a shift of its mean by ``-V (1 - decay) kick r / noise_var``;
    ``"paper"`` by ``exp(((1 - decay) r - kick g)^2 / (2 noise_var))``, precision ``1 / V -
    kick^2 / noise_var`` and mean ``-(z / V + kick (1 - decay) r / noise_var)`` over it. The
    step is then linear in ``(z, r)`` with Gaussian noise: a discrete Lyapunov equation."""
    decay, kick, thermal = _obabo_constants(h, gamma)
    if weights == "uniform":
        precision, from_z, from_r = 1.0 / noise_var, -1.0, 0.0
    elif weights == "linear":
        precision, from_z, from_r = 1.0 / noise_var, -1.0, -noise_var * (1 - decay) * kick / thermal
    else:
        precision = 1.0 / noise_var - kick**2 / thermal
        from_z = -1.0 / noise_var / precision
        from_r = -kick * (1 - decay) / thermal / precision
    # r' = decay r + kick (from_z z + from_r r + N(0, 1 / precision)) + N(0, thermal), z' = z + h r'
    row_r = np.array([kick * from_z, decay + kick * from_r])
    step = np.array([[1.0, 0.0], [0.0, 0.0]]) + np.outer([h, 1.0], row_r)
    into = np.array([h, 1.0])
    shocks = kick**2 / precision + thermal
    return float(scipy.linalg.solve_discrete_lyapunov(step, shocks * np.outer(into, into))[0, 0])


def _variance_band(variance: float) -> float:
    """4.5 standard errors of a sample variance of 20,000 independent (normal) end points."""
    return 4.5 * variance * np.sqrt(2.0 / 20_000)


def test_index_chain_trades_inflation_for_contraction():
    """What the weights do with the paper's guess ``r' = r`` (docs/ewsg.md): uniform
    minibatches (M = 0) inflate the variance to ``1 + s`` (``s``: the noise share, 0.31
    here); the chain's limit (large M) tilts the chosen gradients towards the full one *and*
    amplifies it, contracting the variance to 0.70 (:func:`_limit_position_variance`); one
    proposal (the default) lands between, near 1. Both ends are two-sided: M = 0 within 4.5
    standard errors of its exact variance, M = 20 between the limit (less 4.5 standard
    errors) and one proposal's variance (the chain from a uniform index approaches the limit
    from there: 0.72 measured at M = 20, 0.71 at M = 60).

    Catches index weights that contract too much (the coefficient doubled) or too little
    (flipped), and a chain that ignores M."""
    update = momentum_update(0.3, 1.0, "obabo")
    share = update.kick**2 * 2.0 / update.noise_var
    exact_uniform = _limit_position_variance(0.3, 1.0, 2.0, "uniform")
    limit = _limit_position_variance(0.3, 1.0, 2.0, "paper")
    assert exact_uniform == pytest.approx(1.0 + share, rel=1e-9)
    uniform = _position_variance(0, 2.0, seed=3)
    one = _position_variance(1, 2.0, seed=3)
    many = _position_variance(20, 2.0, seed=3)
    assert abs(uniform - exact_uniform) <= _variance_band(exact_uniform)
    assert limit - _variance_band(limit) <= many < one
    assert abs(one - 1.0) < 0.5 * min(uniform - 1.0, 1.0 - many)


def _skewed_noise_mean(n_proposals: int, seed: int, weights: str = "paper") -> float:
    """Unit Gaussian, candidate gradients ``-z + e`` with ``e`` centred-exponential (mean 0,
    skewness 2) at noise share 0.3: EWSG's stationary position mean over 20,000 chains."""
    rng = np.random.default_rng(seed)
    update = momentum_update(0.3, 1.0, "obabo")
    noise_sd = np.sqrt(0.3 * update.noise_var) / update.kick

    def draw_candidate(z):
        return -z + noise_sd * (rng.exponential(size=z.shape) - 1.0)

    start = EWSGState(np.zeros((20_000, 1)), np.zeros((20_000, 1)))
    state, _ = ewsg_steps(start, draw_candidate, 0.3, 1.0, 300, n_proposals, rng, "obabo", weights)
    return float(state.position.mean())


def test_skewed_noise_shifts_the_mean():
    """The weights prefer candidates whose noise is large (their exponent grows with
    ``|e_J|^2``), so skewed minibatch noise, as a logistic regression's is, moves the mean
    along the skew: +0.13 sd with one proposal at noise share 0.3, +0.7 with twenty, while
    uniform minibatches stay unbiased (the mean of 20,000 independent chains' end points has
    an sd of 0.007). Measured, not designed: docs/ewsg.md."""
    assert abs(_skewed_noise_mean(0, seed=5)) < 0.04
    one = _skewed_noise_mean(1, seed=5)
    assert 0.07 < one < 0.2
    assert _skewed_noise_mean(20, seed=5) > 3 * one


def test_linear_weights_balance_the_noise():
    """The linear weights (the default) keep only Eq. 4's tilt against the momentum: extra
    friction that balances the noise's extra variance (docs/ewsg.md). With Gaussian noise at
    noise share 0.31 the stationary position variance is 1.32 with uniform minibatches; the
    chain's limit brings it to 1.001 (:func:`_limit_position_variance`; the tilt is small, so
    M = 20 is there: 1.00 measured at M = 20 and at 60) where the paper's weights contract it
    to 0.70; one proposal goes a fifth of the way less (1.06). M = 20 is checked two-sided,
    within 4.5 standard errors of the limit. Checked once that it fails with the weights'
    coefficient doubled (0.81 at M = 20, 0.96 with one proposal) or its sign flipped (1.89
    and 1.63)."""
    uniform = _position_variance(0, 2.0, seed=3)
    one = _position_variance(1, 2.0, seed=3, weights="linear")
    many = _position_variance(20, 2.0, seed=3, weights="linear")
    limit = _limit_position_variance(0.3, 1.0, 2.0, "linear")
    assert abs(many - limit) <= _variance_band(limit)
    assert 0.0 < one - 1.0 < 0.3 * (uniform - 1.0)


def test_linear_weights_keep_the_mean_under_skewed_noise():
    """Without the term in ``|e_J|^2`` the weights no longer prefer large-noise candidates:
    under skewed noise at share 0.3 the mean stays at 0.00 with one proposal (the paper's
    weights: +0.12) and moves by +0.08 with twenty (the paper's: +0.72), a second-order
    effect of the tilt (its exponent is not small at h = 0.3). Mean sd: 0.007."""
    assert abs(_skewed_noise_mean(1, seed=5, weights="linear")) < 0.03
    assert _skewed_noise_mean(20, seed=5, weights="linear") < 0.15


def test_unknown_index_weights_are_refused():
    update = momentum_update(0.3, 1.0, "obabo")
    with pytest.raises(ValueError, match=r"weights must be one of \('linear', 'paper'\)"):
        index_log_weight(np.zeros(2), np.ones(2), update, "quadratic")


@pytest.mark.parametrize("n_proposals", [1, 5])
@pytest.mark.parametrize("weights", ["linear", "paper"])
def test_one_chain_decides_as_the_batched_chain(weights: str, n_proposals: int):
    """One chain (momentum of shape ``(d,)``, the step method's case) runs the index chain in
    Python floats; from the same candidates and random numbers it makes the same decisions
    as the batched form run on a batch of that one chain, whose law the test above checks.

    Catches a single-chain chain that keeps the first candidate's weight after accepting,
    compares the weights the wrong way round, or counts its acceptances wrongly."""
    update = momentum_update(0.5, 1.0, "obabo")
    accepted_total = 0
    for seed in range(200):
        candidates = np.random.default_rng(seed).normal(scale=3.0, size=(n_proposals + 1, 4))
        momentum = np.random.default_rng(seed + 1000).normal(size=4)
        chosen, accepted = index_chain(
            iter(candidates).__next__,
            momentum,
            update,
            n_proposals,
            np.random.default_rng(seed),
            weights,
        )
        chosen_b, accepted_b = index_chain(
            iter(candidates[:, None, :]).__next__,
            momentum[None],
            update,
            n_proposals,
            np.random.default_rng(seed),
            weights,
        )
        np.testing.assert_array_equal(chosen, chosen_b[0])
        assert int(accepted) == int(accepted_b[0])
        accepted_total += int(accepted)
    assert 0 < accepted_total < 200 * n_proposals  # the decisions are not all alike

"""A chain that crawls: too few effective draws to say anything, whatever else looks fine.

A chain can move so slowly that its draws stay near where tuning left them (a step size
collapsed by a poor fit, coordinates that tie the parameters along a ridge), and then every
per-draw statistic looks healthy while the draws are far from a sample of the posterior.
:class:`CrawlWatch` keeps the kept draws of up to ``CRAWL_COORDINATES`` of the model's
coordinates (the value variables, as ``az.summary`` reports them; beyond, every coordinate of
the small variables, :func:`watched_coordinates`) and, at the chain's end,
their bulk effective sample sizes (ArviZ's, one chain): where the smallest is below
``CRAWL_ESS_SHARE`` of the draws or below ``CRAWL_MIN_ESS``, it reports the chain as
crawling. The in-band runs of the hard-target results hold at least 6.6 % (two-chain bulk ESS
133 of 2,000: signed HMC-ECS on the non-centred hierarchy in its own coordinates,
``benchmarks/results/hard_targets_redesign.md``); the crawling runs the issues reported held
0.1-1.2 % (ESS 2-25 of 2,000). The floor: a chain of fewer than 50 effective draws places a
mean to no better than 0.14 posterior sds (two such chains: 0.1, the bars of the hard
targets), whatever its length; ``benchmarks/results/crawl_floor.md`` counts what it adds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "CRAWL_COORDINATES",
    "CRAWL_ESS_SHARE",
    "CRAWL_MIN_DRAWS",
    "CRAWL_MIN_ESS",
    "CRAWL_SMALL_VARIABLE",
    "CrawlWatch",
    "split_chain_ess",
    "watched_coordinates",
]

#: a chain whose smallest bulk ESS is below this share of its draws crawls
CRAWL_ESS_SHARE = 0.02

#: a chain whose smallest bulk ESS is below this crawls, whatever its length (module docstring)
CRAWL_MIN_ESS = 50

#: chains shorter than this are not judged (their ESS estimates are themselves too noisy)
CRAWL_MIN_DRAWS = 200

#: at most this many coordinates are kept (beyond: those of the small variables, and a fixed
#: random subset of the others)
CRAWL_COORDINATES = 256

#: every coordinate of a value variable of at most this many is kept: a model's scalars and
#: short vectors, its global parameters, which in a hierarchy mix the slowest (crossed
#: ratings, d = 4,004: the mean ``mu``; a random subset of 256 held it with probability 6 %)
CRAWL_SMALL_VARIABLE = 16


class CrawlWatch:
    """The kept draws of one chain, judged at its end (see the module docstring).

    Parameters
    ----------
    dim
        Coordinates of the raveled value variables.
    draws
        Draws the chain keeps (their array is allocated once).
    label
        The name of a raveled coordinate, for the alarm's text.
    sizes
        The value variables' sizes, in order (default: one variable of ``dim``), for
        :func:`watched_coordinates`.
    """

    def __init__(
        self,
        dim: int,
        draws: int,
        label: Callable[[int], str] | None = None,
        sizes: Sequence[int] | None = None,
    ):
        self.label = label or (lambda k: f"coordinate {k} of the raveled value variables")
        self.coordinates = watched_coordinates([dim] if sizes is None else sizes)
        self._draws = np.empty((max(int(draws), 0), len(self.coordinates)))
        self._count = 0

    def add(self, position: np.ndarray) -> None:
        """A kept draw's position in the model's coordinates."""
        if self._count < len(self._draws):
            self._draws[self._count] = position[self.coordinates]
            self._count += 1

    def smallest_ess(self) -> tuple[float, int]:
        """The smallest effective sample size over the kept coordinates
        (:func:`split_chain_ess`), and which coordinate it is."""
        ess = split_chain_ess(self._draws[: self._count])
        k = int(np.argmin(ess))
        return float(ess[k]), int(self.coordinates[k])

    def problem(self, sampler: str) -> str | None:
        """The alarm's text when the chain crawls, else None."""
        if self._count < CRAWL_MIN_DRAWS:
            return None
        ess, coordinate = self.smallest_ess()
        if ess >= max(CRAWL_ESS_SHARE * self._count, CRAWL_MIN_ESS):
            return None
        return (
            f"{sampler}: the chain crawls: its draws hold {ess:.0f} effective draws of "
            f"{self._count} in {self.label(coordinate)} (bulk ESS of this chain alone, below "
            f"{CRAWL_ESS_SHARE:.0%} of its draws or below {CRAWL_MIN_ESS}), so they may stay "
            "near where tuning left them rather than sample the posterior, and its means are "
            "uncertain by more than 0.14 sd. Sample longer, compare several chains (R-hat), or "
            "reparameterise."
        )


def watched_coordinates(sizes: Sequence[int]) -> np.ndarray:
    """The raveled coordinates a :class:`CrawlWatch` keeps, sorted: all of them up to
    ``CRAWL_COORDINATES``; beyond, every coordinate of the variables of at most
    ``CRAWL_SMALL_VARIABLE`` (up to ``CRAWL_COORDINATES``), the rest a fixed random subset of
    the others (set-up, not sampling: the same for every chain)."""
    dim = int(sum(sizes))
    if dim <= CRAWL_COORDINATES:
        return np.arange(dim)
    ends = np.cumsum(sizes)
    small = [
        np.arange(end - size, end) for size, end in zip(sizes, ends) if size <= CRAWL_SMALL_VARIABLE
    ]
    always = np.concatenate(small)[:CRAWL_COORDINATES] if small else np.empty(0, np.int64)
    others = np.setdiff1d(np.arange(dim), always)
    chosen = np.random.default_rng(0).choice(others, CRAWL_COORDINATES - len(always), replace=False)
    return np.sort(np.concatenate([always, chosen]).astype(np.int64))


def split_chain_ess(draws: np.ndarray) -> np.ndarray:
    """Effective sample size of each column of one chain's ``draws`` (n, k), computed as
    Stan and ArviZ do for several chains (Vehtari et al. 2021, Eqs. 10-11, without the rank
    normalisation) on the chain's two halves: the halves' within and between variances, the
    autocorrelations by FFT, Geyer's initial monotone sequence. A chain that drifts has
    halves that disagree, which lowers it too. Non-finite or constant columns give 0.
    """
    half = draws.shape[0] // 2
    chains = np.stack([draws[:half], draws[half : 2 * half]])  # (2, n, k)
    centred = chains - chains.mean(axis=1, keepdims=True)
    within = (centred**2).sum(axis=1).mean(axis=0) / (half - 1)
    between = half * chains.mean(axis=1).var(axis=0, ddof=1)
    var_plus = (half - 1) / half * within + between / half
    spectrum = np.fft.rfft(centred, n=2 * half, axis=1)
    acov = np.fft.irfft(spectrum * np.conj(spectrum), n=2 * half, axis=1)[:, :half] / half
    with np.errstate(all="ignore"):
        rho = 1.0 - (within - acov.mean(axis=0)) / var_plus  # (n, k)
        pairs = rho[: half - half % 2 : 2] + rho[1 : half - half % 2 : 2]  # Geyer's pairs
        positive = np.cumprod(pairs > 0, axis=0).astype(bool)
        monotone = np.minimum.accumulate(np.where(positive, pairs, 0.0), axis=0)
        tau = -1.0 + 2.0 * np.where(positive, monotone, 0.0).sum(axis=0)
        ess = 2 * half / np.maximum(tau, 1.0 / np.log10(2 * half))
    return np.where(np.isfinite(ess) & (var_plus > 0), ess, 0.0)

"""Full-data passes: sums over all N rows, streamed in chunks of bounded memory.

:class:`FullDataPasses` reduces the model's compiled per-chunk functions over the row
source (on dask workers when the data is distributed): the full-data log-likelihood and its
gradient, Hessian-vector products, the dense Hessian, a stochastic estimate of its diagonal,
and each row's influence on a minibatch gradient.  It also checks, on one block of rows,
that the log-likelihood factors over rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from pymc_bigdata.errors import ModelNotSupportedError
from pymc_bigdata.model.compiled import CompiledModel
from pymc_bigdata.model.hessian_diagonal import refined_diagonal

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "DIAGONAL_PROBES",
    "HESSIAN_BLOCK_ELEMENTS",
    "FullDataPasses",
    "select_influential",
]

#: rows per chunk in full-data passes (keeps memory bounded; ~2 MB per float array column)
DEFAULT_CHUNK_ROWS = 65_536

#: rows x basis directions per block when the Hessian is computed by batched HVPs (8 MB)
HESSIAN_BLOCK_ELEMENTS = 2**20

#: Rademacher probes for the Hessian diagonal when d > DENSE_HESSIAN_MAX_DIM
DIAGONAL_PROBES = 32


class FullDataPasses:
    """Chunked passes over all rows of one compiled model.

    Parameters
    ----------
    compiled
        The model's compiled quantities (its graph holds the row source).
    chunk_rows
        Rows per block.
    """

    def __init__(self, compiled: CompiledModel, chunk_rows: int = DEFAULT_CHUNK_ROWS):
        self.compiled = compiled
        self.rows = compiled.graph.rows
        self.chunk_rows = int(chunk_rows)

    def full_loglik_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Full-data summed log-likelihood and gradient, computed in row chunks."""
        lp, g = self.rows.reduce(
            self.compiled.chunk_function("loglik_grad"), (theta,), self.chunk_rows, "log-likelihood"
        )
        return float(lp), g

    def full_logp_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Full-data log posterior and its gradient (chunked)."""
        lp, g = self.full_loglik_grad(theta)
        plp, pg = self.compiled.prior_logp_grad(theta)
        return lp + plp, g + pg

    def full_loglik_hvp(self, theta: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """Full-data Hessian-vector product of the summed log-likelihood (chunked)."""
        direction = np.asarray(direction, dtype=np.float64)
        return self.rows.reduce(
            self.compiled.chunk_function("hvp"),
            (theta, direction),
            self.chunk_rows,
            "Hessian product",
        )

    def full_loglik_grad_hessian(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Full-data summed log-likelihood, its gradient and its dense Hessian in one pass
        (row chunks as :meth:`full_loglik_hessian`'s)."""
        both = _GradHessian(
            self.compiled.chunk_function("loglik_grad"), self.compiled.chunk_function("hessian")
        )
        lp, g, hessian = self.rows.reduce(
            both, (theta,), self.hessian_chunk_rows(), "log-likelihood and Hessian"
        )
        return float(lp), g, hessian

    def full_loglik_hessian(self, theta: np.ndarray) -> np.ndarray:
        """Full-data dense Hessian of the summed log-likelihood.

        Computed by batched Hessian-vector products over the d basis directions, in row
        chunks of at most ``HESSIAN_BLOCK_ELEMENTS / d`` rows so the intermediate arrays stay
        near 8 MB whatever d is (time ~ N d forward passes).
        """
        return self.rows.reduce(
            self.compiled.chunk_function("hessian"),
            (theta,),
            self.hessian_chunk_rows(),
            "Hessian",
        )

    def hessian_chunk_rows(self) -> int:
        """Rows per block of a dense Hessian pass (``HESSIAN_BLOCK_ELEMENTS / d``, at least
        256, at most ``chunk_rows``)."""
        dim = self.compiled.graph.dim
        return int(max(256, min(self.chunk_rows, HESSIAN_BLOCK_ELEMENTS // max(dim, 1))))

    def full_loglik_hessian_diagonal(
        self, theta: np.ndarray, n_probes: int = DIAGONAL_PROBES, seed: int = 0
    ) -> np.ndarray:
        """Hutchinson estimate of the diagonal of the full-data log-likelihood Hessian.

        ``n_probes`` full-data HVP passes with Rademacher probes and O(d) memory, for models
        too large for :meth:`full_loglik_hessian`; where they leave a coordinate's curvature
        unplaced, ``n_probes`` more with probes scaled by the first read's curvatures
        (:func:`~pymc_bigdata.model.hessian_diagonal.refined_diagonal`, which says why). It
        serves as a starting preconditioner that tuning refines from the chain's draws.
        """
        return refined_diagonal(
            lambda probe: self.full_loglik_hvp(theta, probe),
            self.compiled.graph.dim,
            n_probes,
            np.random.default_rng(seed),
        )

    def influence_chunks(
        self, theta: np.ndarray, directions: list[np.ndarray]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, row influence of a chunk)`` over the data, one pass.

        A row's influence is ``mean_k |D_v l_i(theta + v_k) - D_v l_i(theta)|`` over the
        given directions ``v_k``: the size of its first-order control-variate residual.
        """
        start = 0
        for rows in self.rows.chunks(self.chunk_rows, "row influence"):
            yield start, self._influence(theta, directions, rows)
            start += len(rows[0])

    def loglik_grad_and_influential(
        self, theta: np.ndarray, directions: list[np.ndarray], factor: float, cap: int
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """:meth:`full_loglik_grad` at ``theta`` and the rows :func:`select_influential`
        keeps from :meth:`influence_chunks` there, from one read of the rows (the
        control-variate anchor and the census stratum together)."""
        grad = self.compiled.chunk_function("loglik_grad")
        sums: list[Any] = [0.0, np.zeros(self.compiled.graph.dim)]

        def chunks() -> Iterator[tuple[int, np.ndarray]]:
            start = 0
            for rows in self.rows.chunks(self.chunk_rows, "anchor and row influence"):
                lp, g = grad(theta, *rows)
                sums[0], sums[1] = sums[0] + float(lp), sums[1] + g
                yield start, self._influence(theta, directions, rows)
                start += len(rows[0])

        influential = select_influential(chunks(), factor, cap)
        return sums[0], sums[1], influential

    def _influence(
        self, theta: np.ndarray, directions: list[np.ndarray], rows: list[np.ndarray]
    ) -> np.ndarray:
        jvp = self.compiled.row_directional_derivatives
        out = np.zeros(len(rows[0]))
        for v in directions:
            out += np.abs(jvp(theta + v, v, rows) - jvp(theta, v, rows))
        return out / max(len(directions), 1)

    def check_row_factorisation(
        self, theta: np.ndarray | None = None, gradient_free: bool = False
    ) -> None:
        """Refuse a likelihood whose per-row terms depend on the other rows in the batch.

        Graph inspection catches multivariate distributions over the row axis; this catches
        the rest (e.g. a covariate centred inside the model, ``x - x.mean()``): the summed
        log-likelihood of a block of rows must not change when the block is split in two or
        its rows are reversed. ``gradient_free`` compares the per-row terms instead (what a
        discrete layer can compute).
        """
        block = next(self.rows.chunks(2 * self.chunk_rows))
        n = len(block[0])
        if n < 2:
            return
        compiled, graph = self.compiled, self.compiled.graph
        # off the initial point, where parameters are often exactly 0; the initial point
        # itself if the likelihood is not finite there
        start = graph.initial_theta
        candidates = (
            [theta]
            if theta is not None
            else [start + 0.3 * np.cos(np.arange(graph.dim) + 1.0), start]
        )
        if gradient_free:
            candidates = [np.round(np.clip(c, 0, 1)) for c in candidates]

        def summed(theta, rows):
            if gradient_free:
                return float(np.sum(compiled.row_logp(theta, rows)))
            return compiled.loglik_grad(theta, rows)[0]

        for theta in candidates:
            whole = summed(theta, block)
            if np.isfinite(whole):
                break
        else:
            return  # nothing finite to compare; the MAP search will report the problem
        halves = sum(
            summed(theta, [b[s] for b in block]) for s in (slice(0, n // 2), slice(n // 2, n))
        )
        reversed_rows = summed(theta, [np.ascontiguousarray(b[::-1]) for b in block])
        tolerance = 1e-8 * max(1.0, abs(whole))
        if not (abs(whole - halves) <= tolerance and abs(whole - reversed_rows) <= tolerance):
            raise ModelNotSupportedError(
                "The likelihood does not factor over rows: the log-likelihood of a block of "
                f"rows ({whole:.6g}) changes when the block is split in two ({halves:.6g}) or "
                f"reordered ({reversed_rows:.6g}). The model uses the data across rows (e.g. a "
                "mean, cumulative sum or lag over the data inside the model); compute such "
                "quantities before building the model and pass them as data."
            )


class _GradHessian:
    """A row block's summed log-likelihood, gradient and Hessian from one read of its rows
    (picklable, for dask workers, as its two chunk functions are)."""

    def __init__(self, grad: Any, hessian: Any):
        self.grad, self.hessian = grad, hessian

    def __call__(self, theta: np.ndarray, *rows: np.ndarray) -> list[Any]:
        lp, g = self.grad(theta, *rows)
        return [lp, g, self.hessian(theta, *rows)]


def select_influential(
    chunks: Iterable[tuple[int, np.ndarray]], factor: float, cap: int
) -> np.ndarray:
    """Rows whose influence exceeds ``factor`` times its mean over the rows (non-finite
    influence counts as infinite), at most the ``cap`` largest, sorted.

    One streamed pass over ``(first row, influence)`` chunks keeping the ``cap`` largest
    values seen and the running sum, so memory is bounded by a chunk and ``cap`` whatever N
    is; the same rows as thresholding the full influence vector.
    """
    top_rows, top_values = np.empty(0, dtype=np.int64), np.empty(0)
    total, count = 0.0, 0
    for start, part in chunks:
        finite = np.isfinite(part)
        total += float(part[finite].sum())
        count += int(finite.sum())
        part = np.where(finite, part, np.inf)
        rows = np.concatenate([top_rows, start + np.arange(len(part))])
        values = np.concatenate([top_values, part])
        if len(values) > cap:  # the cap largest, in linear time (a sort was 5 ms a chunk)
            keep = np.argpartition(values, len(values) - cap)[len(values) - cap :]
            rows, values = rows[keep], values[keep]
        top_rows, top_values = rows, values
    threshold = factor * total / max(count, 1)
    return np.sort(top_rows[top_values > threshold])

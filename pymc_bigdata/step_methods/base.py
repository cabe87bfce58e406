"""Base class of the subsampling step methods: the PyMC plumbing every sampler shares.

A subclass fills :meth:`SubsamplingStep._transitions` (run the kernel for one recorded
draw) and declares its defaults; the base ravels points, draws minibatches, maps between
the model's coordinates ``theta`` and the preconditioned coordinates ``z`` of the kernels
(``theta = theta* + L z``), catches non-finite values and emits the common statistics.
"""

from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from pymc.blocking import RaveledVars
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence

from pymc_bigdata.errors import DivergenceWarning
from pymc_bigdata.layer import Anchor, MinibatchModel
from pymc_bigdata.rows import RowIndexSampler, check_batch_size

__all__ = ["Preconditioner", "SubsamplingStep"]

#: above this many parameters the preconditioner is diagonal rather than dense
DENSE_PRECONDITIONER_MAX_DIM = 200

#: weight of the newest draw in the running gradient-noise estimate
NOISE_EMA_WEIGHT = 0.05


class Preconditioner:
    """The map ``theta = theta* + L z`` and the curvature of the posterior in ``z``.

    Parameters
    ----------
    center
        ``theta*`` (the MAP).
    precision
        Negative Hessian of the log posterior at ``theta*`` (the Laplace precision).
    kind
        ``"dense"``: ``L`` = a Cholesky square root of the Laplace covariance (z is white);
        ``"diag"``: ``L`` = the Laplace marginal standard deviations; ``"identity"``: ``L = I``.
    """

    def __init__(self, center: np.ndarray, precision: np.ndarray, kind: str):
        self.center = np.asarray(center, dtype=np.float64)
        self.kind = kind
        precision = _positive_definite(precision)
        d = len(center)
        if kind == "dense":
            upper_chol = np.linalg.cholesky(precision)  # precision = U U^T, U lower
            self.to_z = upper_chol.T  # z = U^T (theta - theta*)
            self.matrix = np.linalg.inv(self.to_z)  # L = U^{-T}
        elif kind == "diag":
            sd = np.sqrt(np.diag(np.linalg.inv(precision)))
            self.matrix, self.to_z = np.diag(sd), np.diag(1.0 / sd)
        elif kind == "identity":
            self.matrix, self.to_z = np.eye(d), np.eye(d)
        else:
            raise ValueError(
                f"preconditioner must be 'auto', 'dense', 'diag' or 'identity', got {kind!r}."
            )
        curvature = self.matrix.T @ precision @ self.matrix
        eig = np.linalg.eigvalsh(0.5 * (curvature + curvature.T))
        #: extreme eigenvalues of the curvature in z coordinates (both 1 for "dense")
        self.curvature_range = (float(eig[0]), float(eig[-1]))
        self._diagonal = kind != "dense"
        self._scale = np.diag(self.matrix).copy()

    def theta(self, z: np.ndarray) -> np.ndarray:
        """``theta* + L z``."""
        if self._diagonal:
            return self.center + self._scale * z
        return self.center + self.matrix @ z

    def z(self, theta: np.ndarray) -> np.ndarray:
        """``L^{-1} (theta - theta*)``."""
        if self._diagonal:
            return (theta - self.center) / self._scale
        return self.to_z @ (theta - self.center)

    def grad_z(self, grad_theta: np.ndarray) -> np.ndarray:
        """Chain rule: ``L^T grad_theta``."""
        if self._diagonal:
            return self._scale * grad_theta
        return self.matrix.T @ grad_theta


def _positive_definite(precision: np.ndarray) -> np.ndarray:
    sym = 0.5 * (precision + precision.T)
    eigval, eigvec = np.linalg.eigh(sym)
    if eigval[0] > 1e-10 * max(eigval[-1], 1e-300):
        return sym
    warnings.warn(
        "The log posterior's Hessian at the MAP is not negative definite (the MAP search may "
        "have stopped early or the posterior is improper in some direction); its eigenvalues "
        "were raised to a floor to build the preconditioner.",
        RuntimeWarning,
        stacklevel=3,
    )
    floor = max(1e-6 * abs(eigval[-1]), 1e-8)
    return (eigvec * np.maximum(eigval, floor)) @ eigvec.T


class SubsamplingStep(ArrayStepShared):
    """Shared machinery of the minibatch step methods (see the module docstring).

    Parameters
    ----------
    vars
        Value variables to sample: all of the model's free variables (default).
    model
        PyMC model (default: the one in context).
    batch_size
        Rows per minibatch ``n`` (``1 <= n <= N``).
    step_size
        Step size in the preconditioned coordinates; default from the curvature at the MAP.
    inner_steps
        Transitions per recorded draw (thinning); default from the step size.
    preconditioner
        ``"auto"`` (dense up to 200 parameters, diagonal beyond), ``"dense"``, ``"diag"`` or
        ``"identity"``; all built from the Laplace precision at the MAP.
    control_variates
        Use ``grad U(theta*) + (N/n) sum_i [grad l_i(theta) - grad l_i(theta*)]``.
    replace
        Draw minibatch rows with replacement (default: without).
    reshuffle
        Without replacement: walk through random permutations of the rows, so the minibatches
        of one pass are disjoint (True, the default), or draw independent minibatches (False;
        needed by, and the default of, an estimated gradient-noise correction).
    layer
        A :class:`~pymc_bigdata.MinibatchModel` to reuse (its compiled functions and MAP).
    rng
        Seed or generator; ``pm.sample`` replaces it per chain through ``setup_chain``.
    """

    name: ClassVar[str] = "subsampling"
    default_blocked = True
    #: step size in z coordinates for unit curvature, and time covered by one draw
    default_step_size: ClassVar[float] = 0.1
    default_inner_steps: ClassVar[int] = 10

    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list]]] = {
        "step_size": (np.float64, []),
        "lp_est": (np.float64, []),
        "rows_touched": (np.int64, []),
        "data_fraction": (np.float64, []),
        "grad_noise_sd": (np.float64, []),
        "diverging": (bool, []),
        "tune": (bool, []),
    }

    def __init__(
        self,
        vars=None,
        *,
        model=None,
        batch_size: int = 1000,
        step_size: float | None = None,
        inner_steps: int | None = None,
        preconditioner: str = "auto",
        control_variates: bool = True,
        replace: bool = False,
        reshuffle: bool | None = None,
        layer: MinibatchModel | None = None,
        rng=None,
        blocked: bool = True,
        initial_point=None,
        compile_kwargs: dict | None = None,
        mode=None,
    ):
        model = pm.modelcontext(model)
        if mode is None and compile_kwargs:
            mode = compile_kwargs.get("mode")
        if layer is not None and layer.model is not model:
            raise ValueError(
                "The layer= given was built on a different model; build it with "
                "MinibatchModel(model) for this model, or leave layer out."
            )
        self.layer = layer if layer is not None else MinibatchModel(model, vars, mode=mode)
        n_rows = self.layer.n_rows
        check_batch_size(batch_size, n_rows)
        self.batch_size = int(batch_size)
        if preconditioner == "auto":
            preconditioner = "dense" if self.layer.dim <= DENSE_PRECONDITIONER_MAX_DIM else "diag"
        if preconditioner not in ("dense", "diag", "identity"):
            raise ValueError(
                f"preconditioner must be 'auto', 'dense', 'diag' or 'identity', "
                f"got {preconditioner!r}."
            )
        self.control_variates = bool(control_variates)
        self.replace = bool(replace)
        self.reshuffle = self._check_reshuffle(reshuffle)
        if step_size is not None:  # fail before the (full-data) MAP search
            self._check_step_size(step_size)
        if inner_steps is not None:
            self._check_inner_steps(inner_steps)
        map_result = self.layer.map_estimate()
        self.precond = Preconditioner(map_result.theta, map_result.hessian, preconditioner)
        self.anchor: Anchor | None = self.layer.map_anchor() if self.control_variates else None
        self.step_size = self._check_step_size(step_size)
        self.inner_steps = self._check_inner_steps(inner_steps)
        super().__init__(self.layer.value_vars, {}, blocked=blocked, rng=rng)
        self.tune = True
        self._rows = RowIndexSampler(
            n_rows, self.batch_size, self.rng, replace=self.replace, reshuffle=self.reshuffle
        )
        self._reset_chain_state()

    # ------------------------------------------------------------------ defaults and checks
    def default_step(self) -> float:
        """Default step size from the curvature at the MAP (see the sampler's docs)."""
        return self.default_step_size / self.precond.curvature_range[1]

    def default_inner(self) -> int:
        """Default transitions per draw (see the sampler's docs)."""
        return self.default_inner_steps

    def _check_reshuffle(self, reshuffle: bool | None) -> bool:
        """Subclasses that assume independent minibatches override this."""
        return True if reshuffle is None else bool(reshuffle)

    def _check_step_size(self, step_size: float | None) -> float:
        if step_size is None:
            return self.default_step()
        if not (isinstance(step_size, int | float) and math.isfinite(step_size) and step_size > 0):
            raise ValueError(f"step_size must be a positive finite number, got {step_size!r}.")
        return float(step_size)

    def _check_inner_steps(self, inner_steps: int | None) -> int:
        if inner_steps is None:
            return self.default_inner()
        if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
            raise ValueError(f"inner_steps must be a positive integer, got {inner_steps!r}.")
        return int(inner_steps)

    @staticmethod
    def competence(var, has_grad):
        """Compatible with continuous variables: never chosen over NUTS unless preferred."""
        if var.dtype in pm.discrete_types or not has_grad:
            return Competence.INCOMPATIBLE
        return Competence.COMPATIBLE

    # ------------------------------------------------------------------ chain lifecycle
    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Per-chain generator and fresh chain state (sequential and parallel paths)."""
        super().setup_chain(rng, tune, draws)
        self._rows.reset(self.rng)
        self._reset_chain_state()

    def reset_tuning(self) -> None:
        """Forget tuning state (PyMC calls this before each chain in the sequential path)."""
        self._reset_chain_state()

    def stop_tuning(self) -> None:
        self.tune = False

    def _reset_chain_state(self) -> None:
        self.tune = True
        self._last_theta: np.ndarray | None = None
        self._last_z: np.ndarray | None = None
        self._noise_var = np.zeros(self.layer.dim)
        self._noise_seen = 0
        self._measure_noise = False
        self._measured = None
        self._last_rows: list[np.ndarray] | None = None
        self._rows_touched = 0
        self._warned_divergence = False
        self._reset_kernel_state()

    def _reset_kernel_state(self) -> None:
        """Subclasses reset their per-chain kernel state (momentum...) here."""

    # ------------------------------------------------------------------ gradient oracle
    #: how the gradient-noise variance is measured once per draw: "split" (two half
    #: minibatches) or "fisher" (per-row gradients, the empirical Fisher of Ahn et al. 2012)
    noise_measurement: str = "split"

    def grad_log_density(self, z: np.ndarray) -> np.ndarray:
        """Stochastic gradient of the log posterior in z coordinates (one fresh minibatch)."""
        theta = self.precond.theta(z)
        rows = self.layer.take_rows(self._rows.draw())
        self._last_rows = rows
        self._rows_touched += self.batch_size
        if self._measure_noise and self.batch_size >= 2:
            self._measure_noise = False
            if self.noise_measurement == "fisher":
                self._measured = self._fisher_noise_var(theta, rows)
            else:
                return self._split_gradient(theta, rows)
        return self.precond.grad_z(self.layer.estimate_grad(theta, rows, self.anchor))

    def _split_gradient(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """The minibatch gradient as the weighted mean of its two halves, whose difference
        measures the estimator's variance: Var(mean) = E[(g_a - g_b)^2] / 4."""
        half = self.batch_size // 2
        g_a = self.layer.estimate_grad(theta, [r[:half] for r in rows], self.anchor)
        g_b = self.layer.estimate_grad(theta, [r[half:] for r in rows], self.anchor)
        self._measured = self.precond.grad_z(g_a - g_b) ** 2 / 4.0
        w_a = half / self.batch_size
        return self.precond.grad_z(w_a * g_a + (1.0 - w_a) * g_b)

    def _fisher_noise_var(self, theta: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
        """Diagonal of the minibatch gradient's covariance from per-row gradients (z units).

        ``V = (N^2 / n) (1 - n/N) Cov_i[grad l_i(theta) - grad l_i(theta*)]`` for a sample of
        ``n`` rows drawn without replacement (without the finite-population factor if drawn
        with replacement); the anchor term drops out without control variates.
        """
        per_row = self.layer.row_gradients(theta, rows)
        if self.anchor is not None:
            per_row = per_row - self.layer.row_gradients(self.anchor.theta, rows)
        per_row_z = per_row @ self.precond.matrix  # rows of L^T grad
        n, big_n = self.batch_size, self.layer.n_rows
        finite_population = 1.0 if self.replace else 1.0 - n / big_n
        return per_row_z.var(axis=0, ddof=1) * big_n**2 / n * finite_population

    def _update_noise_estimate(self) -> None:
        if self._measured is None:
            return
        self._noise_seen += 1
        weight = max(NOISE_EMA_WEIGHT, 1.0 / self._noise_seen)
        self._noise_var = (1.0 - weight) * self._noise_var + weight * self._measured
        self._measured = None

    # ------------------------------------------------------------------ PyMC step
    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        theta0 = q0.data
        if self._last_theta is not None and np.array_equal(theta0, self._last_theta):
            z0 = self._last_z
        else:
            z0 = self.precond.z(theta0)
            self._reset_kernel_state()
        self._rows_touched = 0
        self._measure_noise = True
        with np.errstate(all="ignore"):
            z, finite = self._transitions(z0)
        self._update_noise_estimate()
        diverging = not finite
        if diverging:
            self._on_divergence()
            z, theta = z0, theta0
        else:
            theta = self.precond.theta(z)
        lp_est = self._lp_estimate(theta)
        self._last_theta, self._last_z = theta, z
        stats = {
            "step_size": self.step_size,
            "lp_est": lp_est,
            "rows_touched": self._rows_touched,
            "data_fraction": self._rows_touched / self.layer.n_rows,
            "grad_noise_sd": float(np.sqrt(self._noise_var.mean())),
            "diverging": diverging,
            "tune": self.tune,
        }
        stats.update(self._extra_stats())
        return RaveledVars(theta, q0.point_map_info), [stats]

    def _lp_estimate(self, theta: np.ndarray) -> float:
        # The last transition's minibatch: an unbiased estimate at no extra read of the data.
        rows = self._last_rows
        if rows is None:
            rows = self.layer.take_rows(self._rows.draw())
            self._rows_touched += self.batch_size
        with np.errstate(all="ignore"):
            return self.layer.estimate_logp(theta, rows, self.anchor)

    def _on_divergence(self) -> None:
        self._reset_kernel_state()
        if not self._warned_divergence:
            self._warned_divergence = True
            warnings.warn(
                f"{type(self).__name__}: a non-finite gradient or position appeared; the draw "
                "was rejected and recorded as diverging. If this repeats, lower step_size.",
                DivergenceWarning,
                stacklevel=2,
            )

    @abstractmethod
    def _transitions(self, z0: np.ndarray) -> tuple[np.ndarray, bool]:
        """Run ``inner_steps`` kernel transitions from ``z0``; return (z, all finite)."""

    def _extra_stats(self) -> dict[str, Any]:
        return {}

"""The per-row log-likelihood and the log prior of a PyMC model, as graphs of ``theta``.

PyMC bakes the observed row count into a model (the observed variable's size and the shape
of its value), so :class:`ModelGraph` rebuilds each observed variable with the minibatch's
size (``change_dist_size``), points its parameters at minibatch inputs and at the free
variables' values, and takes ``pm.logp`` of it at a symbolic value.  ``theta`` is the flat
vector of the sampled value variables; the *held* ones (moved by another step of a compound
step) are read from a shared vector, set with :meth:`ModelGraph.hold`.
"""

from __future__ import annotations

import copy

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.distributions.shape_utils import change_dist_size
from pymc.logprob.utils import replace_rvs_by_values
from pymc.variational.minibatch_rv import MinibatchRandomVariable
from pytensor.gradient import DisconnectedInputError
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace, graph_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_bigdata.data import row_column
from pymc_bigdata.errors import ModelNotSupportedError
from pymc_bigdata.model.checks import (
    check_deterministics_not_per_row,
    check_free_vars_not_per_row,
    check_no_missing_values,
    check_vars,
    common_row_count,
)
from pymc_bigdata.model.row_data import (
    data_value,
    data_vars,
    find_row_data,
    minibatch_replacements,
    row_array,
    row_names,
    strip_minibatch,
)
from pymc_bigdata.rows import RowSource

__all__ = ["ModelGraph", "flat", "slices"]


class ModelGraph:
    """The row log-likelihood and log-prior graphs of a model, and its row data.

    Parameters
    ----------
    model
        The PyMC model.
    vars
        Value variables to sample (default: all free variables; the others are held).
    discrete
        Sample discrete variables instead of continuous ones.

    Attributes
    ----------
    theta, anchor, direction : TensorVariable
        The symbolic parameter vector, control-variate anchor and tangent direction.
    row_inputs : list of TensorVariable
        One minibatch input per row array, in the order of :attr:`rows`.
    row_logp_graph : TensorVariable
        The per-row log-likelihood terms ``l_i(theta)``, shape (n,).
    prior_graph : TensorVariable
        The log prior with the transforms' Jacobians (and the potentials).
    rows : RowSource
        The full data arrays, read through the row source only.
    """

    def __init__(self, model: pm.Model, vars: list[Variable] | None, discrete: bool):
        self.model = model
        self.discrete = bool(discrete)
        self.value_vars = check_vars(model, vars, self.discrete)
        self.held_vars = [v for v in model.value_vars if v not in self.value_vars]
        initial_point = model.initial_point()
        self.var_shapes = [initial_point[v.name].shape for v in self.value_vars]
        self.var_sizes = [int(np.prod(s)) for s in self.var_shapes]
        self.dim = int(sum(self.var_sizes))
        self._initial_theta = flat(initial_point, self.value_vars)
        self.held_shapes = [initial_point[v.name].shape for v in self.held_vars]
        self.held_values = pytensor.shared(flat(initial_point, self.held_vars), "held_values")
        self._build()

    def _build(self) -> None:
        model = self.model
        observed = list(model.observed_RVs)
        if not observed:
            raise ModelNotSupportedError(
                "The model has no observed variables: there are no rows to subsample. "
                "Pass data with observed=... or use pm.sample's default samplers."
            )
        check_no_missing_values(model)
        stripped_values = {rv: strip_minibatch(model.rvs_to_values[rv]) for rv in observed}
        self.n_rows = common_row_count(stripped_values)
        row_vars, canonical = find_row_data(model, observed, stripped_values, self.n_rows)
        names = row_names(row_vars, observed, stripped_values)
        check_free_vars_not_per_row(model, self.n_rows)

        self.theta = pt.vector("theta", dtype="float64")
        self.anchor = pt.vector("theta_anchor", dtype="float64")
        self.direction = pt.vector("direction", dtype="float64")
        value_of = self._unravel(self.theta)

        row_inputs = [
            pt.tensor(f"rows_{i}", dtype=v.dtype, shape=(None, *v.type.shape[1:]))
            for i, v in enumerate(row_vars)
        ]
        input_of = dict(zip(row_vars, row_inputs))
        data_to_rows = {var: input_of[canon] for var, canon in canonical.items()}
        check_deterministics_not_per_row(model, canonical, names, row_vars, self.n_rows)
        arrays = [row_array(v) for v in row_vars]
        self._data_snapshot = [
            (v, data_value(v))
            for v in data_vars(model)
            if isinstance(v, TensorSharedVariable) and row_column(v) is None
        ]
        self.rows = RowSource(arrays, names, dtypes=[v.dtype for v in row_vars])
        self.row_inputs = row_inputs

        row_terms = []
        free_rvs_to_values = {rv: model.rvs_to_values[rv] for rv in model.free_RVs}
        for rv in observed:
            row_terms.append(
                self._per_row_logp(rv, stripped_values[rv], data_to_rows, free_rvs_to_values)
            )
        row_logp = row_terms[0]
        for term in row_terms[1:]:
            row_logp = row_logp + term
        #: the two graphs in the value variables (before they are slices of ``theta``)
        self._value_graphs = (row_logp, self._prior(canonical))
        self.row_logp_graph = graph_replace(row_logp, value_of, strict=False)
        self.prior_graph = graph_replace(self._value_graphs[1], value_of, strict=False)

    def _prior(self, canonical: dict[Variable, Variable]) -> pt.TensorVariable:
        """The log prior (Jacobians included) and the potentials, refused if they read rows."""
        model = self.model
        prior_terms = [*model.logp(vars=model.free_RVs, sum=False, jacobian=True)]
        for pot in model.potentials:
            if any(a in canonical for a in ancestors([pot])):
                raise ModelNotSupportedError(
                    f"Potential {pot.name!r} depends on row data, so the likelihood does not "
                    "factor over rows; write it as an observed variable instead."
                )
            prior_terms.append(pt.sum(model.replace_rvs_by_values([pot])[0]))
        prior = pt.sum([pt.sum(t) for t in prior_terms])
        values = [model.rvs_to_values[rv] for rv in model.free_RVs]
        if _twice_differentiable(prior, values):
            return prior
        # a zero term quadratic in every value: a prior constant in one (``pm.Flat``) or
        # linear in it (``pm.HalfFlat``'s log-Jacobian) gives PyTensor's ``grad`` no path
        # from it or from its gradient, and ``grad`` refuses such an input (only then: the
        # term would change the compiled graphs' round-off elsewhere)
        return prior + pt.sum([0.0 * pt.sum(value**2) for value in values])

    def _unravel(self, theta: pt.TensorVariable) -> dict[Variable, pt.TensorVariable]:
        """Map each sampled value variable to its slice of the flat ``theta``, and each held
        one to its slice of the shared ``held_values``."""
        replacements = slices(theta, self.value_vars, self.var_shapes)
        replacements.update(slices(self.held_values, self.held_vars, self.held_shapes))
        return replacements

    def _per_row_logp(
        self,
        rv: Variable,
        value: Variable,
        data_to_rows: dict[Variable, Variable],
        free_rvs_to_values: dict[Variable, Variable],
    ) -> pt.TensorVariable:
        """Rebuild ``rv`` on minibatch inputs and return its per-row log-likelihood (n,)."""
        name = rv.name
        if isinstance(rv.owner.op, MinibatchRandomVariable):  # total_size wrapper: we rescale
            rv = rv.owner.inputs[0]
        ndim_supp = getattr(rv.owner.op, "ndim_supp", 0)
        if rv.ndim - ndim_supp < 1:
            raise ModelNotSupportedError(
                f"Observed variable {name!r} has its row axis inside one multivariate "
                f"draw ({type(rv.owner.op).__name__} over all rows), so its likelihood does not "
                "factor over rows. Subsampling needs independent rows given the parameters."
            )
        value_rows = data_to_rows[value]
        batch_shape = [value_rows.shape[i] for i in range(rv.ndim - ndim_supp)]
        try:
            resized = change_dist_size(rv, new_size=batch_shape, expand=False)
        except NotImplementedError as exc:
            raise ModelNotSupportedError(
                f"Observed variable {name!r} ({type(rv.owner.op).__name__}) cannot be "
                f"resized to a minibatch: {exc}"
            ) from exc
        [resized] = replace_rvs_by_values(
            [resized],
            rvs_to_values=free_rvs_to_values,
            rvs_to_transforms=self.model.rvs_to_transforms,
        )
        # rebuild_strict=False re-infers every type, so no static row count survives
        replacements = {
            out: data_to_rows.get(full, full)
            for out, full in minibatch_replacements(resized).items()
        }
        replacements.update(data_to_rows)
        resized = clone_replace(resized, replacements, rebuild_strict=False)
        elementwise = pm.logp(resized, value_rows, warn_rvs=False)
        if elementwise.ndim > 1:
            elementwise = elementwise.sum(axis=tuple(range(1, elementwise.ndim)))
        return elementwise

    # ------------------------------------------------------------------ other coordinates
    #: the map from the sampler's coordinates to the model's (None: the model's own)
    reparam = None

    def reparameterised(self, reparam) -> ModelGraph:
        """The same model in the coordinates ``phi`` of ``reparam`` (an object with
        ``symbolic_effects``, ``symbolic_log_jacobian`` and ``from_model``, e.g.
        :class:`~pymc_bigdata.model.reparam.LocScaleReparams`): each value variable is its
        slice of ``phi`` but the effects, which are their values at ``phi``; the log prior
        gets ``log |det dtheta/dphi|``, so that the density of ``phi`` is the model's. The
        rows, value variables and labels are shared."""
        if self.held_vars:
            raise ValueError("Held variables and other coordinates are not supported together.")
        new = copy.copy(self)
        phi = pt.vector("phi", dtype="float64")
        value_of = self._unravel(phi)
        effects = reparam.symbolic_effects(phi)
        for var in self.value_vars:
            if var.name in effects:
                value_of[var] = effects[var.name].astype(var.dtype)
        row_logp, prior = self._value_graphs
        new.theta, new.reparam = phi, reparam
        new.row_logp_graph = graph_replace(row_logp, value_of, strict=False)
        prior = graph_replace(prior, value_of, strict=False)
        new.prior_graph = prior + reparam.symbolic_log_jacobian(phi)
        return new

    def to_model(self, theta: np.ndarray) -> np.ndarray:
        """A vector of these coordinates in the model's own (itself without :attr:`reparam`)."""
        return theta if self.reparam is None else self.reparam.to_model(theta)

    def from_model(self, theta: np.ndarray) -> np.ndarray:
        """A vector of the model's own coordinates in these."""
        return theta if self.reparam is None else self.reparam.from_model(theta)

    @property
    def initial_theta(self) -> np.ndarray:
        """The model's initial point, raveled (in :attr:`reparam`'s coordinates if any)."""
        if self.reparam is None:
            return self._initial_theta
        return self.reparam.from_model(self._initial_theta)

    # ------------------------------------------------------------------ labels
    def coordinate_label(self, index: int) -> str:
        """``name[i, j]`` of the raveled parameter vector's ``index``-th coordinate."""
        for var, shape, size in zip(self.value_vars, self.var_shapes, self.var_sizes):
            if index < size:
                if not shape:
                    return var.name
                return f"{var.name}[{', '.join(map(str, np.unravel_index(index, shape)))}]"
            index -= size
        raise IndexError(f"coordinate {index} beyond the {self.dim} parameters")

    def value_var_slices(self) -> list[tuple[str, slice, tuple[int, ...]]]:
        """``(name, slice of the raveled vector, shape)`` of every value variable."""
        out, start = [], 0
        for var, shape, size in zip(self.value_vars, self.var_shapes, self.var_sizes):
            out.append((var.name, slice(start, start + size), tuple(shape)))
            start += size
        return out

    # ------------------------------------------------------------------ held variables
    def held_from_point(self, point: dict[str, np.ndarray]) -> np.ndarray:
        """The held variables' values in ``point``, raveled as :attr:`held_values`."""
        return flat(point, self.held_vars)

    def hold(self, values: np.ndarray) -> bool:
        """Set the held variables (raveled); returns whether they changed."""
        values = np.asarray(values, dtype=np.float64)
        current = self.held_values.get_value(borrow=True)
        if values.shape != current.shape:
            raise ValueError(
                f"held values have shape {values.shape}, the layer holds {current.shape}"
            )
        if np.array_equal(values, current):
            return False
        self.held_values.set_value(values.copy())
        return True

    @property
    def held_key(self) -> bytes:
        """A key of the held variables' current values (the MAP and anchors depend on them)."""
        return self.held_values.get_value(borrow=True).tobytes()

    # ------------------------------------------------------------------ staleness
    def data_is_current(self) -> bool:
        """False when ``pm.set_data`` (or ``set_value``) replaced a row array since the
        graph read it: the rows, N and anchors would then be stale."""
        for var, array in self._data_snapshot:
            current = data_value(var)
            if current is array:
                continue  # the usual case: same buffer, nothing to compare
            if current.shape != array.shape or current.dtype != array.dtype:
                return False
            if not np.array_equal(current, array, equal_nan=True):  # e.g. after unpickling
                return False
        return True


def flat(point: dict[str, np.ndarray], value_vars: list[Variable]) -> np.ndarray:
    """The values of ``value_vars`` in ``point``, raveled into one float64 vector."""
    if not value_vars:
        return np.zeros(0)
    return np.concatenate([np.ravel(point[v.name]) for v in value_vars]).astype(np.float64)


def slices(
    flat: Variable, value_vars: list[Variable], shapes: list[tuple[int, ...]]
) -> dict[Variable, pt.TensorVariable]:
    """Each value variable as its slice of the flat vector ``flat``, in its own dtype."""
    out, start = {}, 0
    for var, shape in zip(value_vars, shapes):
        size = int(np.prod(shape))
        piece = flat[start : start + size].reshape(shape).astype(var.dtype)
        out[var] = var.type.filter_variable(piece, allow_convert=True)
        start += size
    return out


def _twice_differentiable(graph: pt.TensorVariable, values: list[Variable]) -> bool:
    """Whether PyTensor's ``grad`` reaches every value from ``graph`` and each value from
    its own gradient (what the prior's gradient and Hessian graphs need)."""
    try:
        for gradient, value in zip(pytensor.grad(graph, values), values, strict=True):
            pytensor.grad(pt.sum(gradient), value)
    except DisconnectedInputError:
        return False
    return True
